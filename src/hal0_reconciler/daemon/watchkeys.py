"""Which work a watchdog event means: the slot it names, "everything", "re-probe the host" or
"re-plan aiter", per watched folder (see ``watch`` for what is watched and why). Runs on the
observer thread; decides only, and flags what the main loop repairs (a watched folder that
came or went, a hal0 lead name that appeared)."""

from __future__ import annotations

import fnmatch
import os
import threading
from collections.abc import Callable
from pathlib import Path

from watchdog.events import FileSystemEvent

from hal0_reconciler.daemon.workqueue import Special, WorkKey
from hal0_reconciler.model import SlotKey

# Event types that carry no change: reading a file (and the probe's own open/close of the nodes).
_NO_CHANGE = frozenset({"opened", "closed_no_write"})
_NO_CHANGE_DEV = _NO_CHANGE | {"closed"}
# Event types that say the file is whole: renamed into place (IN_MOVED_TO, and the name it left),
# closed after writing (IN_CLOSE_WRITE). It is judged at once, without a settle window.
_COMPLETE = frozenset({"moved", "closed"})


def complete(event: FileSystemEvent) -> bool:
    """The event says its file is whole now (a rename onto it, a close after writing); a
    modify without a close, a create, a change of mode may be followed by more writes."""
    return event.event_type in _COMPLETE and not event.is_directory


def _paths(event: FileSystemEvent) -> list[str]:
    paths = [os.fsdecode(event.src_path)]
    dest = getattr(event, "dest_path", "")
    if dest:
        paths.append(os.fsdecode(dest))
    return paths


class EventKeys:
    """One mapper per watched folder (``slot_keys``, ``slots_parent_keys``, ``dev_keys``,
    ``dri_keys``, ``hal0_keys``, ``aiter_keys``): event in, work keys out."""

    def __init__(
        self,
        *,
        slots_dir: Path,
        dev_dir: Path | None,
        kfd_name: str,
        dri_dir: Path | None,
        is_slot_name: Callable[[str], bool],
    ) -> None:
        self._slots_dir = slots_dir
        self._slots_folder = str(slots_dir)  # as watchdog joins the names of its events to it
        self._dev_dir = dev_dir
        self._kfd_name = kfd_name
        self._dri_dir = dri_dir
        self._is_slot_name = is_slot_name
        self.folder_changed = threading.Event()  # a watched folder came or went: re-watch it
        self.hal0_names: dict[Path, frozenset[str]] = {}
        self.hal0_leads: dict[Path, frozenset[str]] = {}  # ancestor -> the names toward a fact
        self.hal0_moved = threading.Event()  # a lead name appeared: move the watches down
        self.aiter_watched = False  # aiter folders are watched: a slot change re-plans aiter

    def slot_keys(self, event: FileSystemEvent) -> list[WorkKey]:
        if event.event_type in _NO_CHANGE:
            return []
        keys = self._slot_change_keys(event)
        if keys and self.aiter_watched:
            keys.append(Special.AITER)
        return keys

    def _slot_change_keys(self, event: FileSystemEvent) -> list[WorkKey]:
        """Plain string work, no Path per event: a burst of new files is ~4 events per file,
        and the daemon's own writes as many again (their temp file created, written, closed,
        renamed), all on this thread. The temp file's own events are dropped here (never a
        slot name); its rename onto a slot file is that slot's event, by its destination."""
        keys: list[WorkKey] = []
        folder = self._slots_folder
        for raw in _paths(event):
            if raw == folder:
                if event.event_type in {"deleted", "moved"}:
                    keys.append(Special.EVERYTHING)  # the folder itself went or moved
                continue
            parent, _, name = raw.rpartition("/")
            if parent == folder and not event.is_directory and self._is_slot_name(name):
                keys.append(SlotKey(raw))
        return keys

    def slots_parent_keys(self, event: FileSystemEvent) -> list[WorkKey]:
        if self.hal0_keys(event):
            return [Special.EVERYTHING]  # hal0.toml, api.env or the manifest beside the slots
        if event.event_type in _NO_CHANGE or event.event_type in {"modified", "closed"}:
            return []
        if not any(Path(p) == self._slots_dir for p in _paths(event)):
            return []
        self.folder_changed.set()  # re-watch it even if the new folder reuses the inode
        return [Special.EVERYTHING]

    def dev_keys(self, event: FileSystemEvent) -> list[WorkKey]:
        if event.event_type in _NO_CHANGE_DEV:
            return []
        names = {self._kfd_name} | ({self._dri_dir.name} if self._dri_dir is not None else set())
        for raw in _paths(event):
            path = Path(raw)
            if path.parent == self._dev_dir and path.name in names:
                if event.is_directory:
                    self.folder_changed.set()
                return [Special.HOST_FACTS]
        return []

    def dri_keys(self, event: FileSystemEvent) -> list[WorkKey]:
        if event.event_type in _NO_CHANGE_DEV:
            return []
        # Only nodes in the folder: watchdog also reports the folder itself as modified after
        # a close-write inside it (the probe's own open/close would loop forever).
        if any(Path(p).parent == self._dri_dir for p in _paths(event)):
            return [Special.HOST_FACTS]
        return []

    def hal0_keys(self, event: FileSystemEvent) -> list[WorkKey]:
        if event.event_type in _NO_CHANGE:
            return []  # the reconciler's own reads of hal0's files
        for raw in _paths(event):
            path = Path(raw)
            if path.name in self.hal0_names.get(path.parent, ()):
                return [Special.EVERYTHING]
            leads = self.hal0_leads.get(path.parent, ())
            if any(fnmatch.fnmatchcase(path.name, lead) for lead in leads):
                self.hal0_moved.set()  # the main loop moves the watch down, then a full pass
                return [Special.EVERYTHING]
        return []

    def aiter_keys(self, event: FileSystemEvent) -> list[WorkKey]:
        if event.event_type in _NO_CHANGE:
            return []  # the check's own reads of tables and modules
        return [Special.AITER]
