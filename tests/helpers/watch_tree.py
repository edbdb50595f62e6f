"""A small host tree for Watcher tests: a slots folder and a /dev with dri, and a Watcher on it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from watchdog.observers import Observer

from hal0_reconciler.daemon.watch import Watcher
from hal0_reconciler.daemon.workqueue import WorkKey
from hal0_reconciler.slots import store


def make_tree(root: Path) -> Path:
    (root / "etc/slots").mkdir(parents=True)
    (root / "dev/dri").mkdir(parents=True)
    return root


def watcher_on(
    tree: Path,
    *,
    enqueue: Callable[[Iterable[WorkKey]], None],
    wake: Callable[[], None] = lambda: None,
    **kwargs: Any,
) -> Watcher:
    """A Watcher on ``tree``'s slots folder, /dev and /dev/dri (not started)."""
    return Watcher(
        slots_dir=tree / "etc/slots",
        dev_dir=tree / "dev",
        kfd_name="kfd",
        dri_dir=tree / "dev/dri",
        is_slot_name=store.is_slot_file_name,
        enqueue=enqueue,
        wake=wake,
        **kwargs,
    )


class UnfilteredObserver(Observer):  # type: ignore[misc, valid-type]
    """The real observer without ``event_filter`` (like watchdog before 5.0, Debian 12's 2.2):
    every opened and closed-without-writing event reaches the handlers."""

    def schedule(self, event_handler: Any, path: str, *, recursive: bool = False) -> Any:
        return super().schedule(event_handler, path, recursive=recursive)
