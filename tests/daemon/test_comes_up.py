"""The daemon always comes up, and its health is honest from the start: READY=1 after the
first full pass even with poisoned files or a failed pass; never "healthy" while starting or
while its last pass failed (slots that cannot be written: tests/reliability/test_disk_faults)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hal0_reconciler.daemon import status
from hal0_reconciler.model import HostFacts
from hal0_reconciler.settings import Settings
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until

CORPUS = Path(__file__).resolve().parents[1] / "reliability" / "corpus"


def _snapshot(settings: Settings) -> dict[str, object]:
    def read() -> dict[str, object] | None:
        try:
            return json.loads(status.status_path(settings).read_text())
        except (OSError, ValueError):
            return None

    return wait_until(read, what="status.json")


def test_ready_with_poisoned_files_which_are_problems_in_the_status(
    host: Host, notify_socket
) -> None:
    for path in CORPUS.glob("*.toml"):
        shutil.copy(path, host.slots / path.name)
    good = drop_slot(host.slots, "good")
    settings = host.settings()
    with running(settings):
        notify_socket.wait_for("READY=1", timeout=30)
        assert "gpu-rocm" == device_of(good)
        snapshot = wait_until(
            lambda: (s := _snapshot(settings)) and s.get("ready") and s, what="ready status"
        )
    slots = snapshot["slots"]
    assert isinstance(slots, dict)
    unreadable = {n for n, s in slots.items() if s["status"] == "unreadable"}
    assert {p.name for p in CORPUS.glob("*.toml")} == unreadable
    # READY all the same; degraded (not unhealthy: the watchdog goes on), each file named
    assert (False, "degraded") == (snapshot["healthy"], snapshot["health"])
    named = [p for p in snapshot["problems"] if p.startswith("slot file ")]
    assert named
    assert all(" cannot be judged" in p for p in named)


def test_ready_even_when_the_first_pass_fails_but_never_healthy(host: Host, notify_socket) -> None:
    def broken_gather(_settings: Settings) -> HostFacts:
        raise RuntimeError("the host facts cannot be read")

    settings = host.settings()
    with running(settings, gather=broken_gather):
        notify_socket.wait_for("READY=1", timeout=30)
        snapshot = wait_until(
            lambda: (s := _snapshot(settings)) and s.get("problems") and s, what="a problem"
        )
        text, code = status.report(settings)
    assert False is snapshot["healthy"]
    assert any("the last pass failed" in p for p in snapshot["problems"])  # type: ignore[union-attr]
    assert (status.EXIT_UNHEALTHY, True) == (code, "unhealthy" in text)
    assert not [m for m in notify_socket.messages() if m == "WATCHDOG=1"]


@pytest.mark.parametrize("healthy", [True, False])
def test_starting_is_never_reported_healthy(tmp_path: Path, healthy: bool) -> None:
    settings = Settings(runtime_dir=tmp_path)
    status.write_status(
        settings,
        {
            "pid": os.getpid(),
            "pid_start": status.process_start_time(os.getpid()),
            "updated_at": 1000.0,
            "heartbeat": 30.0,
            "ready": False,
            "healthy": healthy,  # an older writer could say so: the report does not believe it
        },
    )
    text, code = status.report(settings, now=1001.0)
    assert (status.EXIT_UNHEALTHY, True) == (code, "starting" in text and "not healthy" in text)
