"""Temp files of this package's own writes that a crash left in the slots folder: removed
only under hal0's slot lock, which every writer of ours holds for the whole life of its temp
file, so no other instance's write in flight is ever removed (and never one of hal0's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal0_reconciler import fsio
from hal0_reconciler._log import get_logger
from hal0_reconciler.errors import LockTimeout
from hal0_reconciler.slots import store

if TYPE_CHECKING:
    from hal0_reconciler.settings import Settings

_log = get_logger("hal0_reconciler.reconcile")


class LeftoverTemps:
    """Looked for once at the first pass that writes, and after a failed write."""

    def __init__(self) -> None:
        self._checked = False

    def remove_at_start(self, settings: Settings) -> None:
        """The first time only; when hal0's lock is busy, nothing waits for it: the next write
        that fails, or the next start, removes them."""
        if not self._checked:
            self._checked = True
            remove(settings, wait=False)


def remove(settings: Settings, *, wait: bool) -> None:
    """Remove this package's own temp files from the slots folder (never hal0's).

    ``wait=True``: the caller holds hal0's lock already; ``wait=False``: take it if it is free
    at once, else leave them.
    """
    folder = settings.slots_dir
    if not fsio.has_own_temps(folder):
        return
    if wait:
        removed = fsio.remove_stale_temps(folder)
    else:
        try:
            with store.slot_write_lock(settings.effective_lock_file, timeout=0, group_of=folder):
                removed = fsio.remove_stale_temps(folder)
        except (LockTimeout, OSError):
            return
    if removed:
        _log.info("slot.temp_files_removed", count=len(removed), folder=str(folder))
