"""The aiter check can be stalled by a tree's owner; the slot work must not be.

The owner's child runs with the owner's uid, so the owner may ``SIGSTOP`` it: each exchange then
waits out ``child_timeout`` before the child is killed. An unprivileged owner does exactly that
to every child the daemon starts for their tree, with the timeout set long (60 s). The daemon
must say READY=1, keep pinging the watchdog and relabel a slot while the aiter check is stuck;
status says "aiter: not checked yet" until a verdict comes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.daemon import status
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers import devnodes
from helpers.attacker import Attacker, Tally
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until
from helpers.notify_socket import NotifySocket

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "aiter"))
import tablegen  # tests/aiter is not on the path from this folder

# As the owner: stop the daemon's first child for our tree the moment it runs as us, and keep
# it stopped until it is gone.
_STOPPER = r"""
import os, signal, sys, time
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([]); os.setgid(gid); os.setuid(uid)
print("ready", flush=True)
stopped = set()
while True:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in stopped or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                real = next(int(line.split()[1]) for line in fh if line.startswith(b"Uid:"))
            if real != uid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except (OSError, StopIteration, ValueError):
            continue
        if b"hal0_reconciler.aiter.trees.child" in cmd:
            print(f"stopped {pid}", flush=True)
            while True:  # keep it stopped until it is gone
                try:
                    with open(f"/proc/{pid}/stat", "rb") as fh:
                        state = fh.read().rsplit(b")", 1)[1].split()[0]
                    if state != b"T":
                        os.kill(int(pid), signal.SIGSTOP)
                except (OSError, IndexError):
                    sys.exit(0)
                time.sleep(0.0005)
    time.sleep(0.0005)
"""


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    with devnodes.dev_tree() as dev:
        yield Host(tmp_path, dev)


@pytest.fixture
def notify_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    with NotifySocket() as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", str(sock.path))
        yield sock


@pytest.fixture
def attackers_tree(attacker: Attacker) -> Iterator[tuple[Path, Path]]:
    """(package, JIT folder): root's tables, the attacker's JIT folder with a module in it."""
    base = Path(tempfile.mkdtemp(prefix="hal0-sec-stall-", dir="/tmp"))
    base.chmod(0o755)
    package = base / "site-packages" / "aiter"
    shutil.copytree(tablegen.WRITTEN_CONFIGS, package / "configs")
    jit = base / "jit"
    jit.mkdir()
    (jit / "module_gemm_a8w8_blockscale_bpreshuffle.so").write_bytes(b"\x7fELF\0" * 1000)
    attacker.chown(jit, *jit.iterdir())
    try:
        yield package, jit
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _processes_of(uid: int) -> set[int]:
    """Every process whose real uid is ``uid`` (what is left of the attack at the end)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, StopIteration, ValueError):
            lines = (entry / "status").read_bytes().splitlines()
            if int(next(ln for ln in lines if ln.startswith(b"Uid:")).split()[1]) == uid:
                found.add(int(entry.name))
    return found


def _aiter_status(settings: Settings) -> dict[str, object]:
    try:
        snapshot = json.loads(status.status_path(settings).read_text())
    except (OSError, ValueError):
        return {}
    return dict(snapshot.get("aiter") or {})


def test_a_stopped_owners_child_delays_neither_ready_nor_the_watchdog_nor_a_relabel(  # noqa: PLR0917
    host: Host,
    notify_socket: NotifySocket,
    attacker: Attacker,
    attackers_tree: tuple[Path, Path],
    attacks: Tally,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attacks.tried("aiter check stalled by the tree's owner")
    package, jit = attackers_tree
    monkeypatch.setenv("WATCHDOG_USEC", "500000")
    tree = AiterTree(package_dir=package, jit_dir=jit, target="gfx950:256")
    settings = dataclasses.replace(
        host.settings(),
        aiter=AiterSettings(trees=(tree,), child_timeout=60.0, settle_window=0.3),
    )
    stopper = subprocess.Popen(
        [sys.executable, "-c", _STOPPER, str(attacker.uid), str(attacker.gid)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert stopper.stdout is not None
    assert "ready" == stopper.stdout.readline().strip()
    child = 0
    try:
        with running(settings):
            line = stopper.stdout.readline().strip()  # the first child, stopped as it starts
            assert line.startswith("stopped "), line
            child = int(line.split()[1])
            notify_socket.wait_for("READY=1", timeout=20)  # the child's timeout is 60 s
            assert 0 == _aiter_status(settings).get("checks")
            assert {"state": "not checked yet"}.items() <= _aiter_status(settings).items()
            pings = notify_socket.messages().count("WATCHDOG=1")
            notify_socket.wait_for("WATCHDOG=1", count=pings + 3, timeout=20)
            slot = drop_slot(host.slots, "stalled", "gpu-vulkan")
            wait_until(lambda: device_of(slot) == "gpu-rocm", timeout=20, what="the relabel")
            assert 0 == _aiter_status(settings).get("checks")
            os.kill(child, signal.SIGKILL)  # the check ends now (a dead child, said)
            wait_until(
                lambda: _aiter_status(settings).get("checks", 0) >= 1,
                timeout=30,
                what="the check after the child died",
            )
    finally:
        os.killpg(stopper.pid, signal.SIGKILL)
        stopper.wait(timeout=10)
        for pid in _processes_of(attacker.uid) | ({child} if child else set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    attacks.held("aiter check stalled by the tree's owner")
