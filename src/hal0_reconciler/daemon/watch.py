"""Filesystem watches: watchdog events become work keys. Handlers only enqueue.

Watched, all non-recursive:
- the slots directory: a slot file created, modified, closed after writing, deleted, moved out,
  or moved *onto* (the temp-file-and-rename save) is a change of that slot;
- its parent: the slots directory itself deleted, created or moved means "everything";
- the folder of the kfd node (``/dev``) and the DRI folder: nodes appearing, going, or changing
  mode/owner mean "re-probe the host";
- the folders of hal0's own fact files (its VERSION and release link, ``schema.py``, the runner
  table, hal0.toml, api.env, the manifests): a change of one of those files means "everything"
  (a hal0 update can change the verdict on slot files that did not change). A fact file whose
  folder does not exist yet (hal0 not installed) is watched at its nearest existing ancestor,
  for the one name that leads to it only (``/usr/lib`` for ``hal0``, never every package
  install there); when that name appears the watch moves down and a full pass follows;
- the aiter folders (each tree's ``configs/``, ``configs/model_configs/`` and JIT folder; never
  ``build/``): any change there means "re-plan aiter". While aiter trees are configured, a slot
  file change also does (its ``[server].env`` may choose other tables or another JIT folder).

Events can be lost; the main loop calls :meth:`Watcher.check`, which says when a full pass is
needed: the inotify queue overflowed (watchdog only logs it, on ``watchdog.observers.inotify_c``),
the observer thread died (an exception in a handler kills it silently), or a watched folder was
re-created. A watch that cannot be added (``ENOSPC``/``EMFILE``...) is said once, and the daemon
falls back to polling at the resync interval, retrying the watch each time.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from hal0_reconciler import _log, lifecycle, threadname
from hal0_reconciler.daemon import _watchdog_compat, watchkeys
from hal0_reconciler.daemon.workqueue import Special, WorkKey

log = _log.get_logger("hal0_reconciler.daemon.watch")

_OVERFLOW_LOGGERS = ("watchdog.observers.inotify_c", "watchdog.observers.inotify")


class Trigger(enum.StrEnum):
    """Why the watcher asks for a full pass."""

    OVERFLOW = "inotify-overflow"
    OBSERVER_DIED = "observer-died"
    REWATCHED = "watch-re-established"


class ObserverLike(Protocol):
    """What the watcher needs from a watchdog observer (tests inject failing ones)."""

    def schedule(
        self, event_handler: FileSystemEventHandler, path: str, *, recursive: bool = ...
    ) -> Any: ...
    def unschedule(self, watch: Any) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def join(self, timeout: float | None = ...) -> None: ...
    def is_alive(self) -> bool: ...


ObserverFactory = Callable[[], ObserverLike]
"""Builds a fresh observer (the real one is ``watchdog.observers.Observer``)."""


class _Handler(FileSystemEventHandler):
    """Maps each event to keys with ``mapper`` and enqueues them (``enqueue_complete``: the
    keys of an event that says its file is whole). Nothing else."""

    def __init__(
        self,
        mapper: Callable[[FileSystemEvent], Iterable[WorkKey]],
        enqueue: Callable[[Iterable[WorkKey]], None],
        enqueue_complete: Callable[[Iterable[WorkKey]], None] | None = None,
    ) -> None:
        super().__init__()
        self._mapper = mapper
        self._enqueue = enqueue
        self._enqueue_complete = enqueue_complete

    on_failure: Callable[[], None] | None = None  # set by the watcher: a handler raised

    def dispatch(self, event: FileSystemEvent) -> None:
        """watchdog's call for each event; an exception here ends its observer thread, so the
        main loop is told at once (it restarts the observer: no periodic look is needed)."""
        try:
            super().dispatch(event)
        except BaseException:
            if self.on_failure is not None:
                self.on_failure()
            raise

    def on_any_event(self, event: FileSystemEvent) -> None:
        keys = list(self._mapper(event))
        if not keys:
            return
        if self._enqueue_complete is not None and watchkeys.complete(event):
            self._enqueue_complete(keys)
        else:
            self._enqueue(keys)


class _OverflowHandler(logging.Handler):
    """Turns watchdog's overflow warning into a flag the main loop reads."""

    def __init__(self, on_overflow: Callable[[], None]) -> None:
        super().__init__(level=logging.WARNING)
        self._on_overflow = on_overflow

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            if "overflow" in record.getMessage().lower():
                self._on_overflow()


