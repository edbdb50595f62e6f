"""Watches: which filesystem events become which keys, and how lost events are noticed."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from watchdog.observers import Observer

from hal0_reconciler import fsio
from hal0_reconciler.daemon.watch import Trigger, Watcher
from hal0_reconciler.daemon.workqueue import Special, WorkKey
from helpers.daemon_host import wait_until
from helpers.watch_tree import make_tree, watcher_on


class Keys:
    def __init__(self) -> None:
        self.seen: list[WorkKey] = []

    def add(self, keys: Iterable[WorkKey]) -> None:
        self.seen.extend(keys)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path)


def _watcher(tree: Path, keys: Keys, **kwargs) -> Watcher:  # type: ignore[no-untyped-def]
    return watcher_on(tree, enqueue=keys.add, **kwargs)


@pytest.fixture
def watching(tree: Path) -> Iterator[tuple[Watcher, Keys]]:
    keys = Keys()
    with _watcher(tree, keys) as watcher:
        yield watcher, keys


def test_a_rename_onto_a_slot_is_a_change_and_temp_names_are_not_slots(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """Saving through .agent.toml.XXXX.tmp enqueues agent.toml only."""
    _, keys = watching
    tmp = tree / "etc/slots/.agent.toml.1234.tmp"
    tmp.write_text("x")
    tmp.rename(tree / "etc/slots/agent.toml")
    (tree / "etc/slots/notes.txt~").write_text("x")
    slot = str(tree / "etc/slots/agent.toml")
    wait_until(lambda: slot in keys.seen, what="the slot key")
    assert {slot} == set(keys.seen)


def test_the_daemons_own_temp_files_are_never_queued_but_their_rename_is(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """The daemon's own atomic write (temp file created, written, owner and mode set, synced,
    renamed) queues the slot it replaced and nothing else; a real slot file whose name looks
    like our temp files' is queued."""
    _, keys = watching
    slots = tree / "etc/slots"

    def settled() -> set[WorkKey]:
        """Every key of the events so far (a marker renamed in last: events come in order)."""
        marker = slots / "zz-marker.toml"
        (slots / "zz-marker.part").write_text("x = 1\n")
        (slots / "zz-marker.part").rename(marker)
        wait_until(lambda: str(marker) in keys.seen, what="the marker's key")
        seen = set(keys.seen) - {str(marker)}
        keys.seen.clear()
        return seen

    (slots / "agent.toml").write_text("x = 1\n")
    settled()
    fsio.write_atomically(slots / "agent.toml", b"x = 2\n", uid=0, gid=0)
    assert {str(slots / "agent.toml")} == settled(), "not the rename's key alone"
    lookalike = slots / f"agent{fsio.TEMP_MARKER}1234.toml"
    lookalike.write_text("x = 1\n")
    assert {str(lookalike)} == settled(), "a slot named like our temp files was not queued"


