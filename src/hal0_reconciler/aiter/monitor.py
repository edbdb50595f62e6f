"""What the daemon and the CLI call: re-plan every environment, heal per settings, log changes.

``check`` is idempotent and quiet: events are logged only when the verdict they describe changes,
and an unchanged tree costs ``stat`` calls (tables and modules are read once per change).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path, PurePath

from hal0_reconciler import _log
from hal0_reconciler.aiter import findings, survey
from hal0_reconciler.aiter.decision import plan, verdict
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.quarantine import requests as healing
from hal0_reconciler.aiter.quarantine.requests import HealResult
from hal0_reconciler.aiter.registry import cache as registry
from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.trees import access as treeaccess
from hal0_reconciler.aiter.trees import owner_io as treeio
from hal0_reconciler.settings import Settings

log = _log.get_logger()

__all__ = ["AiterMonitor", "HealResult", "MonitorReport"]


@dataclass(frozen=True)
class MonitorReport:
    plans: tuple[plan.EnvPlan, ...]
    heals: tuple[HealResult, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def heal_pending(self) -> bool:
        return any(p.heal_pending for p in self.plans)

    @property
    def not_converging(self) -> bool:
        return any(m.action is plan.Action.STUCK for p in self.plans for m in p.modules)

    @property
    def needs_operator(self) -> bool:
        """Rows no rebuild fixes (broken, or for a target the build does not compile)."""
        return any(m.action is plan.Action.OPERATOR for p in self.plans for m in p.modules)

    @property
    def modules_not_checked(self) -> tuple[str, ...]:
        """Modules the check would not read (too large, sparse, keeps changing, past the
        check's budget): ``<environment>: <module>: <why>``; degraded, never healed."""
        return tuple(
            f"{p.environment}: {m.module}: {m.reason}"
            for p in self.plans
            for m in p.modules
            if m.status is plan.Status.UNREADABLE and m.reason.startswith(verdict.NOT_CHECKED)
        )

    @property
    def over_budget(self) -> bool:
        """The check ran past its time budget: modules are left for the next check."""
        return any(registry.OVER_BUDGET in m.reason for p in self.plans for m in p.modules)

    @property
    def fatal_boots(self) -> tuple[str, ...]:
        """Environments whose boot dies at a first lookup (``<environment>: <why>``)."""
        return tuple(f"{p.environment}: {why}" for p in self.plans for why in p.fatal)

    @property
    def retry_soon(self) -> bool:
        """A heal was refused because a build runs: check again after a while."""
        return any(h.refused for h in self.heals)


class AiterMonitor:
    """One per process. Holds the caches and the last verdicts between checks: the surveyor
    (the facts and plans), the healer (the moves) and the findings (what was said).

    ``log_findings=False`` (the one-shot CLI, which prints the whole report) logs only what is
    done (heals, restores), not the findings: structlog is then never imported for a check."""

    def __init__(
        self, settings: Settings, *, log_findings: bool = True, budget: float | None = None
    ) -> None:
        self.settings = settings
        self.budget = budget  # seconds a check may read modules for (None: no bound)
        self.log_findings = log_findings
        self.state_dir = settings.state_dir / "aiter"
        self.surveyor = survey.Surveyor(settings, cache_file=self.state_dir / "registry.json")
        self.book = manifest_digest.DigestBook(self.state_dir)
        self.healer = healing.Healer(
            settings,
            book=self.book,
            memory_file=self.state_dir / "heal-memory.json",
            io_for=self._io,
        )
        self.findings = findings.Findings()

    def watch_paths(self) -> list[Path]:
        """Folders whose changes call for a re-plan (non-recursive; never ``build/``)."""
        paths: list[Path] = []
        for tree in self.settings.aiter.trees:
            configs = tree.package_dir / "configs"
            paths += [configs, configs / "model_configs"]
            base = survey.jit_dir_for(tree, tree.base_env)
            jits = {  # a slot's folder outside the tree is reported, never watched
                jit
                for e in survey.environments(tree, self.surveyor.slot_envs())
                if treeaccess.within(tree, base, jit := survey.jit_dir_for(e.tree, e.env))
            }
            paths += sorted(jits)
        if self.settings.aiter.trees:
            paths.append(self.settings.slots_dir)
        return list(dict.fromkeys(paths))

    def routing(self) -> routing.Routing:
        """The routing in force (raises OSError or RoutingError)."""
        version = next(
            (t.routing_version for t in self.settings.aiter.trees if t.routing_version), ""
        )
        return routing.parse_routing(survey.routing_text(self.settings), version=version)

    def check(self, *, heal: bool) -> MonitorReport:
        """Re-plan every environment; when ``heal``, invalidate what the plans ask for."""
        try:
            rules = self.routing()
        except (OSError, routing.RoutingError) as exc:
            self.findings.routing_unreadable(str(exc))
            return MonitorReport((), errors=(f"routing data: {exc}",))
        if heal:
            try:
                with self.book.locked():
                    for jit_dir in self._jit_dirs():
                        self.healer.recover(jit_dir)
            except (OSError, manifest_digest.DigestUnavailable) as exc:
                log.error("aiter.quarantine_roll_failed", error=str(exc))  # noqa: TRY400
        memory = self.healer.load_memory()
        deadline = None if self.budget is None else time.monotonic() + self.budget
        plans = self.surveyor.survey(rules, memory, deadline=deadline)
        heals: list[HealResult] = []
        if heal:
            heals = self.healer.heal_plans(plans, memory, self._packages(plans))
            if any(h.quarantine for h in heals):
                plans = self.surveyor.survey(rules, self.healer.load_memory(), deadline=deadline)
        errors = [h.error for h in heals if h.error]
        try:
            self.surveyor.registry.save()
            self.surveyor.sources.save()
        except OSError as exc:
            log.warning("aiter.registry_cache_unwritable", error=str(exc))
        if self.log_findings:
            self.findings.say(plans, self.surveyor.last_slots)
        return MonitorReport(tuple(plans), tuple(heals), tuple(errors))

    def restore(self, qid: str) -> tuple[heal.Quarantine, heal.Quarantine | None]:
        """Put quarantine ``qid`` back in whichever JIT folder holds it; the modules are then held
        (not healed again) until their tables or target change. Raises HealFailed."""
        holder, restored, displaced = self.healer.restore(qid, self._jit_dirs())
        memory = self.healer.load_memory()
        plans = self.surveyor.survey(self.routing(), memory)
        self.healer.remember_restored(plans, memory, holder, restored, qid)
        return restored, displaced

    def _io(self, jit_dir: Path) -> treeio.TreeIO:
        """The I/O of the tree ``jit_dir`` is beneath, with its owner's credentials (judged
        again now); HealFailed when the tree is refused: then nothing is moved, not even as root."""
        for tree in self.settings.aiter.trees:
            base = survey.jit_dir_for(tree, tree.base_env)
            if treeaccess.within(tree, base, jit_dir):
                access = self.surveyor.trees.access(survey.tree_label(tree), tree, base)
                if access.io is None or not access.io.beneath(jit_dir):
                    raise heal.HealFailed(f"{jit_dir}: {access.handled_as}; nothing was moved")
                return access.io
        raise heal.HealFailed(f"{jit_dir} is beneath no configured tree; nothing was moved")

    def _jit_dirs(self) -> list[Path]:
        slots = self.surveyor.slot_envs()
        return list(
            dict.fromkeys(
                jit
                for t in self.settings.aiter.trees
                for e in survey.environments(t, slots)
                if treeaccess.within(  # a slot's folder outside the tree is never looked into
                    t, survey.jit_dir_for(t, t.base_env), jit := survey.jit_dir_for(e.tree, e.env)
                )
            )
        )

    def _packages(self, plans: list[plan.EnvPlan]) -> dict[PurePath | None, Path]:
        """JIT folder → the package folder of the tree it belongs to."""
        return {
            p.jit_dir: t.package_dir
            for t in self.settings.aiter.trees
            for p in plans
            if p.tree == survey.tree_label(t)
        }
