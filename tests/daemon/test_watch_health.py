"""The watcher's own health: a dead observer, watched folders that come and go, and what
``check`` and ``health`` tell the main loop about them."""

from __future__ import annotations

import errno
import logging
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from watchdog.observers import Observer

from hal0_reconciler.daemon.watch import Trigger, Watcher
from hal0_reconciler.daemon.workqueue import Special, WorkKey
from hal0_reconciler.model import SlotKey
from helpers.daemon_host import wait_until
from helpers.watch_tree import make_tree, watcher_on


class Keys:
    def __init__(self) -> None:
        self.seen: list[WorkKey] = []
        self.wakes = 0

    def add(self, keys: Iterable[WorkKey]) -> None:
        self.seen.extend(keys)

    def wake(self) -> None:
        self.wakes += 1


class Observers:
    """The real watchdog observer, remembering each one it made."""

    def __init__(self) -> None:
        self.made: list[Observer] = []  # type: ignore[valid-type]

    def __call__(self) -> Observer:  # type: ignore[valid-type]
        self.made.append(Observer())
        return self.made[-1]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path)


def _watcher(tree: Path, keys: Keys, **kwargs) -> Watcher:  # type: ignore[no-untyped-def]
    return watcher_on(tree, enqueue=keys.add, wake=keys.wake, **kwargs)


def test_a_dead_observer_is_reported_once_and_replaced(tree: Path) -> None:
    """check() says OBSERVER_DIED (the runner counts deaths for its health rule), starts a new
    observer with every watch in place, and says nothing more on the next look."""
    keys = Keys()
    observers = Observers()
    with _watcher(tree, keys, observer_factory=observers) as watcher, capture_logs() as logs:
        assert [] == watcher.check(), "a healthy watcher asked for a full pass"
        first = observers.made[0]
        first.stop()
        first.join(5)
        triggers = watcher.check()
        assert Trigger.OBSERVER_DIED in triggers, f"a dead observer was not reported: {triggers}"
        assert 2 == len(observers.made), "no new observer was started"
        assert observers.made[1].is_alive()
        health = watcher.health()
        assert ("inotify", 4) == (health.mode, len(health.watched)), (
            f"the new observer does not watch every folder: {health}"
        )
        assert [] == watcher.check(), "a replaced observer was reported again"
        (tree / "etc/slots/agent.toml").write_text("x = 1\n")
        wait_until(lambda: keys.seen, what="an event through the new observer")
    assert 1 == sum(e["event"] == "daemon.observer_died" for e in logs)
    assert SlotKey(str(tree / "etc/slots/agent.toml")) in keys.seen


def test_health_says_polling_while_the_observer_is_dead(tree: Path) -> None:
    """Until the main loop replaces it, a dead observer makes health() say "polling"."""
    keys = Keys()
    observers = Observers()
    with _watcher(tree, keys, observer_factory=observers) as watcher:
        assert "inotify" == watcher.health().mode
        observers.made[0].stop()
        observers.made[0].join(5)
        assert "polling" == watcher.health().mode, "a dead observer reported as watching"


def test_a_recreated_slots_folder_is_watched_again(tree: Path) -> None:
    """The slots folder deleted and made again: EVERYTHING is enqueued, check() re-watches it
    (REWATCHED), and events in the new folder arrive."""
    keys = Keys()
    slots = tree / "etc/slots"
    with _watcher(tree, keys) as watcher:
        shutil.rmtree(slots)
        slots.mkdir()
        wait_until(lambda: Special.EVERYTHING in keys.seen, what="EVERYTHING for the folder")
        # the folder's own "deleted" can come before its parent's "created" (which says a new
        # folder, even on a reused inode): the main loop's next looks re-watch it
        wait_until(
            lambda: Trigger.REWATCHED in watcher.check(), what="the new slots folder re-watched"
        )
        assert str(slots) in watcher.health().watched
        # later events of the same re-creation may ask once more, but not on every look
        wait_until(lambda: watcher.check() == [], what="a look that asks for no re-watch")
        keys.seen.clear()
        (slots / "agent.toml").write_text("x = 1\n")
        wait_until(
            lambda: SlotKey(str(slots / "agent.toml")) in keys.seen, what="event in new folder"
        )