def test_a_slot_moved_out_is_enqueued_to_be_forgotten(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """Moving a slot file out of the folder enqueues its key (the pass finds it gone)."""
    _, keys = watching
    slot = tree / "etc/slots/agent.toml"
    slot.write_text("x")
    wait_until(lambda: str(slot) in keys.seen)
    keys.seen.clear()
    slot.rename(tree / "agent.toml.bak")
    wait_until(lambda: str(slot) in keys.seen, what="moved-out key")


def test_the_slots_folder_survives_deletion_and_recreation(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """Deleting and re-creating the folder: everything is enqueued and the new folder is watched."""
    watcher, keys = watching
    shutil.rmtree(tree / "etc/slots")
    wait_until(lambda: Special.EVERYTHING in keys.seen, what="deletion noticed")
    (tree / "etc/slots").mkdir()
    wait_until(lambda: Trigger.REWATCHED in watcher.check(), what="rewatch")
    keys.seen.clear()
    (tree / "etc/slots/agent.toml").write_text("x")
    wait_until(lambda: str(tree / "etc/slots/agent.toml") in keys.seen, what="new folder watched")


def test_device_nodes_changing_mean_host_facts(tree: Path, watching: tuple[Watcher, Keys]) -> None:
    """A kfd chmod and a render node appearing enqueue a re-probe; other /dev names do not."""
    _, keys = watching
    (tree / "dev/tty99").write_text("")
    kfd = tree / "dev/kfd"
    kfd.write_text("")
    wait_until(lambda: Special.HOST_FACTS in keys.seen, what="kfd created")
    keys.seen.clear()
    kfd.chmod(0o600)
    wait_until(lambda: Special.HOST_FACTS in keys.seen, what="kfd chmod")
    keys.seen.clear()
    (tree / "dev/dri/renderD128").write_text("")
    wait_until(lambda: Special.HOST_FACTS in keys.seen, what="render node")


def test_the_probe_opening_nodes_does_not_re_trigger_a_probe(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """Opening and closing kfd and a render node read-write (what the probe does) is no change."""
    _, keys = watching
    kfd = tree / "dev/kfd"
    render = tree / "dev/dri/renderD128"
    kfd.write_text("")
    render.write_text("")
    wait_until(lambda: Special.HOST_FACTS in keys.seen)
    threading.Event().wait(0.3)
    keys.seen.clear()
    for _ in range(3):
        os.close(os.open(kfd, os.O_RDWR))
        os.close(os.open(render, os.O_RDWR))
    threading.Event().wait(0.5)
    assert [] == keys.seen


def test_overflow_warning_asks_for_a_full_pass(watching: tuple[Watcher, Keys]) -> None:
    """watchdog's inotify overflow warning becomes an OVERFLOW trigger, reported once."""
    watcher, _ = watching
    with capture_logs() as logs:
        logging.getLogger("watchdog.observers.inotify_c").warning(
            "Inotify queue overflowed; filesystem events were lost"
        )
        assert [Trigger.OVERFLOW] == watcher.check()
        assert [] == watcher.check()
    assert ["daemon.events_lost"] == [e["event"] for e in logs]


class NoWatchesLeft(Observer):  # type: ignore[misc, valid-type]
    """An observer whose every watch fails like a full fs.inotify.max_user_watches."""

    def schedule(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "inotify watch limit reached")


def test_a_watch_that_cannot_be_added_falls_back_to_polling(tree: Path) -> None:
    """ENOSPC: said once at ERROR, health reports polling, the next retry says nothing new."""
    keys = Keys()
    with capture_logs() as logs, _watcher(tree, keys, observer_factory=NoWatchesLeft) as watcher:
        assert "polling" == watcher.health().mode
        watcher.check(retry_failures=True)
    failed = [e for e in logs if e["event"] == "daemon.watch_failed"]
    assert 4 == len(failed)  # one per watched folder, not repeated by the retry
    assert {"error"} == {e["log_level"] for e in failed}
    assert "max_user_watches" in failed[0]["reason"]


def _comm(thread: threading.Thread) -> str:
    return Path(f"/proc/self/task/{thread.native_id}/comm").read_text().rstrip("\n")


class LateThread:
    """A plain thread running watchdog's code (as 7.1.1's reader starts its dispatcher), and a
    plain thread running ours, started now."""

    def __init__(self) -> None:
        from watchdog.utils.delayed_queue import DelayedQueue  # a watchdog object that blocks

        self._queue: DelayedQueue[int] = DelayedQueue(0)
        self._done = threading.Event()
        self.watchdogs = threading.Thread(target=self._queue.get, name="Late-Dispatcher")
        self.ours = threading.Thread(target=self._done.wait, args=(30,), name="ours")
        self.watchdogs.start()
        self.ours.start()

    def stop(self) -> None:
        self._queue.put(1)
        self._done.set()
        self.watchdogs.join(timeout=5)
        self.ours.join(timeout=5)

    def assert_named(self) -> None:
        assert ("hal0-inotify-ev", "hal0-inotify-ev") == (
            self.watchdogs.name,
            _comm(self.watchdogs),
        )
        assert "ours" == self.ours.name
        assert not _comm(self.ours).startswith("hal0-")


def _event(tree: Path, keys: Keys, name: str, *, renamed: bool) -> None:
    slot = tree / "etc/slots" / name
    if renamed:  # a slot file renamed into place: a whole file
        (tree / "etc/slots" / f".{name}.part").write_text("x")
        (tree / "etc/slots" / f".{name}.part").rename(slot)
    else:
        slot.write_text("x")
    wait_until(lambda: str(slot) in keys.seen, what="the slot key")


def _late_threads_named_by_an_event(tree: Path, keys: Keys, *, renamed: bool) -> None:
    late = LateThread()
    try:
        _event(tree, keys, "agent.toml", renamed=renamed)
        late.assert_named()
    finally:
        late.stop()


@pytest.mark.parametrize("renamed", [False, True], ids=["written", "renamed-into-place"])
def test_a_thread_watchdog_starts_after_the_watcher_is_named_at_the_next_event(
    tree: Path, renamed: bool
) -> None:
    """watchdog 7.1.1's inotify reader starts a plain thread (its dispatcher) of its own, after
    the watch that made the reader was added: the next event names it by the code it runs. A
    plain thread running our code is left as it is."""
    keys = Keys()
    with _watcher(tree, keys, enqueue_complete=keys.add) as _:
        _late_threads_named_by_an_event(tree, keys, renamed=renamed)


def test_a_thread_watchdog_starts_after_a_later_watch_is_named_at_the_next_event(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """Once named, watchdog's threads are looked at again only after another watch is added
    (an aiter folder here), at the event after it."""
    watcher, keys = watching
    _event(tree, keys, "first.toml", renamed=True)  # its last event: none of it comes later
    (tree / "aiter").mkdir()
    watcher.set_aiter_dirs([tree / "aiter"])
    _late_threads_named_by_an_event(tree, keys, renamed=False)


def test_the_main_loops_look_names_a_late_thread_and_the_next_event_still_looks(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """On an idle host no event may come: the main loop's look (READY's among them) names a
    thread watchdog started after its watch, without an event; it does not end the looking,
    since only an event shows the reader's threads have all started."""
    watcher, keys = watching
    late = LateThread()
    try:
        watcher.check()
        late.assert_named()
    finally:
        late.stop()
    _late_threads_named_by_an_event(tree, keys, renamed=False)


@pytest.mark.parametrize("kernel_names", [True, False], ids=["kernel-names", "no-c-library"])
def test_once_every_thread_is_named_events_look_no_more(
    tree: Path, watching: tuple[Watcher, Keys], monkeypatch: pytest.MonkeyPatch, kernel_names: bool
) -> None:
    """The looking ends at the event that found every thread of watchdog's running: a later
    event costs no look at the process's threads (a thread started since, with no watch added,
    is not watchdog's doing). Without a C library to name threads with, watchdog's get their
    Python names and the looking ends all the same."""
    from hal0_reconciler import threadname

    if not kernel_names:
        monkeypatch.setattr(threadname, "_libc", None)
        monkeypatch.setattr(threadname, "_loaded", True)
    _, keys = watching
    first = LateThread()
    second: LateThread | None = None
    try:
        _event(tree, keys, "agent.toml", renamed=True)
        assert "hal0-inotify-ev" == first.watchdogs.name
        assert kernel_names == (_comm(first.watchdogs) == "hal0-inotify-ev")
        second = LateThread()
        _event(tree, keys, "later.toml", renamed=True)
        assert "Late-Dispatcher" == second.watchdogs.name
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_watch_added_later_has_its_threads_named_at_once(
    tree: Path, watching: tuple[Watcher, Keys]
) -> None:
    """The threads a new watch starts with it (its emitter; before watchdog 3, the emitter's
    own inotify reader too) are named as it is added: no event or look needed."""
    watcher, _ = watching
    (tree / "aiter").mkdir()
    before = {t.ident for t in threading.enumerate()}
    watcher.set_aiter_dirs([tree / "aiter"])
    names = {(t.name, _comm(t)) for t in threading.enumerate() if t.ident not in before}
    assert ("hal0-watch", "hal0-watch") in names
    assert names <= {("hal0-watch", "hal0-watch"), ("hal0-inotify", "hal0-inotify")}
