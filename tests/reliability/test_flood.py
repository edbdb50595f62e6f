"""Event floods beyond the inotify queue: the daemon's own inotify instances get a tiny kernel
queue (``fs.inotify.max_queued_events`` is read when an instance is created: shrunk just for
the daemon's start, restored as soon as its watches are in place), then 20,000 events arrive.
Every slot converges, the overflow is logged, the daemon stays healthy, and its memory is
measured before, at the peak and after the flood settled."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from helpers import inotify_queue
from helpers.daemon_host import Host
from helpers.notify_socket import NotifySocket
from reliability import support

MAX_QUEUED = inotify_queue.MAX_QUEUED


def _writable() -> bool:
    try:
        MAX_QUEUED.write_text(MAX_QUEUED.read_text())
    except OSError:
        return False
    return True


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _status(host: Host) -> dict[str, object]:
    try:
        return json.loads((host.root / "run/hal0-reconciler/status.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.skipif(not _writable(), reason="needs root and a writable max_queued_events")
@pytest.mark.timeout(400)
def test_a_flood_beyond_the_inotify_queue(host: Host) -> None:
    slots = support.scaled(2_000, 20_000)  # slot files created in the flood (each relabelled)
    events = 20_000
    original = inotify_queue.size_to_restore()
    with NotifySocket() as sock:
        MAX_QUEUED.write_text("64\n")
        child = support.start_daemon(host, sock.path)
        try:
            try:
                sock.wait_for("READY=1", timeout=30)  # its watches (and tiny queues) are there
            finally:
                MAX_QUEUED.write_text(original)
            process = psutil.Process(child.pid)
            time.sleep(1)
            before = process.memory_info().rss / 2**20
            old = support.write_vulkan_slots(host.slots, slots, prefix="flood")
            noise = host.slots / ".noise.tmp"
            for n in range(max(0, (events - slots * 3) // 2)):  # create+modify+close per slot
                noise.write_bytes(b"%d" % n)
            try:
                support.wait_for(
                    lambda: all(p.read_bytes() == support.relabelled(d) for p, d in old.items()),
                    timeout=support.scaled(60, 600),
                    what="every slot relabelled",
                )
            except AssertionError:
                print(support.daemon_log(host).read_text()[-5000:])
                raise
            support.wait_for(
                lambda: (
                    _status(host).get("last_pass") is not None
                    and len(_status(host).get("slots") or {}) == slots
                ),
                timeout=60,
                what="the status to list every slot",
            )
            peak = _peak_mb(child.pid)
            for path in old:
                path.unlink()
            support.wait_for(lambda: not _status(host).get("slots"), timeout=60, what="forgotten")
            time.sleep(3)
            settled = process.memory_info().rss / 2**20
            status = _status(host)
            child.terminate()
            assert 0 == child.wait(10)
        finally:
            support.kill_tree(child)
        logs = support.daemon_events(host)
    overflow = [e for e in logs if "overflow" in json.dumps(e)]
    support.NOTES[f"RSS around a flood of {events} events ({slots} new slots)"] = (
        f"before {before:.0f} MB, peak {peak:.0f} MB, settled {settled:.0f} MB"
    )
    support.FIGURES["crashes"] += sum(support.tracebacks(json.dumps(e)) for e in logs)
    assert overflow, "the overflow was not logged"
    assert (True, []) == (status.get("healthy"), status.get("problems"))
    assert [] == [e["event"] for e in logs if e.get("level") in ("error", "critical")]
    assert settled < before + 40, "memory did not come back after the flood"