def test_an_absent_folder_is_not_watched_and_not_a_failure(tmp_path: Path) -> None:
    """A DRI folder that does not exist yet is simply not watched: health stays "inotify"
    with no failure, and the folder is watched once it appears (its parent's event)."""
    (tmp_path / "etc/slots").mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    keys = Keys()
    with _watcher(tmp_path, keys) as watcher:
        health = watcher.health()
        assert ("inotify", {}) == (health.mode, health.failures)
        assert str(tmp_path / "dev/dri") not in health.watched
        (tmp_path / "dev/dri").mkdir()
        wait_until(lambda: Special.HOST_FACTS in keys.seen, what="the dri folder's event")
        assert Trigger.REWATCHED in watcher.check()
        assert str(tmp_path / "dev/dri") in watcher.health().watched


class FailsOnce(Observer):  # type: ignore[misc, valid-type]
    """An observer whose first schedule() calls fail like EMFILE, then work."""

    failures = 0

    def schedule(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if FailsOnce.failures < 1:
            FailsOnce.failures += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().schedule(*args, **kwargs)


def test_a_failed_watch_is_retried_and_its_recovery_said(tree: Path) -> None:
    """EMFILE on one watch: polling with the reason; a retry that works says watch_restored,
    health is back to inotify, and check() asks for a full pass (REWATCHED)."""
    FailsOnce.failures = 0
    keys = Keys()
    with capture_logs() as logs, _watcher(tree, keys, observer_factory=FailsOnce) as watcher:
        health = watcher.health()
        assert "polling" == health.mode
        (reason,) = health.failures.values()
        assert "max_user_instances" in reason, f"EMFILE's reason lost: {reason}"
        assert [] == watcher.check(), "a failed watch retried without being asked"
        assert [Trigger.REWATCHED] == watcher.check(retry_failures=True)
        assert ("inotify", {}) == (watcher.health().mode, watcher.health().failures)
    assert ["daemon.watch_failed", "daemon.watch_restored"] == [
        e["event"] for e in logs if e["event"].startswith("daemon.watch_")
    ]


def test_slot_events_do_not_wake_the_main_loop_a_new_slots_folder_does(tree: Path) -> None:
    """The worker takes slot keys from the queue by itself: a slot event wakes nobody else (a
    burst of new files is thousands of events); the slots folder re-created wakes the main
    loop at once, to watch the new folder."""
    keys = Keys()
    slots = tree / "etc/slots"
    with _watcher(tree, keys):
        for n in range(5):
            (slots / f"agent{n}.toml").write_text("x = 1\n")
        wait_until(lambda: len(set(keys.seen)) >= 5, what="the slot events")
        assert 0 == keys.wakes, f"{keys.wakes} wake-ups of the main loop for slot events"
        shutil.rmtree(slots)
        slots.mkdir()
        wait_until(lambda: keys.wakes >= 1, what="the main loop woken for the new folder")


def test_aiter_folders_given_at_start_are_watched(tree: Path) -> None:
    """aiter folders passed when the watcher is made are watched from the start, and their
    changes mean "re-plan aiter"; a build/ folder is never watched."""
    configs = tree / "aiter/configs"
    configs.mkdir(parents=True)
    build = tree / "aiter/jit/build"
    build.mkdir(parents=True)
    keys = Keys()
    with _watcher(tree, keys, aiter_dirs=[configs, build]) as watcher:
        watched = watcher.health().watched
        assert str(configs) in watched, f"an aiter folder given at start is not watched: {watched}"
        assert str(build) not in watched, "aiter's build/ folder is watched"
        (configs / "x_tuned_gemm.csv").write_text("gfx,cu_num\n")
        wait_until(lambda: Special.AITER in keys.seen, what="the aiter key")


@pytest.mark.parametrize("with_aiter", [True, False], ids=["aiter-trees", "no-aiter"])
def test_a_slot_change_also_re_plans_aiter_only_when_trees_are_watched(
    tree: Path, with_aiter: bool
) -> None:
    """A slot's [server].env may pick other aiter tables: with aiter folders watched, a slot
    change also means "re-plan aiter"; without, it is only that slot."""
    configs = tree / "aiter/configs"
    configs.mkdir(parents=True)
    keys = Keys()
    with _watcher(tree, keys, aiter_dirs=[configs] if with_aiter else []):
        slot = tree / "etc/slots/agent.toml"
        slot.write_text("x = 1\n")
        wait_until(lambda: SlotKey(str(slot)) in keys.seen, what="the slot's key")
    assert with_aiter == (Special.AITER in keys.seen)


def _events():  # type: ignore[no-untyped-def]
    from watchdog import events

    return events


def test_the_slots_folder_itself_going_means_everything(tree: Path) -> None:
    """Seen from the slots folder's own watch: the folder deleted or moved away means a full
    pass; the folder merely modified (a file saved inside) does not."""
    ev = _events()
    slots = str(tree / "etc/slots")
    watcher = _watcher(tree, Keys())
    assert [Special.EVERYTHING] == watcher._keys.slot_keys(ev.DirDeletedEvent(slots))
    assert [Special.EVERYTHING] == watcher._keys.slot_keys(ev.DirMovedEvent(slots, slots + ".old"))
    assert [] == watcher._keys.slot_keys(ev.DirModifiedEvent(slots))


def test_the_parent_watch_sees_the_slots_folder_come_and_go(tree: Path) -> None:
    """Seen from the parent's watch: the slots folder created, deleted or moved in means a full
    pass and a re-watch; it being modified, or another folder changing, means nothing."""
    ev = _events()
    slots = str(tree / "etc/slots")
    watcher = _watcher(tree, Keys())
    assert [] == watcher._keys.slots_parent_keys(ev.DirModifiedEvent(slots))
    assert [] == watcher._keys.slots_parent_keys(ev.DirCreatedEvent(str(tree / "etc/other")))
    assert [] == watcher._keys.slots_parent_keys(ev.FileModifiedEvent(str(tree / "etc/notes.txt")))
    assert not watcher._keys.folder_changed.is_set()
    for event in (
        ev.DirCreatedEvent(slots),
        ev.DirDeletedEvent(slots),
        ev.DirMovedEvent(str(tree / "etc/new-slots"), slots),
    ):
        watcher._keys.folder_changed.clear()
        assert [Special.EVERYTHING] == watcher._keys.slots_parent_keys(event), event
        assert watcher._keys.folder_changed.is_set(), f"{event} does not re-watch the folder"


def test_a_hal0_file_beside_the_slots_folder_means_everything(tree: Path) -> None:
    """hal0.toml in the slots folder's parent changing means every slot is judged again;
    reading it does not, and another file there means nothing."""
    ev = _events()
    hal0_toml = tree / "etc/hal0.toml"
    watcher = _watcher(tree, Keys())
    watcher.set_hal0_files([hal0_toml])
    assert [Special.EVERYTHING] == watcher._keys.slots_parent_keys(
        ev.FileModifiedEvent(str(hal0_toml))
    )
    assert [] == watcher._keys.slots_parent_keys(ev.FileModifiedEvent(str(tree / "etc/other.toml")))
    opened = type("Opened", (ev.FileSystemEvent,), {"event_type": "opened"})  # watchdog >= 2.2
    assert [] == watcher._keys.slots_parent_keys(opened(str(hal0_toml)))


def test_stopping_the_watcher_stops_its_observer(tree: Path) -> None:
    """Leaving the watcher joins the observer thread: nothing keeps watching after stop()."""
    observers = Observers()
    with _watcher(tree, Keys(), observer_factory=observers):
        pass
    assert not observers.made[0].is_alive(), "the observer still runs after stop()"


def test_an_aiter_folder_no_longer_wanted_is_unwatched(tree: Path) -> None:
    """A tree dropped from the settings: its folder is no longer watched and its changes no
    longer mean "re-plan aiter"; the folders still wanted stay watched."""
    kept, dropped = tree / "aiter/configs", tree / "old-aiter/configs"
    kept.mkdir(parents=True)
    dropped.mkdir(parents=True)
    keys = Keys()
    with _watcher(tree, keys, aiter_dirs=[kept, dropped]) as watcher:
        watcher.set_aiter_dirs([kept])
        watched = watcher.health().watched
        assert 1 == watched.count(str(kept)), f"a kept aiter folder is not watched once: {watched}"
        assert str(dropped) not in watched, "a dropped aiter folder is still watched"
        (dropped / "x_tuned_gemm.csv").write_text("gfx\n")
        (kept / "y_tuned_gemm.csv").write_text("gfx\n")
        wait_until(lambda: Special.AITER in keys.seen, what="the kept folder's event")
        threading.Event().wait(0.5)  # the kept write's later events (modified, closed) too
        keys.seen.clear()
        (dropped / "z_tuned_gemm.csv").write_text("gfx\n")
        threading.Event().wait(0.5)  # time for an event that must not come
    assert [] == keys.seen, f"a dropped aiter folder still reports changes: {keys.seen}"


def test_an_aiter_folder_added_while_running_is_watched_at_once(tree: Path) -> None:
    """A tree added by a reload is watched right away, not at the next resync."""
    configs = tree / "aiter/configs"
    configs.mkdir(parents=True)
    keys = Keys()
    with _watcher(tree, keys) as watcher:
        watcher.set_aiter_dirs([configs])
        assert str(configs) in watcher.health().watched, "a new aiter folder waits for a resync"
        (configs / "x_tuned_gemm.csv").write_text("gfx\n")
        wait_until(lambda: Special.AITER in keys.seen, what="the new folder's event")


def test_changing_the_watched_folders_retries_a_failed_watch(tree: Path) -> None:
    """A watch that failed (EMFILE) is retried whenever the set of folders changes."""
    FailsOnce.failures = 0
    configs = tree / "aiter/configs"
    configs.mkdir(parents=True)
    with _watcher(tree, Keys(), observer_factory=FailsOnce) as watcher:
        assert "polling" == watcher.health().mode
        watcher.set_aiter_dirs([configs])
        assert ("inotify", {}) == (watcher.health().mode, watcher.health().failures)


def test_hal0_files_in_watched_folders_add_no_second_watch(tree: Path) -> None:
    """hal0 files whose folder is watched already (slots parent, /dev, the DRI folder) share
    that watch: every folder is watched once."""
    keys = Keys()
    with _watcher(tree, keys) as watcher:
        watcher.set_hal0_files(
            [tree / "etc/hal0.toml", tree / "dev/hal0.manifest", tree / "dev/dri/x.toml"]
        )
        watched = watcher.health().watched
        assert len(watched) == len(set(watched)), f"a folder is watched twice: {watched}"


def test_hal0_folders_follow_the_set_of_hal0_files(tree: Path) -> None:
    """set_hal0_files watches the folders of exactly the files given: a folder no longer needed
    is unwatched, a new one watched once, each file's change means everything."""
    ev = _events()
    old_dir, new_dir = tree / "usr/lib/hal0/current", tree / "opt/hal0"
    old_dir.mkdir(parents=True)
    new_dir.mkdir(parents=True)
    keys = Keys()
    before = logging.getLogger("watchdog.observers.inotify_c").handlers[:]
    observers = Observers()
    with _watcher(tree, keys, observer_factory=observers) as watcher:
        watcher.set_hal0_files([old_dir / "VERSION", new_dir / "VERSION"])
        assert str(old_dir) in watcher.health().watched
        watcher.set_hal0_files([new_dir / "VERSION", new_dir / "manifest.json"])
        watched = watcher.health().watched
        assert str(old_dir) not in watched, f"a folder no longer needed is watched: {watched}"
        assert 1 == watched.count(str(new_dir)), f"the new folder is not watched once: {watched}"
        assert str(tree / "etc/slots") in watched, "changing hal0 files dropped another watch"
        emitters = observers.made[0].emitters
        assert len(watched) == len(emitters), "an unwatched folder still holds an inotify watch"
        watcher.set_hal0_files([new_dir / "VERSION", new_dir / "manifest.json"])
        assert watched == watcher.health().watched, "an unchanged set changed the watches"
        mapped = watcher._keys.hal0_keys(ev.FileModifiedEvent(str(new_dir / "manifest.json")))
        assert [Special.EVERYTHING] == mapped
        assert [] == watcher._keys.hal0_keys(ev.FileModifiedEvent(str(old_dir / "VERSION")))
    after = logging.getLogger("watchdog.observers.inotify_c").handlers
    assert before == after, "the stopped watcher left its overflow handler on watchdog's logger"


def test_device_events_mean_a_re_probe_only_for_the_nodes(tree: Path) -> None:
    """/dev: the kfd node or the DRI folder appearing or going means re-probe (a re-created DRI
    folder is also re-watched); other nodes, reads, and other folders mean nothing. In the DRI
    folder any node's change means re-probe, the folder's own modification does not."""
    ev = _events()
    dev, dri = tree / "dev", tree / "dev/dri"
    opened = type("Opened", (ev.FileSystemEvent,), {"event_type": "opened"})
    watcher = _watcher(tree, Keys())
    assert [Special.HOST_FACTS] == watcher._keys.dev_keys(ev.FileCreatedEvent(str(dev / "kfd")))
    assert not watcher._keys.folder_changed.is_set(), "a new kfd node asked for a re-watch"
    assert [Special.HOST_FACTS] == watcher._keys.dev_keys(ev.DirCreatedEvent(str(dri)))
    assert watcher._keys.folder_changed.is_set(), "a re-created DRI folder is not re-watched"
    assert [] == watcher._keys.dev_keys(ev.FileCreatedEvent(str(dev / "null")))
    assert [] == watcher._keys.dev_keys(ev.FileCreatedEvent(str(tree / "elsewhere/kfd")))
    assert [] == watcher._keys.dev_keys(opened(str(dev / "kfd")))
    assert [Special.HOST_FACTS] == watcher._keys.dri_keys(
        ev.FileCreatedEvent(str(dri / "renderD128"))
    )
    assert [] == watcher._keys.dri_keys(ev.DirModifiedEvent(str(dri)))
    assert [] == watcher._keys.dri_keys(opened(str(dri / "renderD128")))


def test_reads_in_watched_folders_mean_nothing(tree: Path) -> None:
    """The daemon's own reads (opened, closed without writing) of hal0's files and aiter's
    tables never come back as work."""
    ev = _events()
    opened = type("Opened", (ev.FileSystemEvent,), {"event_type": "opened"})
    hal0_toml = tree / "etc/hal0.toml"
    watcher = _watcher(tree, Keys())
    watcher.set_hal0_files([hal0_toml])
    assert [] == watcher._keys.hal0_keys(opened(str(hal0_toml)))
    assert [] == watcher._keys.hal0_keys(ev.FileModifiedEvent(str(tree / "etc/other.toml")))
    assert [] == watcher._keys.aiter_keys(opened(str(tree / "aiter/configs/x.csv")))
    assert [Special.AITER] == watcher._keys.aiter_keys(ev.FileModifiedEvent(str(tree / "x.csv")))


def test_an_overflow_wakes_the_main_loop(tree: Path) -> None:
    """Lost events are acted on at once: the overflow warning wakes the main loop."""
    keys = Keys()
    with _watcher(tree, keys):
        wakes = keys.wakes
        logging.getLogger("watchdog.observers.inotify_c").warning("Inotify queue overflowed")
        assert keys.wakes > wakes, "an overflow did not wake the main loop"


class FailsSilently(Observer):  # type: ignore[misc, valid-type]
    """An observer whose schedule() fails with an OSError that carries no message."""

    def schedule(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError


def test_a_watch_failure_without_a_message_is_named_by_its_type(tree: Path) -> None:
    """health() names every failure: an OSError with no text is called "OSError"."""
    with _watcher(tree, Keys(), observer_factory=FailsSilently) as watcher:
        assert {"OSError"} == set(watcher.health().failures.values())


def test_changing_hal0_files_retries_a_failed_watch(tree: Path) -> None:
    """A watch that failed (EMFILE) is retried when the set of hal0 files changes too."""
    FailsOnce.failures = 0
    with _watcher(tree, Keys(), observer_factory=FailsOnce) as watcher:
        assert "polling" == watcher.health().mode
        watcher.set_hal0_files([tree / "opt/hal0/VERSION"])
        assert ("inotify", {}) == (watcher.health().mode, watcher.health().failures)