@dataclass
class _Watch:
    """One watched folder: its handler and the watch scheduled for it."""

    path: Path
    handler: _Handler
    ignored: tuple[str, ...] = ()  # watchdog event classes its handler never needs
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) when scheduled
    handle: Any = None
    failure: str | None = None


@dataclass
class WatchHealth:
    """What the watcher reports for status and health."""

    mode: str  # "inotify" or "polling"
    watched: tuple[str, ...]
    failures: dict[str, str] = field(default_factory=dict)


OBSERVER_STOP_WAIT = 2.0
"""Seconds a stop waits for watchdog's observer thread (it notices a stop within a second)."""


class Watcher(lifecycle.StartStop):
    """Owns the observer and its watches. ``check`` is called from the main loop only."""

    def __init__(
        self,
        *,
        slots_dir: Path,
        dev_dir: Path | None,
        kfd_name: str,
        dri_dir: Path | None,
        is_slot_name: Callable[[str], bool],
        enqueue: Callable[[Iterable[WorkKey]], None],
        wake: Callable[[], None],
        observer_factory: ObserverFactory = Observer,
        aiter_dirs: Iterable[Path] = (),
        enqueue_complete: Callable[[Iterable[WorkKey]], None] | None = None,
    ) -> None:
        """``enqueue_complete``: where the keys of a slot file renamed into place or closed
        after writing go (judged without a settle window); by default ``enqueue``."""
        self._slots_dir = slots_dir
        self._dev_dir = dev_dir
        self._dri_dir = dri_dir
        self._keys = watchkeys.EventKeys(
            slots_dir=slots_dir,
            dev_dir=dev_dir,
            kfd_name=kfd_name,
            dri_dir=dri_dir,
            is_slot_name=is_slot_name,
        )
        self._enqueue_raw = enqueue
        self._enqueue_complete_raw = enqueue_complete
        self._wake = wake
        self._factory = observer_factory
        self._observer: ObserverLike | None = None
        self._overflowed = threading.Event()
        self._handler_failed = threading.Event()  # a handler raised: its observer is ending
        self._overflow_handler = _OverflowHandler(self._on_overflow)
        self._stopping = False
        # watchdog's threads are named when a watch is added; some start just after, so they
        # are looked for again at each main-loop look and at the next event (on the observer
        # thread): an event has passed through every one, so the looking ends there. Counted,
        # not flagged: a watch added while an event looks is looked for again (one writer each)
        self._watches_added = 0  # main thread
        self._watches_named = 0  # observer thread: the count when every thread was running
        self._watches: list[_Watch] = [
            # watchdog adds "the folder was modified" to each file created, written or renamed
            # in it: for the slots folder that says nothing its files' own events do not
            _Watch(
                slots_dir,
                _Handler(
                    self._keys.slot_keys,
                    self._enqueue,
                    self._enqueue_complete if enqueue_complete is not None else None,
                ),
                ("DirModifiedEvent",),
            ),
            _Watch(slots_dir.parent, _Handler(self._keys.slots_parent_keys, self._enqueue)),
        ]
        if dev_dir is not None:
            self._watches.append(_Watch(dev_dir, _Handler(self._keys.dev_keys, self._enqueue)))
        if dri_dir is not None:
            self._watches.append(_Watch(dri_dir, _Handler(self._keys.dri_keys, self._enqueue)))
        self._aiter_dirs: tuple[Path, ...] = ()
        self._aiter_handler = _Handler(self._keys.aiter_keys, self._enqueue)
        self._hal0_handler = _Handler(self._keys.hal0_keys, self._enqueue)
        self.set_aiter_dirs(aiter_dirs)

    # -- events → the queue (run on the observer thread) ----------------------------------------
    def _enqueue(self, keys: Iterable[WorkKey]) -> None:
        """The worker takes the keys from the queue by itself: the main loop is woken only when
        a watch needs repair now (a watched folder came or went). Waking it for every event cost
        a pipe write per event and a main-loop round per wake-up, on the threads a burst of new
        files needs most."""
        self._name_late_threads()
        self._enqueue_raw(keys)
        if self._keys.folder_changed.is_set() or self._keys.hal0_moved.is_set():
            self._wake()

    def _enqueue_complete(self, keys: Iterable[WorkKey]) -> None:
        """The keys of a slot file that is whole (a slot event never asks for a repair)."""
        assert self._enqueue_complete_raw is not None  # noqa: S101 - only handed when given
        self._name_late_threads()
        self._enqueue_complete_raw(keys)

    def _name_late_threads(self) -> None:
        added = self._watches_added
        if added != self._watches_named and name_watchdog_threads():
            self._watches_named = added

    def _on_handler_failure(self) -> None:
        self._handler_failed.set()
        self._wake()

    def _on_overflow(self) -> None:
        self._overflowed.set()
        self._wake()

    # -- lifecycle (main thread) ------------------------------------------------------------------
    def start(self) -> None:
        for name in _OVERFLOW_LOGGERS:
            logging.getLogger(name).addHandler(self._overflow_handler)
        _watchdog_compat.report_overflows()  # watchdog 2.2 (Debian 12) would stay silent
        _watchdog_compat.prompt_moves()  # no half-second stall behind each rename
        self._observer = self._factory()
        self._observer.start()
        self._schedule_missing(retry_failures=True)

    def stop(self) -> None:
        self._stopping = True
        for name in _OVERFLOW_LOGGERS:
            logging.getLogger(name).removeHandler(self._overflow_handler)
        observer, self._observer = self._observer, None
        if observer is not None:
            with contextlib.suppress(Exception):
                observer.stop()
            observer.join(timeout=OBSERVER_STOP_WAIT)

    def set_aiter_dirs(self, paths: Iterable[Path]) -> None:
        """Watch exactly these aiter folders (main thread; an unchanged set costs nothing)."""
        wanted = tuple(
            dict.fromkeys(
                p.absolute()
                for p in paths
                if p.name != "build" and p.absolute() != self._slots_dir  # slots: watched already
            )
        )
        if wanted == self._aiter_dirs:
            return
        self._aiter_dirs = wanted
        self._keys.aiter_watched = bool(wanted)  # a slot file change also re-plans aiter
        self._watch_exactly(self._aiter_handler, wanted)

    def set_hal0_files(self, paths: Iterable[Path]) -> None:
        """Watch the folders of exactly these hal0 fact files (main thread; an unchanged set
        costs a few ``stat`` calls). A file whose folder is missing is watched at the nearest
        existing ancestor, for the one name (or ``python3.*`` pattern) leading to it. The slots'
        parent folder is watched already: its handler looks too."""
        names: dict[Path, set[str]] = {}
        leads: dict[Path, set[str]] = {}
        for path in paths:
            folder, name, lead = nearest_watch(path.absolute())
            (leads if lead else names).setdefault(folder, set()).add(name)
        wanted = {folder: frozenset(n) for folder, n in names.items()}
        wanted_leads = {folder: frozenset(n) for folder, n in leads.items()}
        self._keys.hal0_moved.clear()
        if wanted == self._keys.hal0_names and wanted_leads == self._keys.hal0_leads:
            return
        moved = bool(
            self._keys.hal0_names or self._keys.hal0_leads
        )  # not the first call: hal0 came
        self._keys.hal0_names, self._keys.hal0_leads = wanted, wanted_leads
        folders = [*wanted, *(f for f in wanted_leads if f not in wanted)]
        self._watch_hal0(folders)
        if moved:  # what appeared before the new watch was added is seen by a full pass
            self._enqueue_raw([Special.EVERYTHING])

    def _watch_hal0(self, folders: list[Path]) -> None:
        taken = {self._slots_dir, self._slots_dir.parent, *self._aiter_dirs}
        if self._dev_dir is not None:
            taken.add(self._dev_dir)
        if self._dri_dir is not None:
            taken.add(self._dri_dir)
        self._watch_exactly(self._hal0_handler, [f for f in folders if f not in taken])

    def _watch_exactly(self, handler: _Handler, folders: list[Path] | tuple[Path, ...]) -> None:
        """Make ``handler``'s watches exactly ``folders``: unschedule the others, add the new."""
        wanted = set(folders)
        keep: list[_Watch] = []
        for watch in self._watches:
            if watch.handler is handler and watch.path not in wanted:
                if watch.handle is not None and self._observer is not None:
                    with contextlib.suppress(Exception):
                        self._observer.unschedule(watch.handle)
                continue
            keep.append(watch)
        have = {w.path for w in keep if w.handler is handler}
        keep += [_Watch(path, handler) for path in folders if path not in have]
        self._watches = keep
        self._schedule_missing(retry_failures=True)

    # -- the main loop's look -------------------------------------------------------------------
    def check(self, *, retry_failures: bool = False) -> list[Trigger]:
        """Repair what can be repaired; return why a full pass is needed (empty: none)."""
        triggers: list[Trigger] = []
        if self._overflowed.is_set():
            self._overflowed.clear()
            triggers.append(Trigger.OVERFLOW)
            log.warning("daemon.events_lost", reason="inotify queue overflowed")
        if self._handler_failed.is_set() and self._observer is not None:
            self._handler_failed.clear()
            self._observer.join(timeout=OBSERVER_STOP_WAIT)  # it is ending: the raise unwinds it
        if self._observer is not None and not self._observer.is_alive() and not self._stopping:
            log.error("daemon.observer_died", action="restarting the observer, full pass")
            triggers.append(Trigger.OBSERVER_DIED)
            dead = self._observer
            with contextlib.suppress(Exception):
                dead.stop()  # stops its emitter threads
            dead.join(timeout=1)
            for watch in self._watches:
                watch.handle = None
                watch.identity = None
            self._observer = self._factory()
            self._observer.start()
            retry_failures = True
        force = self._keys.folder_changed.is_set()
        self._keys.folder_changed.clear()
        if self._schedule_missing(retry_failures=retry_failures, force=force):
            triggers.append(Trigger.REWATCHED)
        if self._watches_added != self._watches_named:  # the look before READY among them
            name_watchdog_threads()
        return triggers

    def health(self) -> WatchHealth:
        failures = {str(w.path): w.failure for w in self._watches if w.failure is not None}
        alive = self._observer is not None and self._observer.is_alive()
        return WatchHealth(
            mode="polling" if failures or not alive else "inotify",
            watched=tuple(str(w.path) for w in self._watches if w.handle is not None),
            failures=failures,
        )

    def _schedule_missing(self, *, retry_failures: bool, force: bool = False) -> bool:
        """(Re-)schedule every watch whose folder is new or re-created; True when one was added."""
        observer = self._observer
        if observer is None:
            return False
        added = False
        for watch in self._watches:
            identity = _identity(watch.path)
            if watch.handle is not None and identity == watch.identity and not force:
                continue
            if watch.handle is not None:  # the folder went away or was replaced
                with contextlib.suppress(Exception):
                    observer.unschedule(watch.handle)
                watch.handle = None
            if identity is None:
                watch.identity = None
                continue  # absent: its parent's watch (or the next resync) brings it back
            if watch.failure is not None and not retry_failures:
                continue
            watch.handler.on_failure = self._on_handler_failure
            try:
                watch.handle = observer.schedule(
                    watch.handler,
                    str(watch.path),
                    recursive=False,
                    **_filtered(observer, watch.ignored),
                )
            except OSError as exc:
                self._failed(watch, exc)
                continue
            watch.identity = identity
            if watch.failure is not None:
                log.info("daemon.watch_restored", path=str(watch.path))
            watch.failure = None
            added = True
        if added:
            self._watches_added += 1
            name_watchdog_threads()
        return added

    def _failed(self, watch: _Watch, exc: OSError) -> None:
        if exc.errno in {errno.ENOSPC, errno.EMFILE}:
            reason = (
                f"{os.strerror(exc.errno)}: raise fs.inotify.max_user_watches / max_user_instances"
            )
        else:
            reason = str(exc) or type(exc).__name__
        if watch.failure != reason:
            log.error(
                "daemon.watch_failed",
                path=str(watch.path),
                reason=reason,
                fallback="polling at the resync interval",
            )
        watch.failure = reason


