"""Lost updates: a hal0-style writer (flock on hal0's lock file, read, change another key,
atomic replace) races the daemon while the ROCm lane flaps (the daemon demotes to cpu and
restores to gpu-rocm under the same lock). Every write of the writer must survive."""

from __future__ import annotations

import fcntl
import os
import random
import re
import threading
import time
from pathlib import Path

from helpers.daemon_host import Host, slot_text
from helpers.notify_socket import NotifySocket
from reliability import support

SLOTS = 4


def _hal0_write(slot: Path, lock: Path, *, revulkan: bool) -> None:
    """What hal0 does to change a slot: under its lock, read, edit, temp file, rename. Counts
    up ``counter``; with ``revulkan`` the operator also picks gpu-vulkan again (so the daemon
    keeps relabelling: to gpu-rocm, or to cpu while the lane is down, and back)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = slot.read_text()
        count = int(re.search(r"^counter = (\d+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
        text = re.sub(r"^counter = \d+$", f"counter = {count + 1}", text, flags=re.MULTILINE)
        if revulkan:
            text = re.sub(r'^device = ".*"$', 'device = "gpu-vulkan"', text, flags=re.MULTILINE)
        tmp = slot.with_name(f".{slot.name}.{os.getpid()}{random.randrange(10**6)}.tmp")
        tmp.write_text(text)
        tmp.rename(slot)
    finally:
        os.close(fd)


def test_a_hal0_writer_racing_the_daemon_while_the_lane_flaps(host: Host) -> None:
    writes = support.scaled(300, 5000)
    rng = random.Random(11)
    slots = []
    for n in range(SLOTS):
        path = host.slots / f"counted-{n}.toml"
        path.write_text(slot_text(f"counted-{n}") + "counter = 0\n")
        slots.append(path)
    lock = host.slots.parent / "slots.lock"
    stop = threading.Event()

    def flap() -> None:
        usable = True
        while not stop.wait(rng.uniform(0.2, 0.5)):
            usable = not usable
            host.lane(usable=usable)
        host.lane(usable=True)

    with NotifySocket() as sock:
        child = support.start_daemon(
            host, sock.path, settle_window="0.01", demote_grace="0", fight_limit="1000"
        )
        flapper = threading.Thread(target=flap, name="test-lane-flapper")
        try:
            sock.wait_for("READY=1", timeout=30)
            flapper.start()
            done = [0] * SLOTS
            for n in range(writes):
                which = n % SLOTS
                _hal0_write(slots[which], lock, revulkan=rng.random() < 0.2)
                done[which] += 1
                time.sleep(rng.uniform(0, 0.04))
            stop.set()
            flapper.join(10)
            support.wait_for(
                lambda: all(b'"gpu-rocm"' in p.read_bytes() for p in slots),
                timeout=30,
                what="every slot back on gpu-rocm once the lane stays usable",
            )
            child.terminate()
            assert 0 == child.wait(10)
        finally:
            stop.set()
            support.kill_tree(child)
        events = support.daemon_events(host)
    counters = [
        int(re.search(r"^counter = (\d+)$", p.read_text(), re.MULTILINE).group(1)) for p in slots
    ]  # type: ignore[union-attr]
    lost = sum(done) - sum(counters)
    support.FIGURES["lost"] += lost
    relabels = sum(e.get("event", "").startswith("slot.") and "old" in e for e in events)
    demotions = sum(e.get("event") == "slot.demoted_to_cpu" for e in events)
    support.NOTES["lost-update race: writes, daemon relabels (to cpu)"] = (
        f"{sum(done)}, {relabels} ({demotions})"
    )
    assert (done, 0) == (counters, lost)
    assert relabels > SLOTS, "the daemon did not race the writer"
    assert demotions > 0, "the lane did not flap enough for a demotion"
