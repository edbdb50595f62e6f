"""The decisions of a careful restart, apart from any I/O.

Whether a slot may be restarted now (hal0's state and load counters), how a restart ended (hal0's
answer), whether an update job is in progress, and whether an operator set hal0's Vulkan opt-in.
Every fact here is from hal0's source (see the contract's "Restarting slots safely").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DISPATCHABLE = frozenset({"ready", "serving", "idle"})
SETTLED = frozenset({"ready", "idle"})  # dispatchable and not serving
ACTIVE_JOB_STATES = frozenset({"queued", "running"})
VULKAN_FALLBACK_VARIABLE = "HAL0_ALLOW_VULKAN_FALLBACK"


class Load(enum.StrEnum):
    """What hal0 says about a slot's load right now."""

    IDLE = "idle"  # settled and both counters present and 0
    BUSY = "busy"  # serving, a counter above 0, or not settled (starting, warming, ...)
    NO_COUNTERS = "no-counters"  # settled, but hal0 has no requests_deferred for it
    OFFLINE = "offline"  # nothing runs: the new label applies at the next load
    ERROR = "error"  # hal0 has it in error: a restart is how hal0 recovers it


@dataclass(frozen=True)
class LoadReading:
    load: Load
    state: str
    processing: int | None
    deferred: int | None

    def describe(self) -> str:
        counters = (
            "counters unavailable"
            if self.deferred is None
            else f"{self.processing} processing, {self.deferred} deferred"
        )
        return f"state {self.state}, {counters}"


def _count(row: Mapping[str, Any], key: str) -> int | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def judge_load(state: str, metrics_row: Mapping[str, Any] | None) -> LoadReading:
    """hal0's ``/state`` and its ``/api/slots/metrics`` row for one slot.

    ``requests_processing`` defaults to 0 in hal0 when the scrape fails, so only a present
    ``requests_deferred`` makes the counters count.
    """
    row = metrics_row or {}
    processing, deferred = _count(row, "requests_processing"), _count(row, "requests_deferred")
    if state == "offline":
        load = Load.OFFLINE
    elif state == "error":
        load = Load.ERROR
    elif state not in SETTLED:
        load = Load.BUSY
    elif deferred is None or processing is None:
        load = Load.NO_COUNTERS
    elif processing > 0 or deferred > 0:
        load = Load.BUSY
    else:
        load = Load.IDLE
    return LoadReading(load, state, processing, deferred)


class Outcome(enum.StrEnum):
    """How a restart ended, from hal0's answer (decisions-0.2, "Outcomes")."""

    DONE = "done"  # 200 ready/idle
    NEXT_LOAD = "next-load"  # 200 offline: nothing loaded, the label applies at the next load
    WARMING = "warming"  # 200 warming: not up within hal0's budget (failed; re-checked once)
    ERROR = "error"  # state error (a sanity failure included)
    HTTP_ERROR = "http-error"  # any 4xx/5xx


def judge_answer(state: str) -> Outcome:
    """A 200 answer's (or a later ``/state``'s) ``state``."""
    if state in SETTLED or state == "serving":
        return Outcome.DONE
    if state == "offline":
        return Outcome.NEXT_LOAD
    if state == "error":
        return Outcome.ERROR
    return Outcome.WARMING


def update_in_progress(job: Mapping[str, Any], *, age: float, max_age: float) -> bool:
    """One ``/var/lib/hal0/update-jobs/<id>.json``: queued or running, and not stale."""
    return str(job.get("state") or "") in ACTIVE_JOB_STATES and age <= max_age


def vulkan_fallback_allowed(environment: Mapping[str, str]) -> bool:
    """As hal0 reads it: exactly ``1``, ``true`` or ``yes`` after strip (case-sensitive)."""
    return environment.get(VULKAN_FALLBACK_VARIABLE, "").strip() in {"1", "true", "yes"}


def is_hands_off(hands_off: frozenset[str], *, name: str | None, slot_id: str | None) -> bool:
    """The operator's ``hands_off`` (normalised by the settings) names the slot, by display
    name or by id."""
    by_name = name is not None and name in hands_off
    return by_name or (slot_id is not None and slot_id in hands_off)
