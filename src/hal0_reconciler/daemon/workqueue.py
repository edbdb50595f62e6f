"""Keyed, level-triggered work queue with settle windows. No I/O, no watchdog; clock injected.

Events are hints: each one marks a key dirty. A key is ready when it has been quiet for
``settle`` seconds since its own last event, or when its first pending event is ``cap`` seconds
old (continuous churn cannot starve the worker). The worker takes every ready key at once, as
one batch; a key still changing stays dirty, so a file being written is never judged half
written, and a burst of new files does not wait for the whole burst to go quiet: the files
written first are worked on while the last ones arrive (each batch takes what settled while
the one before it ran, so batches grow with the burst). N events for one key before it is taken
are one unit of work. A key added while its batch is being processed stays dirty and is taken
again after ``done()`` (never processed twice at once).

A key given its own :class:`Window` (the aiter check: seconds, not milliseconds) settles on its
own clock; every other key shares the default window.

A slot file that is whole (renamed into place, closed after writing: :meth:`WorkQueue.add_complete`)
skips the settle window and is taken at once, unless a burst is pending (more than
:data:`BURST` keys: then batching is cheaper, and the settle window applies) or an event that may
still be followed by writes came for it after (a modify, a create). The batch names the keys it
took so (:attr:`Batch.prompt`): one that could not be read then is given back with
:meth:`WorkQueue.add_doubtful`, and waits one settle window (its writer may not be done after
all) before it is judged, and reported, again.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from hal0_reconciler.model import SlotKey

BURST = 8
"""More keys than this pending at once is a burst: a whole file waits the settle window too."""


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
    EVERYTHING = "<everything>"  # a full pass: fresh host facts, every slot, the aiter check
    AITER = "<aiter>"  # re-plan the aiter trees (and heal per settings)


WorkKey = SlotKey | Special
"""One unit of work: a slot file (its path), or a :class:`Special` key."""


class Closed(enum.Enum):
    """The typed stop sentinel ``WorkQueue.get`` returns once the queue is closed."""

    TOKEN = enum.auto()


@dataclass(frozen=True)
class Window:
    """A key waits ``settle`` s after its last event, at most ``cap`` s after its first."""

    settle: float
    cap: float

    def __post_init__(self) -> None:
        if self.settle < 0 or self.cap < self.settle:
            raise ValueError("need 0 <= settle <= cap")


class _Pending:
    """The dirty keys of one window: when each one's first and last pending events came, in
    that order (the front of each is the key to be ready first: no scan of every key)."""

    def __init__(self) -> None:
        self.first: OrderedDict[WorkKey, float] = OrderedDict()  # order of first events
        self.last: OrderedDict[WorkKey, float] = OrderedDict()  # order of last events
        self.now: set[WorkKey] = set()  # ready at once (``settled``): nothing is in flux

    def __bool__(self) -> bool:
        return bool(self.first)

    def __len__(self) -> int:
        return len(self.first)

    def oldest(self) -> float:
        return next(iter(self.first.values()))

    def add(self, key: WorkKey, now: float) -> None:
        if key in self.first:
            self.last.move_to_end(key)
        else:
            self.first[key] = now
        self.last[key] = now

    def ready_at(self, window: Window) -> float:
        if self.now:
            return float("-inf")
        return min(next(iter(self.last.values())) + window.settle, self.oldest() + window.cap)

    def take(self, window: Window, now: float) -> list[WorkKey]:
        """Remove and return the keys ready at ``now``."""
        taken = list(self.now)
        self.now.clear()
        for key in taken:
            del self.first[key], self.last[key]
        for order, other, wait in (
            (self.last, self.first, window.settle),
            (self.first, self.last, window.cap),
        ):
            while order and next(iter(order.values())) + wait <= now:
                key, _ = order.popitem(last=False)
                del other[key]
                taken.append(key)
        return taken

    def absorb(self, other: _Pending) -> None:
        """Take ``other``'s keys (each keeps its own times; the earlier first, the later last)."""
        firsts, lasts = dict(self.first), dict(self.last)
        for key, at in other.first.items():
            firsts[key] = min(at, firsts.get(key, at))
        for key, at in other.last.items():
            lasts[key] = max(at, lasts.get(key, at))
        self.first = OrderedDict(sorted(firsts.items(), key=lambda kv: kv[1]))
        self.last = OrderedDict(sorted(lasts.items(), key=lambda kv: kv[1]))
        self.now |= other.now


_DEFAULT: None = None  # the group of every key without a window of its own


@dataclass(frozen=True)
class Batch:
    """The keys taken together for one pass, with the number of events they absorbed."""

    keys: frozenset[WorkKey]
    events: int
    behind: int = 0  # keys still dirty when it was taken (more work is coming)
    prompt: frozenset[WorkKey] = frozenset()  # taken whole, without a settle window

    @property
    def everything(self) -> bool:
        return Special.EVERYTHING in self.keys

    @property
    def host_facts(self) -> bool:
        return Special.HOST_FACTS in self.keys or self.everything

    @property
    def aiter(self) -> bool:
        return Special.AITER in self.keys or self.everything

    @property
    def slots(self) -> tuple[SlotKey, ...]:
        return tuple(sorted(k for k in self.keys if not isinstance(k, Special)))


