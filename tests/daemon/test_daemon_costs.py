"""The daemon's costs as behaviour: READY's first pass does not wait for a settle window; a
batch that changed nothing (the echo of its own write) rewrites neither status.json nor the
metrics; status.json re-renders only the slot entries that changed; the start runs without the
cyclic garbage collector, which is on again (and has collected) once READY is out."""

from __future__ import annotations

import gc
import inspect
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from hal0_reconciler import reconcile
from hal0_reconciler.daemon import memory, notify, statusjson
from hal0_reconciler.daemon.workqueue import Special, WorkQueue
from hal0_reconciler.host.restarts import label_check
from hal0_reconciler.model import SlotKey
from helpers.daemon_host import Host, drop_slot, running, wait_until


class _Clock:
    now = 50.0

    def monotonic(self) -> float:
        return self.now


def test_a_settled_key_is_taken_at_once() -> None:
    clock = _Clock()
    queue = WorkQueue(settle=0.2, cap=2.0, clock=clock)
    queue.add(Special.EVERYTHING, settled=True)
    batch = queue.take(clock.now)
    assert batch is not None
    assert batch.everything
    queue.done(batch)
    queue.add(SlotKey("/s/a.toml"))  # an ordinary event still settles
    assert queue.take(clock.now) is None


def test_status_fragments_render_only_what_changed() -> None:
    slots = {SlotKey(f"/s/{n}.toml"): {"status": "unchanged", "name": str(n)} for n in range(3)}
    renderer = statusjson.SlotsJson()
    first = renderer.render(slots)
    assert {f"{n}.toml": slots[SlotKey(f"/s/{n}.toml")] for n in range(3)} == json.loads(
        first.joined()
    )
    changed = SlotKey("/s/1.toml")
    slots[changed] = {"status": "relabeled", "name": "1"}
    cache = renderer._cache
    kept = {k: v[1] for k, v in cache.items()}
    second = renderer.render(slots)
    assert "relabeled" == json.loads(second.joined())["1.toml"]["status"]
    again = renderer._cache
    assert all(again[k][1] is kept[k] for k in slots if k != changed)  # the same strings
    snapshot = {"b": 1, "slots": second, "a": [1, "x"], "0": statusjson.Raw(b'{"z": "\xc3\xa9"}')}
    text = b"".join(statusjson.dumps(snapshot))
    assert {
        "0": {"z": "é"},
        "a": [1, "x"],
        "b": 1,
        "slots": json.loads(second.joined()),
    } == json.loads(text)
    assert {} == json.loads(b"".join(statusjson.dumps({"slots": renderer.render({})})))["slots"]


def test_the_echo_of_its_own_write_rewrites_no_status(host: Host, notify_socket) -> None:
    prom = host.root / "metrics/hal0.prom"
    settings = host.settings(metrics_textfile=str(prom))
    status_file = Path(settings.runtime_dir) / "status.json"
    with running(settings) as daemon:
        notify_socket.wait_for("READY=1")
        target = drop_slot(host.slots, "agent")

        def shown() -> dict[str, str]:
            try:
                return dict(json.loads(status_file.read_text())["slots"]["agent.toml"])
            except (OSError, ValueError, KeyError):
                return {}

        wait_until(lambda: shown().get("status") == "relabeled", what="the relabel shown")
        ident = (status_file.stat().st_ino, prom.stat().st_ino)
        # the first full pass, the relabel's batch, then the echo of the daemon's own write
        wait_until(lambda: daemon.stats().passes >= 3, what="the echo's pass")
        time.sleep(0.3)
        assert ident == (status_file.stat().st_ino, prom.stat().st_ino)
        assert ("relabeled", "gpu-rocm") == (shown()["status"], shown()["device"])  # the news
        passes = daemon.stats().passes
        same = target.read_bytes()
        tmp = target.with_name(".agent.toml.new")
        tmp.write_bytes(same)  # a save of the same bytes: a pass that changes nothing
        tmp.rename(target)
        wait_until(lambda: daemon.stats().passes > passes, what="a pass for the save")
        time.sleep(0.3)
        assert ident == (status_file.stat().st_ino, prom.stat().st_ino)
        assert "relabeled" == shown()["status"]


