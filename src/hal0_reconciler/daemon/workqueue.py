"""Keyed, level-triggered work queue with a settle window. No I/O, no watchdog; clock injected.

Events are hints: each one marks a key dirty. The worker takes every dirty key at once, as one
batch, when the queue has been quiet for ``settle`` seconds since the last event, or when the
oldest pending event is ``cap`` seconds old (continuous churn cannot starve the worker). N events
for one key before it is taken are one unit of work. A key added while its batch is being
processed stays dirty and is taken again after ``done()`` (never processed twice at once).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from hal0_reconciler.model import SlotKey


class Clock(Protocol):
    """A monotonic clock in seconds. Tests inject a fake one."""

    def monotonic(self) -> float: ...


class SystemClock:
    """The real monotonic clock."""

    def monotonic(self) -> float:
        return time.monotonic()


class Special(enum.StrEnum):
    """Keys that are not one slot file."""

    HOST_FACTS = "<host-facts>"  # re-probe the host; reconcile everything when the lane changed
    EVERYTHING = "<everything>"  # a full pass: fresh host facts and every slot


WorkKey = SlotKey | Special
"""One unit of work: a slot file (its path), or a :class:`Special` key."""


class Closed(enum.Enum):
    """The typed stop sentinel ``WorkQueue.get`` returns once the queue is closed."""

    TOKEN = enum.auto()


@dataclass(frozen=True)
class Batch:
    """The keys taken together for one pass, with the number of events they absorbed."""

    keys: frozenset[WorkKey]
    events: int

    @property
    def everything(self) -> bool:
        return Special.EVERYTHING in self.keys

    @property
    def host_facts(self) -> bool:
        return Special.HOST_FACTS in self.keys or self.everything

    @property
    def slots(self) -> tuple[SlotKey, ...]:
        return tuple(sorted(k for k in self.keys if not isinstance(k, Special)))


class WorkQueue:
    """Thread-safe; the pure decisions (``ready_at``, ``take``) take the time as an argument."""

    def __init__(self, *, settle: float, cap: float, clock: Clock) -> None:
        if settle < 0 or cap < settle:
            raise ValueError("need 0 <= settle <= cap")
        self._settle = settle
        self._cap = cap
        self._clock = clock
        self._dirty: set[WorkKey] = set()
        self._processing: frozenset[WorkKey] = frozenset()
        self._first: float | None = None  # when the oldest pending event arrived
        self._last: float | None = None  # when the newest pending event arrived
        self._events = 0
        self._closed = False
        self._cond = threading.Condition()

    def tune(self, *, settle: float, cap: float) -> None:
        """New settle window and cap (a settings reload)."""
        if settle < 0 or cap < settle:
            raise ValueError("need 0 <= settle <= cap")
        with self._cond:
            self._settle = settle
            self._cap = cap
            self._cond.notify_all()

    # -- producers -------------------------------------------------------------------------
    def add(self, key: WorkKey) -> None:
        """Mark ``key`` dirty (cheap, never blocks for long: safe from an event handler)."""
        self.add_many((key,))

    def add_many(self, keys: Iterable[WorkKey]) -> None:
        now = self._clock.monotonic()
        with self._cond:
            added = False
            for key in keys:
                self._dirty.add(key)
                self._events += 1
                added = True
            if not added:
                return
            if self._first is None:
                self._first = now
            self._last = now
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiter; ``get`` returns ``Closed.TOKEN`` from now on."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- pure decisions ----------------------------------------------------------------------
    def ready_at(self) -> float | None:
        """When the pending keys may be taken (monotonic seconds), or None when nothing waits."""
        with self._cond:
            return self._ready_at_locked()

    def _ready_at_locked(self) -> float | None:
        if not self._dirty or self._first is None or self._last is None:
            return None
        return min(self._last + self._settle, self._first + self._cap)

    def take(self, now: float) -> Batch | None:
        """Move every dirty key to processing when they are ready at ``now``; else None.

        Returns None while the previous batch is still being processed (call ``done`` first).
        """
        with self._cond:
            return self._take_locked(now)

    def _take_locked(self, now: float) -> Batch | None:
        ready = self._ready_at_locked()
        if ready is None or now < ready or self._processing:
            return None
        keys = frozenset(self._dirty)
        if Special.EVERYTHING in keys:
            keys = frozenset({Special.EVERYTHING})  # a full pass covers every other key
        batch = Batch(keys=keys, events=self._events)
        self._processing = keys
        self._dirty.clear()
        self._first = self._last = None
        self._events = 0
        return batch

    def done(self, batch: Batch) -> None:
        """The batch is finished; keys re-added meanwhile stay dirty and are taken later."""
        with self._cond:
            if self._processing == batch.keys:
                self._processing = frozenset()
            self._cond.notify_all()

    # -- observers ---------------------------------------------------------------------------
    def pending(self) -> int:
        with self._cond:
            return len(self._dirty)

    def oldest_pending_age(self, now: float) -> float:
        """How long the oldest dirty key has waited (0.0 when none waits)."""
        with self._cond:
            return 0.0 if self._first is None else max(0.0, now - self._first)

    # -- the consumer's blocking wait ------------------------------------------------------------
    def get(self, *, timeout: float | None = None) -> Batch | Closed | None:
        """Block until a batch is ready (returns it), the queue closes, or ``timeout`` passes."""
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    return Closed.TOKEN
                now = self._clock.monotonic()
                batch = self._take_locked(now)
                if batch is not None:
                    return batch
                ready = self._ready_at_locked()
                wait_until = ready if not self._processing else None
                if deadline is not None:
                    if now >= deadline:
                        return None
                    wait_until = deadline if wait_until is None else min(wait_until, deadline)
                # With a fake clock time may not advance while we wait: bound each wait.
                self._cond.wait(None if wait_until is None else max(0.0, wait_until - now) + 0.001)
