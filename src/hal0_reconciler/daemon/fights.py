"""The daemon's memory of fights over a slot, and of the ROCm lane's demotion grace. Pure.

A *fight*: another writer keeps putting a slot back to the value the daemon just changed. Each
relabel of the same transition (old → new) inside ``window`` after the first one is a revert by
that writer; more than ``limit`` of them and the daemon stops fighting: the slot is *hands off*
until its file changes in some other way (its content is neither the daemon's nor the other
writer's version) or the daemon restarts. Kept in memory only, on purpose.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hal0_reconciler.daemon.workqueue import Clock
from hal0_reconciler.model import HostFacts, LaneState, SlotKey


@dataclass
class _Record:
    """One slot's recent relabels of one transition."""

    transition: tuple[str, str | None]
    times: deque[float] = field(default_factory=deque)
    versions: set[str] = field(default_factory=set)  # content digests seen around the fight


class FightDetector:
    def __init__(self, *, limit: int, window: float, clock: Clock) -> None:
        self._limit = limit
        self._window = window
        self._clock = clock
        self._records: dict[SlotKey, _Record] = {}
        self._hands_off: dict[SlotKey, frozenset[str]] = {}

    def tune(self, *, limit: int, window: float) -> None:
        self._limit = limit
        self._window = window

    def tracked_keys(self) -> frozenset[SlotKey]:
        """Slots with recent relabels: their content is worth fingerprinting before a pass
        (a hands-off slot is never relabelled, so its fingerprint would go unused)."""
        return frozenset(self._records)

    @property
    def hands_off(self) -> frozenset[SlotKey]:
        return frozenset(self._hands_off)

    def relabeled(
        self, key: SlotKey, *, old: str, new: str | None, before: str | None, after: str | None
    ) -> int | None:
        """Note one relabel. Returns the revert count when the slot just became hands off."""
        now = self._clock.monotonic()
        record = self._records.get(key)
        if record is None or record.transition != (old, new):
            record = self._records[key] = _Record((old, new))
        while record.times and now - record.times[0] > self._window:
            record.times.popleft()
        record.times.append(now)
        record.versions.update(d for d in (before, after) if d is not None)
        reverts = len(record.times) - 1
        if reverts > self._limit:
            self._hands_off[key] = frozenset(record.versions)
            del self._records[key]
            return reverts
        return None

    def still_fighting(self, key: SlotKey, digest: str | None) -> bool:
        """For a hands-off slot whose file changed: is it still one of the fought-over versions?"""
        versions = self._hands_off.get(key)
        return versions is not None and digest is not None and digest in versions

    def release(self, key: SlotKey) -> None:
        self._hands_off.pop(key, None)
        self._records.pop(key, None)

    forget = release


@dataclass(frozen=True)
class LaneView:
    """What the policy should see, and what changed."""

    facts: HostFacts
    changed: tuple[LaneState | None, LaneState] | None  # (old, new) of the effective lane
    recheck_at: float | None  # probe again then (during the grace)
    demotion_in: float | None = None  # seconds of the grace left (unusable, not yet demoting)


class LaneTracker:
    """Keeps an unusable lane UNSETTLED until it was unusable for ``grace`` s of probes."""

    RECHECK_EVERY = 5.0  # probe at least this often while the grace runs

    def __init__(self, *, grace: float, clock: Clock) -> None:
        self._grace = grace
        self._clock = clock
        self._unusable_since: float | None = None
        self._effective: LaneState | None = None

    def tune(self, *, grace: float) -> None:
        self._grace = grace

    def observe(self, raw: HostFacts) -> LaneView:
        now = self._clock.monotonic()
        recheck_at: float | None = None
        left: float | None = None
        lane = raw.lane
        if raw.lane is LaneState.USABLE:
            self._unusable_since = None
        elif raw.lane is LaneState.UNKNOWN:
            self._unusable_since = None  # no probe, no continuity: a later grace starts afresh
        else:
            if self._unusable_since is None:
                self._unusable_since = now
            expires = self._unusable_since + self._grace
            if raw.amd and now < expires:
                lane = LaneState.UNSETTLED
                recheck_at = min(expires, now + self.RECHECK_EVERY)
                left = expires - now
            else:
                lane = LaneState.UNUSABLE
        facts = raw if lane is raw.lane else HostFacts(amd=raw.amd, lane=lane, probe=raw.probe)
        old = self._effective
        self._effective = lane
        return LaneView(facts, None if old is lane else (old, lane), recheck_at, left)