_GLOB = frozenset("*?[")


def _watchdog_role(thread: threading.Thread) -> str | None:
    """What a thread of watchdog's does, by its class or, for a plain thread watchdog starts
    (7.1.1 and later: the reader's dispatcher), by the code it runs (None: not watchdog's)."""
    kind = type(thread)
    if not kind.__module__.startswith("watchdog."):
        target = getattr(thread, "_target", None)  # a plain Thread's: present while it runs
        if not str(getattr(target, "__module__", "")).startswith("watchdog."):
            return None
        return "hal0-inotify-ev"  # hands what the reader read to the emitters
    name = kind.__name__
    if "Observer" in name:
        return "hal0-observer"  # dispatches events to the handlers (our mapping runs here)
    if "Emitter" in name:
        return "hal0-watch"  # one per watched folder: turns inotify events into watchdog's
    return "hal0-inotify"  # reads the inotify fd, pairs a rename's two halves


def name_watchdog_threads() -> bool:
    """Name watchdog's threads (they run none of our code before their first event): one
    observer, per watched folder an emitter, and the inotify reader with (7.1.1 and later) the
    dispatcher it starts itself. False when one was still starting (it is named next time)."""
    settled = True
    for thread in threading.enumerate():
        role = _watchdog_role(thread)
        if role is not None and not thread.name.startswith("hal0-"):
            settled &= threadname.name_other(thread, role) or thread.is_alive()
    return settled


