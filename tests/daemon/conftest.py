"""Daemon fixtures: an AMD-looking host in temp dirs, a NOTIFY_SOCKET, and a thread-leak check."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "aiter"))  # aiter_support

from aiter_support import rules, so_builder  # noqa: F401 - session fixtures (gcc builds)

from helpers import devnodes
from helpers.daemon_host import Host
from helpers.notify_socket import NotifySocket


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    """Fails the test when it leaves a thread running (given 5 s to wind down)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    leaked: list[threading.Thread] = []
    while time.monotonic() < deadline:
        leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not leaked:
            break
        time.sleep(0.05)
    assert [] == [t.name for t in leaked]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    if os.geteuid() != 0:
        pytest.skip("needs root: mknod and the probe's credential switch")
    with devnodes.dev_tree() as dev:
        yield Host(tmp_path, dev)


@pytest.fixture
def notify_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    with NotifySocket() as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", str(sock.path))
        yield sock
