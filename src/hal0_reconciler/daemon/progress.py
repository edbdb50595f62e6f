"""What the worker tells the main loop, under ``Passes.lock``: the :class:`Progress` record,
and the two small facts both sides derive from it (the lane as a metrics state, a slot file's
content digest)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hal0_reconciler.daemon import metrics
from hal0_reconciler.errors import ReconcilerError
from hal0_reconciler.model import HostFacts, LaneState, SlotKey
from hal0_reconciler.slots import store


def lane_metric_state(facts: HostFacts) -> str:
    """The ROCm lane as a metrics state: usable / unusable (within the grace too) / unknown
    (the probe could not run) / not-amd."""
    if not facts.amd:
        return "not-amd"
    if facts.lane is LaneState.USABLE:
        return "usable"
    return "unknown" if facts.lane is LaneState.UNKNOWN else "unusable"


def digest(path: Path) -> str | None:
    """The content digest of a regular slot file; None when it is gone or not a regular file
    (never opening a FIFO, which would block the worker for good, nor following a symlink)."""
    import hashlib  # noqa: PLC0415 - OpenSSL loads with the first fight, not before READY

    try:
        return hashlib.sha256(store.read_slot(path).data).hexdigest()
    except (OSError, ReconcilerError):
        return None


@dataclass
class Progress:
    """What the worker tells the main loop (under ``Passes.lock``)."""

    passes: int = 0
    full_passes: int = 0
    full_attempts: int = 0  # full passes finished or failed: READY=1 comes after the first
    failure: str | None = None  # why the last batch failed (None: it did not)
    batches: int = 0  # finished with everything recorded (pass, aiter check, problems, metrics)
    relabels_total: int = 0
    last_pass_at: float = 0.0  # wall clock
    last_full_pass: float | None = None  # monotonic
    last_duration: float = 0.0
    busy_since: float | None = None  # monotonic, while a batch is processed
    facts: HostFacts | None = None
    recheck_at: float | None = None
    slots: dict[SlotKey, dict[str, Any]] = field(default_factory=dict)
    metrics: metrics.Metrics = field(default_factory=metrics.Metrics)
    problems: dict[str, str] = field(default_factory=dict)
    hal0: dict[str, Any] | None = None  # what the installed hal0 believes (hal0.describe)
    revision: int = 0  # bumped when anything status.json or the metrics show changed
    # for status.json's cached fragments: the slots changed since it was last composed, or
    # every slot (a full pass replaced the mapping)
    slots_changed: set[SlotKey] = field(default_factory=set)
    slots_renewed: bool = True