def test_reads_of_watched_files_are_left_out_of_the_inotify_mask() -> None:
    """A process that only reads slot files (hal0 does, often) costs the daemon nothing where
    watchdog can filter (>= 5); an observer without ``event_filter`` is called as before."""
    from watchdog import events
    from watchdog.observers import Observer

    from hal0_reconciler.daemon import watch

    kinds = set(watch._filtered(Observer).get("event_filter", ()))
    if not kinds:
        assert "event_filter" not in str(inspect.signature(Observer.schedule))
        return
    assert not kinds & {events.FileOpenedEvent, events.FileClosedNoWriteEvent}
    wanted = {
        events.FileCreatedEvent,
        events.FileModifiedEvent,
        events.FileClosedEvent,
        events.FileDeletedEvent,
        events.FileMovedEvent,
        events.DirCreatedEvent,
        events.DirDeletedEvent,
        events.DirMovedEvent,
    }
    assert wanted <= kinds

    class Old:
        def schedule(self, handler: object, path: str, *, recursive: bool = False) -> None: ...

    assert {} == watch._filtered(Old())


def test_incremental_status_fragments_match_a_full_render() -> None:
    """Told which slots changed, the renderer touches only those, and shows what a renderer
    looking at every slot shows."""
    slots = {SlotKey(f"/s/{n}.toml"): {"status": "unchanged", "n": n} for n in range(5)}
    incremental = statusjson.SlotsJson()
    incremental.render(slots)
    steps = [
        ("/s/1.toml", {"status": "relabeled", "n": 1}),
        ("/s/9.toml", {"status": "unreadable", "n": 9}),  # a new file
        ("/s/3.toml", None),  # gone
    ]
    for key, entry in steps:
        if entry is None:
            del slots[SlotKey(key)]
        else:
            slots[SlotKey(key)] = entry
        shown = json.loads(incremental.render(slots, changed={SlotKey(key)}).joined())
        assert json.loads(statusjson.SlotsJson().render(slots).joined()) == shown
    stale = json.loads(incremental.render(slots, changed=set()).joined())  # nothing said to change
    assert {f"{n}.toml" for n in (0, 1, 2, 4, 9)} == set(stale)


def test_a_changed_slot_joins_its_block_again_not_the_others() -> None:
    """Past a block of fragments, one changed slot costs one block's join; the document is
    still every slot, and it is written in those pieces (never one big buffer)."""
    slots = {SlotKey(f"/s/{n}.toml"): {"status": "unchanged", "n": n} for n in range(10)}
    renderer = statusjson.SlotsJson(block=4)
    first = renderer.render(slots)
    assert 2 + 3 == len(first)  # the brace, three blocks (4, 4, 2 slots), the closing brace
    slots[SlotKey("/s/5.toml")] = {"status": "relabeled", "n": 5}
    second = renderer.render(slots, changed={SlotKey("/s/5.toml")})
    assert [True, False, True] == [a is b for a, b in zip(first[1:4], second[1:4], strict=True)]
    assert json.loads(statusjson.SlotsJson().render(slots).joined()) == json.loads(second.joined())
    again = renderer.render(slots)  # a full pass: the same objects keep their blocks
    assert all(a is b for a, b in zip(second, again, strict=True))
    pieces = statusjson.dumps({"schema": 1, "slots": again})
    assert all(block in pieces for block in again)
    assert 10 == len(json.loads(b"".join(pieces))["slots"])
    for n in (9, 8, 7, 6, 5):  # slots go: the blocks shrink with them, no empty one is kept
        del slots[SlotKey(f"/s/{n}.toml")]
        fewer = renderer.render(slots, changed={SlotKey(f"/s/{n}.toml")})
        assert 2 + -(-len(slots) // 4) == len(fewer)
        assert json.loads(statusjson.SlotsJson().render(slots).joined()) == json.loads(
            fewer.joined()
        )


def test_the_status_document_is_indented_and_sorted() -> None:
    """Around the slots' fragments, status.json is ``json.dumps(indent=1, sort_keys=True)``."""
    snapshot = {"b": {"y": 1, "x": [1, 2]}, "a": None, "slots": statusjson.Raw(b"{}")}
    plain = {"b": {"y": 1, "x": [1, 2]}, "a": None, "slots": {}}
    expected = json.dumps(plain, indent=1, sort_keys=True).encode()
    assert expected == b"".join(statusjson.dumps(snapshot))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["unchanged", "relabeled", None]))))
