"""Whole files skip the settle window (a rename into place, a close after writing), except in a
burst; a whole file that could not be read waits one settle window before it is judged again."""

from __future__ import annotations

import threading

import pytest

from hal0_reconciler.daemon import workqueue
from hal0_reconciler.daemon.workqueue import Special, WorkQueue
from hal0_reconciler.model import SlotKey
from helpers.clock import FakeClock

A = SlotKey("/s/a.toml")
B = SlotKey("/s/b.toml")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def queue(clock: FakeClock) -> WorkQueue:
    return WorkQueue(settle=5.0, cap=30.0, clock=clock)  # a long window: nothing hides in it


def test_a_whole_file_is_taken_at_once_whatever_the_settle_window(
    queue: WorkQueue, clock: FakeClock
) -> None:
    queue.add_complete([A])
    assert queue.ready_at() == float("-inf")
    batch = queue.take(clock.now)
    assert batch is not None
    assert (A,) == batch.slots
    assert frozenset({A}) == batch.prompt


def test_a_modify_after_the_close_means_it_is_being_written_again(
    queue: WorkQueue, clock: FakeClock
) -> None:
    queue.add_complete([A])
    queue.add(A)  # reopened and written: wait for it to settle
    assert queue.take(clock.now) is None
    clock.now += 5.0
    batch = queue.take(clock.now)
    assert batch is not None
    assert (A,) == batch.slots
    assert frozenset() == batch.prompt


def test_a_modify_without_a_close_waits_the_settle_window(
    queue: WorkQueue, clock: FakeClock
) -> None:
    queue.add(A)
    clock.now += 4.9
    assert queue.take(clock.now) is None
    queue.add_complete([A])  # then the writer closed it
    batch = queue.take(clock.now)
    assert batch is not None
    assert (A,) == batch.slots


def test_more_than_eight_pending_is_a_burst_that_settles(
    queue: WorkQueue, clock: FakeClock
) -> None:
    keys = [SlotKey(f"/s/{i}.toml") for i in range(workqueue.BURST + 4)]
    queue.add_many(keys[: workqueue.BURST])  # pending, settling
    queue.add_complete([keys[workqueue.BURST]])  # the ninth pending: part of a burst
    assert queue.take(clock.now) is None
    clock.now += 5.0
    batch = queue.take(clock.now)
    assert batch is not None
    assert len(batch.slots) == workqueue.BURST + 1
    assert frozenset() == batch.prompt


def test_up_to_eight_pending_are_still_taken_at_once(queue: WorkQueue, clock: FakeClock) -> None:
    keys = [SlotKey(f"/s/{i}.toml") for i in range(workqueue.BURST)]
    for key in keys:
        queue.add_complete([key])
    batch = queue.take(clock.now)
    assert batch is not None
    assert frozenset(keys) == batch.prompt


def test_a_whole_file_found_unreadable_waits_one_settle_window(
    queue: WorkQueue, clock: FakeClock
) -> None:
    queue.add_complete([A])
    batch = queue.take(clock.now)
    assert batch is not None
    queue.add_doubtful([A])  # did not parse: its writer may not be done
    queue.done(batch)
    queue.add_complete([A])  # closed again: still not at once
    assert queue.take(clock.now) is None
    clock.now += 5.0
    again = queue.take(clock.now)
    assert again is not None
    assert (A,) == again.slots
    assert frozenset() == again.prompt  # judged as usual now: reported when still unreadable
    queue.done(again)
    queue.add_complete([A])  # the doubt ends with that look
    assert queue.take(clock.now) is not None


def test_special_keys_never_skip_their_window(queue: WorkQueue, clock: FakeClock) -> None:
    queue.add_complete([Special.AITER, B])
    batch = queue.take(clock.now)
    assert batch is not None
    assert frozenset({B}) == batch.keys
    clock.now += 5.0
    later = queue.take(clock.now)
    assert later is None  # the previous batch is still being processed
    queue.done(batch)
    later = queue.take(clock.now)
    assert later is not None
    assert later.aiter


def test_a_full_pass_takes_no_prompt_keys(queue: WorkQueue, clock: FakeClock) -> None:
    queue.add(Special.EVERYTHING, settled=True)
    queue.add_complete([A])
    batch = queue.take(clock.now)
    assert batch is not None
    assert batch.everything
    assert frozenset() == batch.prompt


def test_a_whole_file_given_back_before_it_was_taken_is_not_taken_at_once(
    queue: WorkQueue, clock: FakeClock
) -> None:
    queue.add_complete([A])
    queue.add_doubtful([A])
    assert queue.take(clock.now) is None
    clock.now += 5.0
    batch = queue.take(clock.now)
    assert batch is not None
    assert frozenset() == batch.prompt


def test_a_key_taken_whole_is_not_named_whole_in_a_later_batch(
    queue: WorkQueue, clock: FakeClock
) -> None:
    queue.add_complete([A])
    first = queue.take(clock.now)
    assert first is not None
    queue.done(first)
    queue.add(A, settled=True)  # the first pass's way: at once, but not a whole-file event
    second = queue.take(clock.now)
    assert second is not None
    assert frozenset() == second.prompt


def test_a_worker_waiting_without_a_timeout_is_woken_by_a_whole_file() -> None:
    real = WorkQueue(settle=30.0, cap=60.0, clock=workqueue.SystemClock())
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(real.get()), daemon=True)
    thread.start()
    try:
        threading.Event().wait(0.2)  # the worker is asleep in get() by then
        real.add_complete([A])
        thread.join(10)
        assert not thread.is_alive()
        batch = got[0]
        assert isinstance(batch, workqueue.Batch)
        assert (A,) == batch.slots
    finally:
        real.close()
        thread.join(10)
