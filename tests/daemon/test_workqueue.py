"""The keyed work queue: level-triggered, settled, capped, never two batches at once."""

from __future__ import annotations

import threading

import pytest

from hal0_reconciler.daemon.workqueue import Closed, Special, Window, WorkQueue
from hal0_reconciler.model import SlotKey
from helpers.clock import FakeClock

A = SlotKey("/s/a.toml")
B = SlotKey("/s/b.toml")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def queue(clock: FakeClock) -> WorkQueue:
    return WorkQueue(settle=0.2, cap=2.0, clock=clock)


def test_many_events_for_one_key_are_one_unit_of_work(queue: WorkQueue, clock: FakeClock) -> None:
    """N events for one key before it is taken give one key in one batch."""
    for _ in range(50):
        queue.add(A)
    clock.now += 0.2
    batch = queue.take(clock.now)
    assert batch is not None
    assert frozenset({A}) == batch.keys
    assert 50 == batch.events


def test_nothing_is_taken_inside_the_settle_window(queue: WorkQueue, clock: FakeClock) -> None:
    """A key is ready only 200 ms after its own last event."""
    queue.add(A)
    clock.now += 0.15
    queue.add(A)
    clock.now += 0.15
    assert queue.take(clock.now) is None
    clock.now += 0.05
    batch = queue.take(clock.now)
    assert batch is not None
    assert (A,) == batch.slots


def test_a_key_still_changing_stays_while_a_settled_one_is_taken(
    queue: WorkQueue, clock: FakeClock
) -> None:
    """A file written 200 ms ago is worked on while another is still being written: that one
    stays dirty until its own events have been quiet for the settle window."""
    queue.add(A)
    clock.now += 0.15
    queue.add(B)
    clock.now += 0.05
    batch = queue.take(clock.now)
    assert batch is not None
    assert ((A,), 1) == (batch.slots, queue.pending())
    queue.done(batch)
    clock.now += 0.1
    queue.add(B)  # still being written
    clock.now += 0.15
    assert queue.take(clock.now) is None, "a file still changing was taken"
    assert queue.ready_at() == pytest.approx(clock.now + 0.05)
    clock.now += 0.05
    batch = queue.take(clock.now)
    assert batch is not None
    assert (B,) == batch.slots


def test_a_key_touched_again_waits_behind_one_that_settled_meanwhile(
    queue: WorkQueue, clock: FakeClock
) -> None:
    """A, then B, then A again: B is ready first, 200 ms after its event, A 200 ms after its
    second one."""
    queue.add(A)
    clock.now += 0.05
    queue.add(B)
    clock.now += 0.05
    queue.add(A)
    assert queue.ready_at() == pytest.approx(clock.now + 0.15)
    clock.now += 0.15
    batch = queue.take(clock.now)
    assert batch is not None
    assert (B,) == batch.slots
    queue.done(batch)
    clock.now += 0.05
    batch = queue.take(clock.now)
    assert batch is not None
    assert (A,) == batch.slots


def test_a_batch_says_how_many_keys_were_still_dirty_behind_it(
    queue: WorkQueue, clock: FakeClock
) -> None:
    """``behind``: the keys left dirty when a batch was taken (the rest of a burst)."""
    queue.add(A)
    clock.now += 0.11
    queue.add_many([B, SlotKey("/s/c.toml")])
    clock.now += 0.1
    first = queue.take(clock.now)
    assert first is not None
    assert ((A,), 2) == (first.slots, first.behind)
    queue.done(first)
    clock.now += 0.15
    second = queue.take(clock.now)
    assert second is not None
    assert (2, 0) == (len(second.keys), second.behind)


def test_a_burst_is_taken_in_batches_of_what_settled(queue: WorkQueue, clock: FakeClock) -> None:
    """New files every 10 ms for a second: the first batch comes 200 ms after the first file,
    not 200 ms after the last; each later one takes every file that settled meanwhile; every
    file is taken once, each at least 200 ms after its event."""
    keys = [SlotKey(f"/s/{n:03}.toml") for n in range(100)]
    added: dict[SlotKey, float] = {}
    taken: dict[SlotKey, float] = {}
    batches: list[int] = []
    busy_until = 0.0  # the worker is busy 50 ms with each batch
    for step in range(200):
        if step < len(keys):
            queue.add(keys[step])
            added[keys[step]] = clock.now
        if clock.now >= busy_until:
            batch = queue.take(clock.now)
            if batch is not None:
                batches.append(len(batch.keys))
                taken.update(dict.fromkeys(batch.slots, clock.now))
                queue.done(batch)
                busy_until = clock.now + 0.05
        clock.now += 0.01
    assert set(keys) == set(taken), "a file of the burst was never taken"
    assert all(taken[k] - added[k] >= 0.2 - 1e-9 for k in keys), "a file taken unsettled"
    assert min(taken.values()) == pytest.approx(added[keys[0]] + 0.2)
    assert len(batches) < 30, f"{len(batches)} batches: not grouped"


