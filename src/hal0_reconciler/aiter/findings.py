"""What a check found, logged once: each finding when it first appears, not once per check.

A finding is known by its fingerprint (what it is about and what it says); ``Findings`` keeps
the fingerprints of the last check, and a module that was uncovered is said to be covered again
once it is.
"""

from __future__ import annotations

from collections.abc import Iterable

from hal0_reconciler import _log
from hal0_reconciler.aiter import survey
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine.requests import sample
from hal0_reconciler.aiter.rules import routing

log = _log.get_logger()

Fingerprint = tuple[str, ...]


class _Check:
    """The fingerprints of one check as it is said: ``new`` is true the first time one is seen
    (in this check, and not in the last)."""

    def __init__(self, last: set[Fingerprint]) -> None:
        self.last = last
        self.current: set[Fingerprint] = set()
        self.uncovered: set[str] = set()

    def new(self, *fp: str) -> bool:
        fresh = fp not in self.last and fp not in self.current
        self.current.add(fp)
        return fresh


class Findings:
    """The report memory of one monitor."""

    def __init__(self) -> None:
        self._last: set[Fingerprint] = set()
        self._uncovered: set[str] = set()

    def routing_unreadable(self, error: str) -> None:
        """The routing data cannot be read: said once; nothing else can be found then."""
        fp = ("routing", error)
        if fp not in self._last:
            log.error("aiter.routing_unreadable", error=error)
        self._last = {fp}

    def say(self, plans: list[plan.EnvPlan], slots: Iterable[survey.SlotEnv]) -> None:
        """Log each finding of ``plans`` (and the unreadable ``slots``) once, when first seen."""
        check = _Check(self._last)
        for slot in slots:
            if slot.error is not None and check.new("slot", slot.name, slot.error):
                log.warning("aiter.slot_unreadable", slot=slot.name, reason=slot.error)
        for p in plans:
            _tree(check, p)
            _environment(check, p)
            _tables(check, p)
            for mod in p.modules:
                self._module(check, p, mod)
        self._last = check.current
        self._uncovered = check.uncovered

    def _module(self, check: _Check, p: plan.EnvPlan, mod: plan.ModulePlan) -> None:
        where = {"tree": p.tree, "environment": p.environment}
        key = f"{p.tree}|{p.environment}|{mod.module}"
        for bad in mod.broken:  # the boot dies on it; no rebuild fixes it
            if check.new("broken", str(bad.table), str(bad.line), bad.reason):
                log.error(
                    "aiter.table_row_broken",
                    path=str(bad.table),
                    line=bad.line,
                    module=mod.module,
                    reason=bad.reason,
                )
        if mod.status is plan.Status.UNCOVERED:
            check.uncovered.add(key)
        missing = sorted(m.name for m in mod.missing)
        said = mod.reason if mod.status is plan.Status.UNREADABLE else ""  # a new why is said
        if not check.new("module", key, mod.status, mod.action, mod.digest, said, *missing):
            return
        fields = {
            **where,
            "module": mod.module,
            "missing": len(mod.missing),
            "sample": sample(mod),
            "reason": mod.reason,
        }
        if mod.action is plan.Action.STUCK:
            log.error("aiter.heal_not_converging", **fields)
        elif mod.action is plan.Action.HELD:
            log.warning("aiter.module_held", **fields)
        elif mod.status is plan.Status.UNCOVERED:
            level = log.error if mod.keyed is routing.Keyed.NAME else log.warning
            level("aiter.module_uncovered", **fields, action=str(mod.action))
        elif mod.status is plan.Status.UNREADABLE:
            log.warning("aiter.module_unreadable", **where, module=mod.module, reason=mod.reason)
        elif key in self._uncovered:
            log.info("aiter.module_covered", **where, module=mod.module, status=str(mod.status))


def _tree(check: _Check, p: plan.EnvPlan) -> None:
    """The rule set chosen for the tree, whose credentials handle it, a guessed rule set."""
    if check.new("rules", p.tree, p.rules):
        log.info("aiter.rules_chosen", tree=p.tree, rules=p.rules)
    if p.handled_as and check.new("handled", p.tree, p.handled_as):
        if p.handled_as.startswith("refused"):
            log.error("aiter.tree_refused", tree=p.tree, reason=p.handled_as)
        else:
            log.info("aiter.tree_handled", tree=p.tree, credentials=p.handled_as)
    if p.rules_note and check.new("rules_note", p.tree, p.rules_note):
        log.warning("aiter.rules_guessed", tree=p.tree, note=p.rules_note)


def _environment(check: _Check, p: plan.EnvPlan) -> None:
    """The environment's problems (fatal to the boot or not) and notes."""
    where = {"tree": p.tree, "environment": p.environment}
    for problem in p.problems:
        if problem in p.fatal:
            if check.new("fatal", p.tree, p.environment, problem):
                log.error("aiter.boot_fatal", **where, problem=problem)
        elif check.new("problem", p.tree, p.environment, problem):
            log.warning("aiter.config_problem", **where, problem=problem)
    for note in p.notes:
        if check.new("note", p.tree, p.environment, note):
            log.info("aiter.config_noted", **where, note=note)


def _tables(check: _Check, p: plan.EnvPlan) -> None:
    """Tables that could not be read, and the quirks of those read."""
    for src in p.sources:
        path = str(src.file.path)
        if src.error is not None and check.new("table", path, src.error):
            log.warning("aiter.table_unreadable", path=path, reason=src.error)
        if (
            src.table is not None
            and src.table.quirks
            and check.new("quirks", path, *src.table.quirks)
        ):
            log.info("aiter.table_quirks", path=path, quirks=list(src.table.quirks))
