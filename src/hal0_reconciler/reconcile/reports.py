"""The report memory: one event per decision that matters, and a file's problem said once
(again when it changes, or after the file was fine in between), not on every pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal0_reconciler._log import get_logger
from hal0_reconciler.model import Reason, SlotKey
from hal0_reconciler.reconcile.outcome import Outcome, OutcomeStatus

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, KeysView

    from hal0_reconciler.model import HostFacts

_log = get_logger("hal0_reconciler.reconcile")


class ReportMemory:
    """What was already said about which slot file."""

    def __init__(self, *, stopping: Callable[[], bool] | None = None) -> None:
        """``stopping``: true once the daemon stops (a write cut short is then no error)."""
        self._stopping = stopping
        self._reported: dict[SlotKey, tuple[object, ...]] = {}  # the problem last said
        self._unit_reported: dict[SlotKey, str] = {}  # the unit problem last said
        self._reported_outcome: dict[SlotKey, Outcome] = {}  # the outcome last reported

    def keys(self) -> KeysView[SlotKey]:
        """The files something is remembered of."""
        return self._reported_outcome.keys()

    def forget(self, key: SlotKey) -> None:
        """A slot file went away: forget what was reported about it."""
        self._reported.pop(key, None)
        self._unit_reported.pop(key, None)
        self._reported_outcome.pop(key, None)

    def report_new(self, outcomes: Iterable[Outcome], facts: HostFacts) -> None:
        """Say what these outcomes mean, each outcome once (one from the memory was said)."""
        for outcome in outcomes:
            if self._reported_outcome.get(outcome.key) is not outcome:  # said already
                self._report(outcome, facts)
                if outcome.status is not OutcomeStatus.GONE:  # nothing of it is kept
                    self._reported_outcome[outcome.key] = outcome

    def _report_unit_problem(self, o: Outcome) -> None:
        """A name or id hal0 could not run: said once per file (again when it changes)."""
        if o.unit_problem is None or o.status is OutcomeStatus.GONE:
            self._unit_reported.pop(o.key, None)
            return
        if self._unit_reported.get(o.key) == o.unit_problem:
            return
        self._unit_reported[o.key] = o.unit_problem
        _log.warning(
            "slot.name_invalid",
            slot=o.name,
            path=str(o.path),
            reason=o.unit_problem,
            effect="hal0 cannot run this slot; it is never named to systemctl or the API",
        )

    def _report(self, o: Outcome, facts: HostFacts) -> None:
        """Log one event per decision that matters; problems only when they first appear."""
        self._report_unit_problem(o)
        fields = {"slot": o.name, "path": str(o.path)}
        if o.status is OutcomeStatus.RELABELED and o.verdict is not None:
            self._reported.pop(o.key, None)
            v = o.verdict
            change = {"old": v.old, "new": v.new, "reason": v.reason.value}
            if v.reason is Reason.NOT_CAPABLE_ROCM_UNUSABLE:
                _log.warning(
                    "slot.demoted_to_cpu",
                    **fields,
                    **change,
                    behaviour_change="the slot leaves the GPU and runs on the CPU, much slower",
                    rocm_lane=facts.lane_reason,
                )
            elif v.reason is Reason.RESTORE_OWN_DEMOTION:
                _log.info("slot.restored_to_rocm", **fields, **change)
            else:
                _log.info("slot.relabeled", **fields, **change)
            if o.message is not None:
                _log.warning("slot.comments_lost", **fields, reason=o.message)
            return
        if o.status is OutcomeStatus.WRITE_FAILED:
            if self._stopping is not None and self._stopping():  # an orderly stop, not an error
                _log.info("slot.write_abandoned", **fields, reason="stopping", error=o.message)
            else:
                _log.error("slot.write_failed", **fields, error=o.message)
            return
        self._report_problem(o, fields)

    def _report_problem(self, o: Outcome, fields: dict[str, str | None]) -> None:
        """An unreadable file, not a regular file, or an unresolved runtime: said when it first
        appears; a file without one forgets the last."""
        problem: tuple[object, ...] | None = None
        if o.status in (OutcomeStatus.UNREADABLE, OutcomeStatus.NOT_REGULAR):
            problem = (o.status, o.message)
        elif o.status is OutcomeStatus.SKIPPED:
            problem = (o.status, o.name)
        if problem is None:
            self._reported.pop(o.key, None)
            return
        if self._reported.get(o.key) == problem:
            return
        self._reported[o.key] = problem
        if o.status is OutcomeStatus.UNREADABLE:
            _log.error("slot.unreadable", path=str(o.path), error=o.message)
        elif o.status is OutcomeStatus.NOT_REGULAR:
            _log.warning("slot.not_regular_file", path=str(o.path), error=o.message)
        else:
            _log.warning(
                "slot.runtime_unresolved",
                **fields,
                reason="the profile's runtime family is unknown or the profile cannot be read",
            )