def test_a_key_changing_for_good_is_capped_on_its_own(queue: WorkQueue, clock: FakeClock) -> None:
    """Churn on one key does not hold back another key that settled, and is itself taken
    2 s after its first event."""
    queue.add(B)
    taken: list[tuple[float, tuple[SlotKey, ...]]] = []
    for _ in range(25):
        queue.add(A)
        clock.now += 0.1
        batch = queue.take(clock.now)
        if batch is not None:
            taken.append((clock.now, batch.slots))
            queue.done(batch)
    assert [(B,), (A,)] == [slots for _, slots in taken]
    assert 100.0 + 0.2 == pytest.approx(taken[0][0], abs=0.11)
    assert 100.0 + 2.0 == pytest.approx(taken[1][0], abs=0.11)


def test_continuous_churn_is_capped(queue: WorkQueue, clock: FakeClock) -> None:
    """Events every 100 ms never settle, but the batch is taken 2 s after the first one."""
    taken = None
    for _ in range(40):
        queue.add(A)
        clock.now += 0.1
        taken = queue.take(clock.now)
        if taken is not None:
            break
    assert taken is not None
    assert 100.0 + 2.0 == pytest.approx(clock.now, abs=0.11)


def test_a_key_added_while_processing_comes_back_after_done(
    queue: WorkQueue, clock: FakeClock
) -> None:
    """A key re-added during its own processing is not taken twice at once, but is not lost."""
    queue.add(A)
    clock.now += 1
    first = queue.take(clock.now)
    assert first is not None
    queue.add(A)
    clock.now += 1
    assert queue.take(clock.now) is None
    queue.done(first)
    again = queue.take(clock.now)
    assert again is not None
    assert frozenset({A}) == again.keys


def test_everything_covers_every_other_key(queue: WorkQueue, clock: FakeClock) -> None:
    """A full pass in the batch absorbs slot and host-facts keys."""
    queue.add_many([A, Special.HOST_FACTS, Special.EVERYTHING, B])
    clock.now += 1
    batch = queue.take(clock.now)
    assert batch is not None
    assert frozenset({Special.EVERYTHING}) == batch.keys
    assert batch.host_facts


def test_get_returns_the_typed_sentinel_once_closed() -> None:
    """A blocked consumer wakes up with Closed.TOKEN when the queue closes."""
    queue = WorkQueue(settle=0.2, cap=2.0, clock=FakeClock())
    got: list[object] = []
    consumer = threading.Thread(target=lambda: got.append(queue.get(timeout=None)))
    consumer.start()
    queue.close()
    consumer.join(5)
    assert [Closed.TOKEN] == got


def test_settle_must_not_exceed_cap(clock: FakeClock) -> None:
    """A settle window longer than its cap is refused."""
    with pytest.raises(ValueError, match="settle"):
        WorkQueue(settle=3.0, cap=2.0, clock=clock)


AITER_WINDOW = {Special.AITER: Window(settle=2.0, cap=10.0)}


def test_a_key_with_its_own_window_settles_on_its_own(clock: FakeClock) -> None:
    """The aiter key waits its 2 s window; slot keys beside it are taken after their 0.2 s."""
    queue = WorkQueue(settle=0.2, cap=2.0, clock=clock, windows=AITER_WINDOW)
    queue.add_many([A, Special.AITER])
    clock.now += 0.2
    first = queue.take(clock.now)
    assert first is not None
    assert frozenset({A}) == first.keys
    queue.done(first)
    clock.now += 1.0
    assert queue.take(clock.now) is None
    clock.now += 0.8
    second = queue.take(clock.now)
    assert second is not None
    assert (frozenset({Special.AITER}), True) == (second.keys, second.aiter)


def test_churn_on_a_windowed_key_is_capped_by_its_own_cap(clock: FakeClock) -> None:
    """An aiter event every second never settles 2 s, but is taken 10 s after the first one."""
    queue = WorkQueue(settle=0.2, cap=2.0, clock=clock, windows=AITER_WINDOW)
    taken = None
    for _ in range(20):
        queue.add(Special.AITER)
        clock.now += 1.0
        taken = queue.take(clock.now)
        if taken is not None:
            break
    assert taken is not None
    assert 100.0 + 10.0 == pytest.approx(clock.now)


def test_a_full_pass_absorbs_a_settled_aiter_key_but_not_a_settling_one(
    clock: FakeClock,
) -> None:
    """EVERYTHING covers a ready aiter key; one still settling stays dirty for later."""
    queue = WorkQueue(settle=0.2, cap=2.0, clock=clock, windows=AITER_WINDOW)
    queue.add(Special.AITER)
    clock.now += 2.0
    queue.add(Special.EVERYTHING)
    clock.now += 0.2
    batch = queue.take(clock.now)
    assert batch is not None
    assert (frozenset({Special.EVERYTHING}), True, 0) == (batch.keys, batch.aiter, queue.pending())
    queue.done(batch)
    queue.add_many([Special.EVERYTHING, Special.AITER])
    clock.now += 0.2
    batch = queue.take(clock.now)
    assert batch is not None
    assert (frozenset({Special.EVERYTHING}), 1) == (batch.keys, queue.pending())


def test_retuning_without_a_window_merges_the_key_into_the_default(clock: FakeClock) -> None:
    """A reload that drops the aiter window: its pending key follows the default window."""
    queue = WorkQueue(settle=0.2, cap=2.0, clock=clock, windows=AITER_WINDOW)
    queue.add(Special.AITER)
    queue.tune(settle=0.2, cap=2.0, windows={})
    clock.now += 0.2
    batch = queue.take(clock.now)
    assert batch is not None
    assert frozenset({Special.AITER}) == batch.keys
