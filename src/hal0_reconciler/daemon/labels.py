"""Whether what runs is what the slot files say: "label not applied", and applying ours.

After a pass (every full pass: at start and at each resync; and each pass that relabelled), each
running llama.cpp slot that hal0 has rendered is compared with its label (``host.label_check``,
decided by ``host.running_lane``). A change this daemon wrote, or that hal0's own relabel pass
wrote, is applied by the idle-then-restart path (the Restarter), once per change; any other
change, and a slot whose running lane cannot be told, is reported (``plan``, ``status``, the
``labels_not_applied`` gauge), not restarted. A slot whose unit is not active runs nothing:
its label applies at its next load.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hal0_reconciler import _log, console, reconcile
from hal0_reconciler.host.restarts import label_check, running_lane, units
from hal0_reconciler.host.restarts import rules as restart_rules
from hal0_reconciler.host.restarts.running_lane import Intent, LabelState
from hal0_reconciler.model import Hal0Facts, Runtime
from hal0_reconciler.settings import Settings

log = _log.get_logger("hal0_reconciler.daemon.labels")

REPORTED = (LabelState.APPLY, LabelState.TRIED, LabelState.NOT_APPLIED, LabelState.CANNOT_TELL)
"""Every state of a running slot whose label is not applied (the gauge's ``state`` label)."""

_LOOKED_AT = frozenset(
    {
        reconcile.OutcomeStatus.UNCHANGED,
        reconcile.OutcomeStatus.RELABELED,
        reconcile.OutcomeStatus.PENDING,
    }
)


def candidates(
    outcomes: Iterable[reconcile.Outcome], settings: Settings
) -> list[label_check.Candidate]:
    """The llama.cpp slots of a pass, with the label each file has now."""
    found = []
    for o in outcomes:
        v = o.verdict
        if o.status not in _LOOKED_AT or v is None or o.name is None or o.token is None:
            continue
        if v.runtime is not Runtime.LLAMA_SERVER:
            continue
        label = v.new if o.status is reconcile.OutcomeStatus.RELABELED and v.new else v.old
        if label not in running_lane.LANES:
            continue
        off = restart_rules.is_hands_off(settings.hands_off, name=o.name, slot_id=o.token)
        found.append(label_check.Candidate(o.name, o.token, label, o.path, hands_off=off))
    return found


def look(
    settings: Settings,
    outcomes: Iterable[reconcile.Outcome],
    facts: Hal0Facts,
    memory: label_check.AppliedMemory,
    found: list[label_check.Candidate] | None = None,
    *,
    vulkan_paused: bool,
) -> list[label_check.Looked]:
    """Every rendered llama.cpp slot of ``outcomes``, judged (no unit state asked yet);
    ``found``: their candidates, when the caller has them already; ``vulkan_paused``: hal0's
    Vulkan opt-in as the pass that made the outcomes read it."""
    return label_check.look(
        candidates(outcomes, settings) if found is None else found,
        quadlet_dir=settings.quadlet_dir,
        facts=facts,
        memory=memory,
        intent=Intent(apply_others=settings.apply_others_labels, vulkan_paused=vulkan_paused),
        slot_max_bytes=settings.slot_max_bytes,
    )


@dataclass(frozen=True)
class Inputs:
    """Everything a full look depends on: when none of it changed, the look would find what
    it found (its pass's outcomes, compared by identity: a full pass that found every file as
    it was gives the very same objects)."""

    outcomes: tuple[reconcile.Outcome, ...]
    facts: Hal0Facts
    memory: int  # the applied-labels memory's revision
    vulkan: bool  # the Vulkan opt-in in hal0's api.env
    restarts: int  # restarts finished
    units: tuple[frozenset[str], tuple[tuple[str, tuple[int, ...] | None], ...]]

    def same(self, other: Inputs | None) -> bool:
        return (
            other is not None
            and _same_objects(self.outcomes, other.outcomes)
            and (self.facts is other.facts or self.facts == other.facts)
            and (self.memory, self.vulkan, self.restarts, self.units)
            == (other.memory, other.vulkan, other.restarts, other.units)
        )


def _same_objects(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return a is b or (len(a) == len(b) and all(map(operator.is_, a, b)))


def running_mismatches(
    settings: Settings, looked: list[label_check.Looked]
) -> list[label_check.Looked]:
    """The slots whose label is not applied and whose unit is active (one systemctl call)."""
    wrong = [x for x in looked if x.check.state is not LabelState.APPLIED]
    if not wrong:
        return []
    active = units.active_states(settings, [x.candidate.token for x in wrong])
    return [x for x in wrong if active.get(x.candidate.token) is True]


def entry(x: label_check.Looked) -> dict[str, str]:
    """One slot's line in status and plan."""
    return {
        "label": x.check.label,
        "running": x.check.running,
        "state": x.check.state.value,
        "reason": x.check.reason,
    }


class LabelWatch:
    """The daemon's side: looks after a pass, applies ours, keeps what status shows."""

    def __init__(self, settings: Settings, submit: Callable[[units.RestartRequest], None]) -> None:
        self._settings = settings
        self._submit = submit
        self._lock = threading.Lock()
        self._memory = label_check.AppliedMemory(settings.state_dir / label_check.MEMORY_FILE)
        self._shown: dict[str, dict[str, str]] = {}  # slot name -> its entry
        self._last: Inputs | None = None  # what the last full look rested on (worker only)
        self._found: list[label_check.Candidate] = []  # that look's candidates
        self.looks = 0  # full looks made (a full pass whose look was skipped makes none)

    def update_settings(self, settings: Settings) -> None:
        if settings.state_dir != self._settings.state_dir:
            self._memory = label_check.AppliedMemory(settings.state_dir / label_check.MEMORY_FILE)
        self._settings = settings
        self._last = None  # hands_off, the Quadlet folder, apply_others_labels may differ

    def note_relabeled(self, relabeled: Iterable[tuple[str, str]]) -> None:
        """This daemon wrote each ``(token, label)`` and asks for its restart (not asked again):
        a pass's relabels, remembered in one write."""
        self._memory.note_written(relabeled)

    def check(
        self,
        report: reconcile.PassReport,
        facts: Hal0Facts | None,
        *,
        full: bool,
        restarts: int = 0,
    ) -> bool:
        """Look at the pass's slots; True when what status shows changed. A full pass whose
        look rests on what the last one did (``Inputs``; ``restarts``: restarts finished so
        far) is not looked at again: it would find the same. hal0's Vulkan opt-in is taken as
        the pass read it (``report.vulkan_paused``), never read again here."""
        if facts is None:
            return False
        settings = self._settings
        outcomes = report.outcomes
        vulkan = report.vulkan_paused
        last = self._last
        self._last = None
        if full and last is not None and _same_objects(outcomes, last.outcomes):
            found = self._found  # the same outcomes: the same candidates
        else:
            found = candidates(outcomes, settings)
        units = label_check.unit_identities(settings.quadlet_dir, (c.token for c in found))
        inputs = Inputs(outcomes, facts, self._memory.revision, vulkan, restarts, units)
        if full and inputs.same(last):
            self._last = last
            return False
        changed = self._look(outcomes, facts, found, full=full, vulkan=vulkan)
        if full:
            self.looks += 1
            self._found = found
            self._last = dataclasses.replace(inputs, memory=self._memory.revision)
        return changed

    def _look(
        self,
        outcomes: tuple[reconcile.Outcome, ...],
        facts: Hal0Facts,
        found: list[label_check.Candidate],
        *,
        full: bool,
        vulkan: bool,
    ) -> bool:
        settings = self._settings
        looked = look(settings, outcomes, facts, self._memory, found, vulkan_paused=vulkan)
        running = running_mismatches(settings, looked)
        for x in running:
            if x.check.state is LabelState.APPLY:
                c = x.candidate
                log.info(
                    "slot.label_restart_requested",
                    slot=c.name,
                    label=c.label,
                    running=x.check.running,
                    reason=x.check.reason,
                )
                self._memory.note_restarted(c.token, c.label, x.fingerprint)
                self._submit(units.RestartRequest(name=c.name, token=c.token))
        if full:
            self._memory.keep_only(c.token for c in found)
        fresh = {x.candidate.name: entry(x) for x in running}
        with self._lock:
            if full:
                shown = fresh
            else:
                looked_names = {x.candidate.name for x in looked}
                shown = {n: e for n, e in self._shown.items() if n not in looked_names}
                shown.update(fresh)
            changed = shown != self._shown
            for name, e in sorted(shown.items()):
                said = self._shown.get(name)
                if e["state"] in {"not-applied", "cannot-tell"} and said != e:
                    log.info("slot.label_not_applied", slot=name, **e)
            self._shown = shown
        return changed

    def report(self) -> dict[str, dict[str, str]]:
        """Slot name -> label, running lane, state and reason (status ``labels_not_applied``)."""
        with self._lock:
            return dict(sorted(self._shown.items()))

    def counts(self) -> dict[str, int]:
        """Running slots whose label is not applied, by state (every state, from 0)."""
        with self._lock:
            found = dict.fromkeys((s.value for s in REPORTED), 0)
            for e in self._shown.values():
                found[e["state"]] = found.get(e["state"], 0) + 1
            return found


def plan_entries(
    settings: Settings, report: reconcile.PassReport, facts: Hal0Facts | None
) -> dict[str, dict[str, Any]]:
    """For ``plan``: each running slot whose label is not applied (nothing is remembered or
    restarted; the daemon's memory is read, never written)."""
    if facts is None:
        return {}
    memory = label_check.AppliedMemory.read_only(settings.state_dir / label_check.MEMORY_FILE)
    looked = look(settings, report.outcomes, facts, memory, vulkan_paused=report.vulkan_paused)
    return {x.candidate.name: entry(x) for x in running_mismatches(settings, looked)}


def plan_lines(entries: dict[str, dict[str, Any]]) -> list[str]:
    """``plan``'s lines for people (every value shown inert)."""
    inert = console.inert
    lines = ["label not applied (running slots whose container was started for another label):"]
    for name, e in sorted(entries.items()):
        lines.append(
            f"  {inert(name)}: label {inert(e['label'])}, running {inert(e['running'])}: "
            f"{inert(e['state'])} ({inert(e['reason'])})"
        )
    if any(e["state"] == LabelState.APPLY for e in entries.values()):
        lines.append(
            "  the daemon restarts those marked apply through hal0 once each is idle, one at a "
            "time unless restart_concurrency allows more; a restart may unload other idle slots "
            "(hal0 evicts to make room)"
        )
    return lines
