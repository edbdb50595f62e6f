"""Folding one pass into the progress the main loop shows: each outcome's status entry (the
same object for the same outcome as last time), the slots shown, the counters and metrics of
the pass, and the relabels handed to the fight detector and the restarter. Worker thread."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable
from typing import Any

from hal0_reconciler import _log, reconcile
from hal0_reconciler.daemon import fights, labels, workqueue
from hal0_reconciler.daemon.progress import Progress, digest, lane_metric_state
from hal0_reconciler.host.restarts import units
from hal0_reconciler.model import HostFacts, LaneState, Reason, SlotKey

log = _log.get_logger("hal0_reconciler.daemon")
UNJUDGED = frozenset(
    {reconcile.OutcomeStatus.UNREADABLE.value, reconcile.OutcomeStatus.NOT_REGULAR.value}
)
"""Slot files that cannot be judged (refused by path: not valid TOML, too large, a bad name,
not a regular file): each makes the daemon degraded (``health.unjudged``)."""


class Bookkeeping:
    """Keeps, per slot, the last outcome and its entry, and the full pass the progress shows."""

    def __init__(
        self,
        *,
        lock: threading.RLock,
        progress: Progress,
        fights_: fights.FightDetector,
        restarter: units.Restarter,
        labels_: labels.LabelWatch,
        clock: workqueue.Clock,
        write_failures: Callable[[reconcile.PassReport], None],
    ) -> None:
        self.lock = lock
        self.progress = progress
        self.fights = fights_
        self._restarter = restarter
        self._labels = labels_
        self._clock = clock
        self._note_write_failures = write_failures  # the "writes" problem, from the same pass
        # per slot: the last outcome and the status entry made of it (same outcome, same entry)
        self.entries: dict[SlotKey, tuple[reconcile.Outcome, dict[str, Any]]] = {}
        # the outcomes of the full pass the progress shows, while no other pass came since: a
        # full pass with the very same outcomes (every file unchanged) changes nothing shown
        self._shown_full: tuple[reconcile.Outcome, ...] | None = None

    def _operators(self, slots: dict[SlotKey, dict[str, Any]]) -> int:
        """Shown slots whose last outcome the operator's ``hands_off`` holds back."""
        held = (self.entries.get(key) for key in slots)
        return sum(e is not None and e[0].hold is reconcile.Hold.OPERATOR for e in held)

    def absorb(
        self,
        report: reconcile.PassReport,
        *,
        facts: HostFacts,
        full: bool,
        before: dict[SlotKey, str | None],
    ) -> int:
        """Fold a pass into the progress; returns how many of its outcomes are new (not the very
        outcome an unchanged file had last time): what the pass did, beyond looking."""
        shown, self._shown_full = self._shown_full, None
        outcomes = report.outcomes
        # every file as it was: the same outcome objects as the full pass shown (so none is a
        # relabel, a failure or gone: those are made anew each time), nothing to fold in
        same = full and shown is not None and same_objects(outcomes, shown)
        relabeled: tuple[reconcile.Outcome, ...] = () if same else report.relabeled
        fresh = 0
        if not same:
            seen, fresh = self._status_entries(report, full=full, before=before)
            self._restart(relabeled)
            self._note_write_failures(report)
        now_wall = time.time()
        with self.lock:
            p = self.progress
            changed = False if same else _merge_slots(p, seen, outcomes, full=full)
            p.passes += 1
            p.full_passes += int(full)
            p.relabels_total += len(relabeled)
            p.last_pass_at = now_wall
            p.last_duration = report.duration
            if full:
                p.last_full_pass = self._clock.monotonic()
            m = p.metrics
            m.passes = p.passes
            for o in relabeled:
                target = o.verdict.new if o.verdict is not None and o.verdict.new else "?"
                m.relabels[target] = m.relabels.get(target, 0) + 1
                reason = o.verdict.reason if o.verdict is not None else None
                m.demotions += reason is Reason.NOT_CAPABLE_ROCM_UNUSABLE
                m.restores += reason is Reason.RESTORE_OWN_DEMOTION
            hands_off = {
                "fight": len(self.fights.hands_off),
                "operator": m.hands_off.get("operator", 0),
            }
            if not same:  # the operator's hands_off: the shown slots' outcomes held by it
                hands_off["operator"] = self._operators(p.slots)
            changed = changed or bool(relabeled) or m.hands_off != hands_off
            m.slots = len(p.slots)
            m.hands_off = hands_off
            m.pass_duration = report.duration
            m.last_pass_timestamp = now_wall
            m.rocm_lane_usable = facts.amd and facts.lane is LaneState.USABLE
            m.rocm_lane = lane_metric_state(facts)
            if changed:
                p.revision += 1
        if full:
            self._shown_full = outcomes
        return fresh

    def _status_entries(
        self, report: reconcile.PassReport, *, full: bool, before: dict[SlotKey, str | None]
    ) -> tuple[dict[SlotKey, dict[str, Any]], int]:
        """Each outcome's status entry (the same object for the same outcome as last time), and
        how many outcomes are new; a relabel goes to the fight detector."""
        statuses = reconcile.OutcomeStatus
        seen: dict[SlotKey, dict[str, Any]] = {}
        made = self.entries if not full else {}  # an unchanged file's outcome is the same object
        fresh = 0
        for o in report.outcomes:
            if o.status is statuses.GONE:
                self.fights.forget(o.key)
                made.pop(o.key, None)
                fresh += 1
                continue
            cached = self.entries.get(o.key)
            if cached is not None and cached[0] is o:
                seen[o.key] = cached[1]
                made[o.key] = cached
                continue
            fresh += 1
            entry = _entry(o)
            seen[o.key] = entry
            made[o.key] = (o, entry)
            if o.status is statuses.RELABELED and o.verdict is not None:
                self._relabeled(o, before.get(o.key))
        self.entries = made
        return seen, fresh

    def _restart(self, relabeled: tuple[reconcile.Outcome, ...]) -> None:
        """The pass's relabels remembered as this daemon's own (one write of the memory for the
        pass), then their restarts asked for."""
        noted: list[tuple[str, str]] = []
        requests: list[units.RestartRequest] = []
        for o in relabeled:
            if o.verdict is None or o.name is None or o.token is None:
                continue
            if o.verdict.new is not None:
                noted.append((o.token, o.verdict.new))
            requests.append(units.RestartRequest(name=o.name, token=o.token))
        self._labels.note_relabeled(noted)
        for request in requests:
            self._restarter.submit(request)

    def _relabeled(self, o: reconcile.Outcome, before: str | None) -> None:
        assert o.verdict is not None  # noqa: S101 - checked by the caller
        reverts = self.fights.relabeled(
            o.key, old=o.verdict.old, new=o.verdict.new, before=before, after=digest(o.path)
        )
        if reverts is not None:
            with self.lock:
                self.progress.metrics.fights += 1
            log.error(
                "slot.fight_detected",
                slot=o.name,
                path=str(o.path),
                reverts=reverts,
                value=o.verdict.new,
                action="another writer keeps reverting this slot: left alone until its file "
                "changes otherwise or the daemon restarts",
            )


