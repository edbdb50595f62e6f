"""Reading watched files is no work, on a watchdog that delivers the read events (Debian 12's
2.2 cannot leave them out of the inotify mask): through real inotify, in order."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hal0_reconciler.daemon.workqueue import WorkKey
from hal0_reconciler.model import SlotKey
from helpers.daemon_host import wait_until
from helpers.watch_tree import UnfilteredObserver, make_tree, watcher_on


def test_reading_slot_files_is_no_work_and_keeps_the_watches(tmp_path: Path) -> None:
    """hal0 and operators read slot files all day: each read (opened, closed without writing)
    enqueues nothing and leaves the observer alive (a handler that raised would kill it, and
    every later change would wait for the next resync)."""
    tree = make_tree(tmp_path)
    seen: list[WorkKey] = []

    def add(keys: Iterable[WorkKey]) -> None:
        seen.extend(keys)

    slot = tree / "etc/slots/agent.toml"
    slot.write_text("name = 'agent'\n")
    marker = tree / "etc/slots/marker.toml"
    with watcher_on(tree, enqueue=add, observer_factory=UnfilteredObserver) as watcher:
        for _ in range(3):
            slot.read_bytes()
            os.close(os.open(slot, os.O_RDONLY))
        marker.write_text("x = 1\n")  # events come in order: once it is seen, so were the reads
        wait_until(
            lambda: SlotKey(str(marker)) in seen or watcher.health().mode != "inotify",
            what="the change after the reads",
        )
        assert [] == watcher.check(), "reading slot files killed the observer"
        assert {SlotKey(str(marker))} == set(seen), f"reading a slot file was work: {seen}"
