"""The watcher's watches over its life: what the kernel is asked to report, a reload that
changes one folder without touching the others, folders that go away, a dead observer
replaced with the watches that had failed, and a stopped watcher. Real watchdog observers on
real inotify; the kernel's own view of each watch is read from /proc/self/fdinfo."""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from watchdog.observers import Observer

from hal0_reconciler.daemon.workqueue import Special, WorkKey
from helpers.watch_tree import UnfilteredObserver, make_tree, watcher_on

IN_CLOSE_NOWRITE = 0x10
IN_OPEN = 0x20


def _ignore(_keys: Iterable[WorkKey]) -> None:
    pass


def _inotify_masks() -> dict[int, int]:
    """Every inotify watch of this process, as the kernel keeps it: inode → event mask."""
    masks: dict[int, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "inotify" not in os.readlink(f"/proc/self/fd/{fd}"):
                continue
            info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("inotify wd:"):
                fields = dict(f.split(":", 1) for f in line.split()[1:])
                masks[int(fields["ino"], 16)] = int(fields["mask"], 16)
    return masks


@pytest.mark.parametrize("observer", [Observer, UnfilteredObserver], ids=["filtering", "2.2"])
def test_the_kernel_is_not_asked_for_reads_where_watchdog_can_leave_them_out(
    tmp_path: Path, observer: type
) -> None:
    """Where watchdog takes an event filter (5.0 on), the slots folder's inotify watch leaves
    out opened and closed-without-writing: hal0 reading slot files all day costs the daemon
    nothing, not even a wakeup. Without the filter watchdog 5+ asks for them (the unfiltered
    case shows the check can fail); Debian 12's 2.2 never asks for them."""
    tree = make_tree(tmp_path)
    slots = tree / "etc/slots"
    with watcher_on(tree, enqueue=_ignore, observer_factory=observer):
        mask = _inotify_masks().get(slots.stat().st_ino)
    assert mask is not None, "the slots folder has no inotify watch"
    reads = mask & (IN_OPEN | IN_CLOSE_NOWRITE)
    if observer is Observer:
        assert 0 == reads, f"the kernel reports reads of slot files (mask {mask:#x})"
    elif "event_filter" in inspect.signature(Observer.schedule).parameters:  # watchdog >= 5
        assert reads, f"setup: an observer without a filter gets every event (mask {mask:#x})"


class CountingObserver(Observer):  # type: ignore[misc, valid-type]
    """The real observer, counting the watches it was asked to add and remove."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled: list[str] = []
        self.unscheduled = 0

    def schedule(self, event_handler: Any, path: str, **kwargs: Any) -> Any:
        self.scheduled.append(path)
        return super().schedule(event_handler, path, **kwargs)

    def unschedule(self, watch: Any) -> None:
        self.unscheduled += 1
        super().unschedule(watch)


def test_a_new_aiter_folder_adds_one_watch_and_leaves_the_others(tmp_path: Path) -> None:
    """A reload that adds an aiter folder (or a hal0 file's folder) adds exactly that watch:
    the slots folder's and the others are not removed and added again (no event missed in
    between, no churn of inotify watches)."""
    tree = make_tree(tmp_path)
    configs, hal0 = tree / "aiter/configs", tree / "opt/hal0"
    configs.mkdir(parents=True)
    hal0.mkdir(parents=True)
    made: list[CountingObserver] = []

    def factory() -> CountingObserver:
        made.append(CountingObserver())
        return made[-1]

    with watcher_on(tree, enqueue=_ignore, observer_factory=factory) as watcher:
        observer = made[0]
        at_start = list(observer.scheduled)
        watcher.set_aiter_dirs([configs])
        watcher.set_hal0_files([hal0 / "VERSION"])
        watcher.set_hal0_files([hal0 / "VERSION", hal0 / "other"])  # the same folder
        added = observer.scheduled[len(at_start) :]
        assert [str(configs), str(hal0)] == added, f"watches added by the reloads: {added}"
        assert 0 == observer.unscheduled, "a reload removed watches it keeps"
        assert [] == watcher.check(), "a reload that changed nothing else asks for a full pass"


def test_a_folder_that_went_away_is_not_reported_as_watched(tmp_path: Path) -> None:
    """The DRI folder removed (its module unloaded): the next look drops its watch and health
    no longer lists it as watched; when it comes back it is watched again."""
    tree = make_tree(tmp_path)
    dri = tree / "dev/dri"
    with watcher_on(tree, enqueue=_ignore) as watcher:
        assert str(dri) in watcher.health().watched
        shutil.rmtree(dri)
        watcher.check()
        assert str(dri) not in watcher.health().watched, "a folder that is gone is 'watched'"
        watcher.check()
        dri.mkdir()
        watcher.check()
        assert str(dri) in watcher.health().watched, "the folder back is not watched again"


class FailsFirst(Observer):  # type: ignore[misc, valid-type]
    """Observers whose schedule() fails like EMFILE for the first ``failures`` calls made
    through any of them (the inotify instances of the host are used up for a while)."""

    failures = 0

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if FailsFirst.failures > 0:
            FailsFirst.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().schedule(*args, **kwargs)


def test_a_replaced_observer_retries_the_watches_that_had_failed(tmp_path: Path) -> None:
    """A watch failed (EMFILE) and then the observer died: the new observer adds every watch,
    the failed one too, at once (not only at the next resync's retry)."""
    tree = make_tree(tmp_path)
    made: list[Observer] = []

    def factory() -> Observer:
        made.append(FailsFirst())
        return made[-1]

    FailsFirst.failures = 1
    with watcher_on(tree, enqueue=_ignore, observer_factory=factory) as watcher:
        assert "polling" == watcher.health().mode, "setup: one watch should have failed"
        made[0].stop()
        made[0].join(5)
        watcher.check()  # not a resync: no retry asked for
        health = watcher.health()
        assert 2 == len(made), "setup: the dead observer was not replaced"
        assert ("inotify", {}) == (health.mode, health.failures), (
            f"the new observer left a failed watch failed: {health}"
        )


def test_a_stopped_watcher_asks_for_nothing(tmp_path: Path) -> None:
    """After stop() (the daemon shutting down) check() asks for no full pass and adds no
    watch, whatever happened to the folders."""
    tree = make_tree(tmp_path)
    watcher = watcher_on(tree, enqueue=_ignore)
    with watcher:
        pass
    shutil.rmtree(tree / "dev/dri")
    (tree / "dev/dri").mkdir()
    assert [] == watcher.check(), "a stopped watcher asked for a full pass"


def _move_delays(root: object, depth: int = 4) -> list[float]:
    """The delay of every watchdog DelayedQueue reachable from ``root`` (where each watchdog
    version holds back a rename's first half to pair it with its second)."""
    found: list[float] = []
    seen: set[int] = set()

    def walk(obj: object, left: int) -> None:
        if id(obj) in seen or left < 0:
            return
        seen.add(id(obj))
        if type(obj).__name__ == "DelayedQueue":
            found.append(float(getattr(obj, "delay", None) or obj.delay_sec))  # type: ignore[attr-defined]
            return
        children = (
            obj if isinstance(obj, list | set | tuple) else getattr(obj, "__dict__", {}).values()
        )
        for child in children:
            if type(child).__module__.startswith("watchdog") or isinstance(
                child, list | set | tuple
            ):
                walk(child, left - 1)

    walk(root, depth)
    return found


@pytest.mark.parametrize("observer", [Observer, UnfilteredObserver], ids=["filtering", "2.2"])
def test_a_renames_first_half_is_not_held_for_half_a_second(
    tmp_path: Path, observer: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """watchdog holds a rename's IN_MOVED_FROM up to 0.5 s to pair it, and every event behind
    it waits as long: a burst of saves (all renames) came in half-second steps. The watcher's
    observers pair within MOVE_PAIRING_DELAY; a rename onto a slot still gives that slot."""
    import importlib

    from hal0_reconciler.daemon import _watchdog_compat

    for module, name in _watchdog_compat._MOVE_GROUPERS:  # as watchdog ships it
        with contextlib.suppress(ImportError, AttributeError):
            monkeypatch.setattr(getattr(importlib.import_module(module), name), "delay", 0.5)
    tree = make_tree(tmp_path)
    seen: list[WorkKey] = []
    made: list[Any] = []

    def factory() -> Any:
        made.append(observer())
        return made[-1]

    with watcher_on(tree, enqueue=seen.extend, observer_factory=factory):
        delays = [d for o in made for d in _move_delays(list(o.emitters))]
        assert delays, "no move-pairing queue found in the observer: the test proves nothing"
        assert max(delays) <= _watchdog_compat.MOVE_PAIRING_DELAY <= 0.05, delays
        slot = tree / "etc/slots/agent.toml"
        (tree / "etc/slots/.agent.toml.part").write_text("x = 1\n")
        (tree / "etc/slots/.agent.toml.part").rename(slot)
        deadline = time.monotonic() + 10
        while str(slot) not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert str(slot) in seen, "a rename onto a slot was not seen"


def test_the_slots_folder_being_modified_is_left_out_where_watchdog_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """watchdog adds "the folder was modified" to every file created, closed or renamed in a
    folder; for the slots folder that means nothing (its files' own events are the work), and
    watchdog 5+ is asked not to queue it: a burst of saves is that many fewer events. Its
    files' events still come; so does the folder's in the parent's watch."""
    from hal0_reconciler.daemon.watchkeys import EventKeys

    got: list[tuple[str, bool, str]] = []
    slot_keys = EventKeys.slot_keys

    def recording(self: EventKeys, event: Any) -> list[WorkKey]:
        got.append((event.event_type, event.is_directory, os.path.basename(event.src_path)))
        return slot_keys(self, event)

    monkeypatch.setattr(EventKeys, "slot_keys", recording)
    tree = make_tree(tmp_path)
    seen: list[WorkKey] = []
    with watcher_on(tree, enqueue=seen.extend, observer_factory=Observer):
        slots = tree / "etc/slots"
        (slots / ".agent.toml.part").write_text("x = 1\n")
        (slots / ".agent.toml.part").rename(slots / "agent.toml")
        (slots / "other.toml").write_text("x = 1\n")
        deadline = time.monotonic() + 10
        while not {str(slots / "agent.toml"), str(slots / "other.toml")} <= set(seen):
            assert time.monotonic() < deadline, f"slot events lost: {got}"
            time.sleep(0.01)
    assert got, "no event reached the slots handler"
    folder_modified = [e for e in got if e[:2] == ("modified", True)]
    if "event_filter" in inspect.signature(Observer.schedule).parameters:  # watchdog >= 5
        assert [] == folder_modified, f"watchdog still queues the folder's own changes: {got}"
    else:  # Debian 12's 2.2 cannot leave them out: the handler drops them
        assert not any(k == Special.EVERYTHING for k in seen), "folder modified: EVERYTHING"