def nearest_watch(path: Path) -> tuple[Path, str, bool]:
    """Where to watch for ``path``: its folder and its name when the folder exists, else the
    nearest existing ancestor and the one name in it that leads to ``path`` (True: a lead).
    A component with a glob (``python3.*``) is a lead pattern in its parent."""
    parts = path.parts
    for depth in range(1, len(parts)):
        if _GLOB & set(parts[depth]):
            return _existing_lead(Path(*parts[:depth]), parts[depth])
    if path.parent.is_dir():
        return path.parent, path.name, False
    return _existing_lead(path.parent.parent, path.parent.name)


def _existing_lead(folder: Path, name: str) -> tuple[Path, str, bool]:
    while not folder.is_dir() and folder != folder.parent:
        folder, name = folder.parent, folder.name
    return folder, name, True


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _filtered(observer: Any, ignored: tuple[str, ...] = ()) -> dict[str, Any]:
    """``event_filter`` without the events every watch ignores (a file opened,
    or closed without writing), where watchdog can leave them out of the inotify mask (5.0 and
    later): then a process that only reads slot files costs the daemon nothing. Older
    watchdog (Debian 12's 2.2) delivers them and the handler drops them. ``ignored``: the
    names of more event classes this watch leaves out (never queued by watchdog)."""
    import inspect  # noqa: PLC0415 - once per schedule call

    try:
        accepts = "event_filter" in inspect.signature(observer.schedule).parameters
    except (TypeError, ValueError):
        accepts = False
    if not accepts:
        return {}
    from watchdog import events  # noqa: PLC0415

    unwanted = {
        getattr(events, "FileOpenedEvent", None),
        getattr(events, "FileClosedNoWriteEvent", None),
    }
    kinds = [
        kind
        for name, kind in vars(events).items()
        if name.endswith("Event")
        and isinstance(kind, type)
        and issubclass(kind, events.FileSystemEvent)
        and kind is not events.FileSystemEvent
        and kind is not getattr(events, "FileSystemMovedEvent", None)
        and kind not in unwanted
        and name not in ignored
    ]
    return {"event_filter": kinds}