def same_objects(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """``a`` and ``b`` hold the very same objects, in order (not only equal ones)."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _merge_slots(
    p: Progress,
    seen: dict[SlotKey, dict[str, Any]],
    outcomes: tuple[reconcile.Outcome, ...],
    *,
    full: bool,
) -> bool:
    """Fold a pass's entries into ``p.slots`` (and the unreadable count); True when anything
    shown changed. A partial pass updates the slots it covered in place (its cost is what it
    covered); an entry equal to the one shown keeps its identity, so status.json re-renders
    only the entries that changed."""
    statuses = reconcile.OutcomeStatus
    unjudged = UNJUDGED  # counted in unreadable_files: the daemon is degraded while any is
    old = p.slots
    slots: dict[SlotKey, dict[str, Any]] = {} if full else old
    changed = full and old.keys() != seen.keys()
    touched = p.slots_changed
    p.slots_renewed = p.slots_renewed or full
    for o in outcomes:
        if o.status is statuses.GONE and o.key in slots:
            changed = True
            touched.add(o.key)
            if slots.pop(o.key)["status"] in unjudged:
                p.metrics.unreadable_files -= 1
    for key, entry in seen.items():
        shown = old.get(key)
        if shown is entry:  # the same outcome as shown: nothing to compare
            slots[key] = entry
            continue
        prior = slots.get(key)  # what a partial pass keeps of a hands-off slot
        if entry["status"] == statuses.HANDS_OFF.value and prior is not None:
            entry = {**prior, "status": entry["status"], "message": entry.get("message")}  # noqa: PLW2901 - kept as shown
        if shown is entry or shown == entry or (shown is not None and _echo(shown, entry)):
            slots[key] = shown
            continue
        changed = True
        touched.add(key)
        if not full:
            if shown is not None and shown["status"] in unjudged:
                p.metrics.unreadable_files -= 1
            if entry["status"] in unjudged:
                p.metrics.unreadable_files += 1
        slots[key] = entry
    p.slots = slots
    if full:
        p.metrics.unreadable_files = sum(1 for e in slots.values() if e["status"] in unjudged)
    return changed


def _echo(shown: dict[str, Any], entry: dict[str, Any]) -> bool:
    """The pass after a relabel finds the file as the daemon wrote it: the relabel stays the
    news (status.json is not rewritten for the echo of the daemon's own write)."""
    relabeled = reconcile.OutcomeStatus.RELABELED.value
    unchanged = reconcile.OutcomeStatus.UNCHANGED.value
    return (
        (shown["status"], entry["status"]) == (relabeled, unchanged)
        and shown.get("device") == entry.get("device")
        and shown.get("name") == entry.get("name")
        and shown.get("path") == entry.get("path")
    )


def _entry(o: reconcile.Outcome) -> dict[str, Any]:
    """A slot's entry in status.json."""
    entry: dict[str, Any] = {"path": str(o.path), "status": o.status.value}
    if o.name is not None:
        entry["name"] = o.name
    if o.verdict is not None:
        entry["device"] = o.verdict.new if o.verdict.changes else o.verdict.old
        entry["reason"] = o.verdict.reason.value
    if o.message:
        entry["message"] = o.message
    return entry