def test_any_sequence_of_slot_changes_renders_like_a_full_render(
    steps: list[tuple[int, str | None]],
) -> None:
    slots: dict[SlotKey, dict[str, object]] = {
        SlotKey(f"/s/{n}.toml"): {"status": "unchanged"} for n in range(3)
    }
    incremental = statusjson.SlotsJson(block=2)  # several blocks, a last one part-filled
    incremental.render(slots)
    for n, status in steps:
        key = SlotKey(f"/s/{n}.toml")
        if status is None:
            slots.pop(key, None)
        else:
            slots[key] = {"status": status}
        if status == "relabeled" and len(slots) % 3 == 0:  # now and then a full pass
            shown = json.loads(incremental.render(slots).joined())
        else:
            shown = json.loads(incremental.render(slots, changed={key}).joined())
        assert json.loads(statusjson.SlotsJson().render(slots).joined()) == shown


class _Recorded:
    """The environment's notifier, noting READY=1 in a shared list of events."""

    def __init__(self, events: list[str]) -> None:
        self._real = notify.from_environment()
        self._events = events

    def ready(self) -> None:
        self._events.append("ready")
        self._real.ready()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_the_start_runs_without_the_collector_and_collects_after_ready(
    host: Host, notify_socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first pass (here over BIG_BATCH slot files: its garbage is released) runs with the
    cyclic collector off; READY=1 goes out before any full collection; then the collector is
    on again and a full collection has run."""
    for n in range(memory.BIG_BATCH + 10):
        drop_slot(host.slots, f"s{n}", device="gpu-rocm", port=9000 + n)
    during_pass: list[bool] = []
    real_reconcile = reconcile.Reconciler.reconcile

    def spy(self: reconcile.Reconciler, *args: Any, **kwargs: Any) -> reconcile.PassReport:
        during_pass.append(gc.isenabled())
        return real_reconcile(self, *args, **kwargs)

    monkeypatch.setattr(reconcile.Reconciler, "reconcile", spy)
    events: list[str] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            events.append("full collection")

    gc.callbacks.append(on_gc)
    try:
        with running(host.settings(), notifier=_Recorded(events)):
            notify_socket.wait_for("READY=1")
            wait_until(gc.isenabled, what="the collector on again after READY")
            wait_until(lambda: "full collection" in events, what="a full collection")
    finally:
        gc.callbacks.remove(on_gc)
        gc.enable()
    assert [False] == during_pass[:1]
    assert "ready" == events[0]


def test_only_the_very_outcomes_shown_make_a_pass_that_changed_nothing() -> None:
    """The full pass's shortcut (nothing to fold into the status) needs the very same objects,
    all of them: an equal outcome made anew, or a pass cut short by a stop, is not it."""
    from hal0_reconciler.daemon import bookkeeping

    a, b = ["unchanged"], ["unchanged"]
    assert bookkeeping.same_objects((a, b), (a, b))
    assert not bookkeeping.same_objects((a, list(b)), (a, b))  # equal, but made anew
    assert not bookkeeping.same_objects((a,), (a, b))  # stopped half-way
    assert not bookkeeping.same_objects((a, b), (a,))


def test_a_pass_remembers_all_its_relabels_in_one_write(host: Host, notify_socket) -> None:
    """The relabels of one pass are remembered as the daemon's own ("label not applied") in one
    write of the memory, not one write per relabel (a burst of 1,000 saves paid 1,000 rewrites
    of a growing file, each fsynced); every relabel is in it."""
    settings = host.settings()
    state = Path(settings.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    names = [f"s{n:02d}" for n in range(20)]
    for name in names:
        drop_slot(host.slots, name)  # all there before the start: one pass relabels them all
    memory_file = state / label_check.MEMORY_FILE
    writes: list[str] = []

    class Count(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            dest = str(getattr(event, "dest_path", "") or "")
            if event.event_type == "moved" and dest == str(memory_file):
                writes.append(dest)

    observer = Observer(timeout=0.1)
    observer.schedule(Count(), str(state))
    observer.start()
    try:
        with running(settings):
            notify_socket.wait_for("READY=1")
            wait_until(memory_file.exists, what="the memory written")
            time.sleep(0.5)  # any later write would come with the next passes
        remembered = json.loads(memory_file.read_text())["written"]
    finally:
        observer.stop()
        observer.join(10)
    assert dict.fromkeys(names, "gpu-rocm") == remembered
    assert 1 == len(writes), writes