class WorkQueue:
    """Thread-safe; the pure decisions (``ready_at``, ``take``) take the time as an argument."""

    def __init__(
        self,
        *,
        settle: float,
        cap: float,
        clock: Clock,
        windows: Mapping[WorkKey, Window] | None = None,
    ) -> None:
        self._default = Window(settle, cap)
        self._windows = dict(windows or {})
        self._clock = clock
        self._groups: dict[WorkKey | None, _Pending] = {}
        self._processing: frozenset[WorkKey] = frozenset()
        self._prompt: set[WorkKey] = set()  # pending, taken at once: their files are whole
        self._doubtful: set[WorkKey] = set()  # pending for one settle window: not read whole
        self._events = 0
        self._closed = False
        self._cond = threading.Condition()

    def tune(
        self, *, settle: float, cap: float, windows: Mapping[WorkKey, Window] | None = None
    ) -> None:
        """New settle window and cap (a settings reload); ``windows`` replaces the per-key ones."""
        default = Window(settle, cap)
        with self._cond:
            self._default = default
            if windows is not None:
                self._windows = dict(windows)
                for key in [k for k in self._groups if k is not None and k not in self._windows]:
                    self._merge(self._groups.pop(key))  # no window of its own any more
            self._cond.notify_all()

    def _window(self, group: WorkKey | None) -> Window:
        return self._windows.get(group, self._default) if group is not None else self._default

    def _merge(self, pending: _Pending) -> None:
        self._groups.setdefault(_DEFAULT, _Pending()).absorb(pending)

    # -- producers -------------------------------------------------------------------------
    def add(self, key: WorkKey, *, settled: bool = False) -> None:
        """Mark ``key`` dirty (cheap, never blocks for long: safe from an event handler).

        ``settled``: nothing is in flux, take it (and its group) without a settle window (the
        daemon's first pass)."""
        self.add_many((key,), settled=settled)

    def add_many(self, keys: Iterable[WorkKey], *, settled: bool = False) -> None:
        self._add(keys, settled=settled)

    def add_complete(self, keys: Iterable[WorkKey]) -> None:
        """Mark ``keys`` dirty; a slot file among them is whole (renamed into place, closed
        after writing): taken at once, without a settle window, outside a burst."""
        self._add(keys, complete=True)

    def add_doubtful(self, keys: Iterable[WorkKey]) -> None:
        """Give back keys taken whole that could not be read: each waits one settle window
        (not taken at once for its next whole-file event), then is judged as usual."""
        self._add(keys, doubtful=True)

    def _add(
        self,
        keys: Iterable[WorkKey],
        *,
        settled: bool = False,
        complete: bool = False,
        doubtful: bool = False,
    ) -> None:
        now = self._clock.monotonic()
        with self._cond:
            added = False
            for key in keys:
                group = key if key in self._windows else _DEFAULT
                pending = self._groups.get(group)
                if pending is None:
                    pending = self._groups[group] = _Pending()
                pending.add(key, now)
                if settled:
                    pending.now.add(key)
                elif doubtful:
                    self._doubtful.add(key)
                    self._unprompt(pending, key)
                elif (
                    complete
                    and group is _DEFAULT
                    and not isinstance(key, Special)
                    and key not in self._doubtful
                    and len(pending) <= BURST
                ):
                    pending.now.add(key)
                    self._prompt.add(key)
                else:  # may still be written: the settle window again
                    self._unprompt(pending, key)
                self._events += 1
                added = True
            if added:
                self._cond.notify_all()

    def _unprompt(self, pending: _Pending, key: WorkKey) -> None:
        if key in self._prompt:
            self._prompt.discard(key)
            pending.now.discard(key)

    def close(self) -> None:
        """Wake every waiter; ``get`` returns ``Closed.TOKEN`` from now on."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- pure decisions ----------------------------------------------------------------------
    def ready_at(self) -> float | None:
        """When some pending keys may be taken (monotonic seconds), or None when nothing waits."""
        with self._cond:
            return self._ready_at_locked()

    def _ready_at_locked(self) -> float | None:
        times = [p.ready_at(self._window(g)) for g, p in self._groups.items()]
        return min(times) if times else None

    def take(self, now: float) -> Batch | None:
        """Move every dirty key that is ready at ``now`` to processing; else None.

        Keys that have not settled yet stay dirty. Returns None while the previous
        batch is still being processed (call ``done`` first).
        """
        with self._cond:
            return self._take_locked(now)

    def _take_locked(self, now: float) -> Batch | None:
        if self._processing:
            return None
        taken: list[WorkKey] = []
        for group, pending in list(self._groups.items()):
            taken += pending.take(self._window(group), now)
            if not pending:
                del self._groups[group]
        if not taken:
            return None
        keys = frozenset(taken)
        prompt = frozenset(k for k in taken if k in self._prompt)
        self._prompt.difference_update(taken)
        self._doubtful.difference_update(taken)
        if Special.EVERYTHING in keys:
            keys = frozenset({Special.EVERYTHING})  # a full pass covers every other ready key
            prompt = frozenset()
        behind = sum(len(p) for p in self._groups.values())
        batch = Batch(keys=keys, events=self._events, behind=behind, prompt=prompt)
        self._processing = keys
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
            return sum(len(p) for p in self._groups.values())

    def oldest_pending_age(self, now: float) -> float:
        """How long the oldest dirty key has waited (0.0 when none waits)."""
        with self._cond:
            firsts = [p.oldest() for p in self._groups.values()]
            return max(0.0, now - min(firsts)) if firsts else 0.0

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
