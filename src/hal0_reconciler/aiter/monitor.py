"""What the daemon and the CLI call: re-plan every environment, heal per settings, log changes.

``check`` is idempotent and quiet: events are logged only when the verdict they describe changes,
and an unchanged tree costs ``stat`` calls (tables and modules are read once per change).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePath

from hal0_reconciler import _log
from hal0_reconciler.aiter import (
    heal,
    manifest_digest,
    owner_heal,
    plan,
    routing,
    survey,
    treeaccess,
    treeio,
)
from hal0_reconciler.settings import Settings

log = _log.get_logger()

_Fingerprint = tuple[str, ...]
DEPRECATED_HEAL_SHAPE_KEYED = (
    "heal_shape_keyed is deprecated and ignored: a shape-keyed module is never healed (whether "
    "it compiled a shape cannot be read from the file); remove the setting"
)


@dataclass(frozen=True)
class HealResult:
    """What happened to one JIT folder's heal."""

    jit_dir: PurePath
    modules: tuple[str, ...]
    quarantine: str | None = None
    refused: tuple[str, ...] = ()  # builds in progress: retry later
    error: str | None = None
    still_mapped: dict[str, list[str]] = field(default_factory=dict)


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
    def fatal_boots(self) -> tuple[str, ...]:
        """Environments whose boot dies at a first lookup (``<environment>: <why>``)."""
        return tuple(f"{p.environment}: {why}" for p in self.plans for why in p.fatal)

    @property
    def retry_soon(self) -> bool:
        """A heal was refused because a build runs: check again after a while."""
        return any(h.refused for h in self.heals)


class AiterMonitor:
    """One per process. Holds the caches and the last verdicts between checks.

    ``log_findings=False`` (the one-shot CLI, which prints the whole report) logs only what is
    done (heals, restores), not the findings: structlog is then never imported for a check."""

    def __init__(self, settings: Settings, *, log_findings: bool = True) -> None:
        self.settings = settings
        self.log_findings = log_findings
        self.state_dir = settings.state_dir / "aiter"
        self.surveyor = survey.Surveyor(settings, cache_file=self.state_dir / "registry.json")
        self._memory_file = self.state_dir / "heal-memory.json"
        self.book = manifest_digest.DigestBook(self.state_dir)
        self._refusals: set[tuple[str, str, str]] = set()  # said once, not once per pass
        self._last: set[_Fingerprint] = set()
        self._uncovered: set[str] = set()
        if settings.aiter.heal_shape_keyed and log_findings:
            log.warning(
                "aiter.setting_deprecated",
                setting="heal_shape_keyed",
                reason=DEPRECATED_HEAL_SHAPE_KEYED,
            )

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
            fp = ("routing", str(exc))
            if fp not in self._last:
                log.error("aiter.routing_unreadable", error=str(exc))  # noqa: TRY400
            self._last = {fp}
            return MonitorReport((), errors=(f"routing data: {exc}",))
        if heal:
            try:
                with self.book.locked():
                    for jit_dir in self._jit_dirs():
                        self._recover(jit_dir)
            except (OSError, manifest_digest.DigestUnavailable) as exc:
                log.error("aiter.quarantine_roll_failed", error=str(exc))  # noqa: TRY400
        memory = self._load_memory()
        plans = self.surveyor.survey(rules, memory)
        heals: list[HealResult] = []
        if heal:
            heals = self._heal(plans, memory)
            if any(h.quarantine for h in heals):
                plans = self.surveyor.survey(rules, self._load_memory())
        errors = [h.error for h in heals if h.error]
        try:
            self.surveyor.registry.save()
            self.surveyor.sources.save()
        except OSError as exc:
            log.warning("aiter.registry_cache_unwritable", error=str(exc))
        if self.log_findings:
            self._report(plans)
        return MonitorReport(tuple(plans), tuple(heals), tuple(errors))

    def restore(self, qid: str) -> tuple[heal.Quarantine, heal.Quarantine | None]:
        """Put quarantine ``qid`` back in whichever JIT folder holds it; the modules are then held
        (not healed again) until their tables or target change. Raises HealFailed."""
        jits = self._jit_dirs()
        holder = next((j for j in jits if (j / heal.QUARANTINE_DIR / qid).is_dir()), None)
        if holder is None:
            known = sorted(q.name for j in jits for q in heal.list_quarantines(j))
            raise heal.HealFailed(f"no quarantine {qid!r} (known: {', '.join(known) or 'none'})")
        with self.book.locked():
            self._recover(holder)
            io = self._io(holder)
            restored, displaced = owner_heal.restore(io, holder, qid, book=self.book)
        log.warning(
            "aiter.quarantine_restored",
            quarantine=qid,
            jit_dir=str(holder),
            modules=list(restored.modules),
            displaced=displaced.id if displaced is not None else None,
            verified=restored.verified,
            credentials=io.describe(),
        )
        memory = heal.load_memory(self._memory_file)
        for env_plan in self.surveyor.survey(self.routing(), memory):
            for mod in env_plan.modules:
                if mod.module in restored.modules and env_plan.jit_dir == holder:
                    memory[str(mod.so_path)] = plan.MemoryEntry(
                        mod.digest, frozenset(m.name for m in mod.missing), "restored", qid
                    )
        heal.save_memory(self._memory_file, memory)
        return restored, displaced

    def _recover(self, jit_dir: Path) -> None:
        """Roll each heal or restore a kill interrupted in ``jit_dir`` forward or back."""
        try:
            rolled = owner_heal.recover(self._io(jit_dir), jit_dir, book=self.book)
        except (OSError, heal.HealFailed) as exc:
            if (str(jit_dir), "", str(exc)) not in self._refusals:
                self._refusals.add((str(jit_dir), "", str(exc)))
                log.error("aiter.quarantine_roll_failed", jit_dir=str(jit_dir), error=str(exc))  # noqa: TRY400
            return
        for r in rolled:
            fields = {"jit_dir": str(jit_dir), "quarantine": r.quarantine, "op": r.op}
            if r.outcome == "forward":
                log.warning("aiter.interrupted_rolled_forward", **fields, detail=r.detail)
            elif r.outcome == "back":
                log.warning("aiter.interrupted_rolled_back", **fields, detail=r.detail)
            elif r.outcome == "cleared":
                log.info("aiter.interrupted_cleared", **fields, detail=r.detail)
            elif (str(jit_dir), r.quarantine, r.detail) not in self._refusals:
                self._refusals.add((str(jit_dir), r.quarantine, r.detail))
                log.error("aiter.interrupted_left_alone", **fields, reason=r.detail)

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

    def _load_memory(self) -> dict[str, plan.MemoryEntry]:
        return heal.load_memory(self._memory_file)

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

    def _heal(
        self, plans: list[plan.EnvPlan], memory: dict[str, plan.MemoryEntry]
    ) -> list[HealResult]:
        results: list[HealResult] = []
        packages = {
            p.jit_dir: t.package_dir
            for t in self.settings.aiter.trees
            for p in plans
            if p.tree == survey.tree_label(t)
        }
        for jit, mods in plan.heal_set(plans).items():
            jit_dir = Path(jit)
            names = tuple(sorted(mods))
            busy = heal.build_activity(jit_dir, packages.get(jit, jit_dir), names)
            if busy:
                log.warning(
                    "aiter.heal_refused_build_running",
                    jit_dir=str(jit_dir),
                    modules=list(names),
                    busy=busy,
                )
                results.append(HealResult(jit_dir, names, refused=tuple(busy)))
                continue
            holders = heal.mapped_by(Path(m.so_path) for m in mods.values())
            try:
                with self.book.locked():
                    io = self._io(jit_dir)
                    q = owner_heal.quarantine(io, jit_dir, mods, book=self.book)
            except (heal.HealFailed, OSError) as exc:
                log.error(  # noqa: TRY400 - the one human line is in `error`
                    "aiter.heal_failed", jit_dir=str(jit_dir), modules=list(names), error=str(exc)
                )
                results.append(HealResult(jit_dir, names, error=str(exc)))
                continue
            for name, mp in sorted(mods.items()):
                memory[str(mp.so_path)] = plan.MemoryEntry(
                    mp.digest,
                    frozenset(m.name for m in mp.missing),
                    "healed",
                    q.id,
                    q.identities.get(name),
                )
                log.warning(
                    "aiter.module_quarantined",
                    module=name,
                    quarantine=q.id,
                    jit_dir=str(jit_dir),
                    missing=len(mp.missing),
                    sample=_sample(mp),
                    still_mapped_by=holders.get(str(mp.so_path), []),
                    credentials=io.describe(),
                )
            try:
                heal.save_memory(self._memory_file, memory)
            except OSError as exc:
                log.error("aiter.heal_memory_unwritable", error=str(exc))  # noqa: TRY400
            self._prune(jit_dir)
            results.append(
                HealResult(
                    jit_dir,
                    names,
                    quarantine=q.id,
                    still_mapped={k: v for k, v in holders.items() if v},
                )
            )
        return results

    def _prune(self, jit_dir: Path) -> None:
        try:
            with self.book.locked():
                keep = self.settings.aiter.keep_quarantines
                pruned = owner_heal.prune(self._io(jit_dir), jit_dir, keep=keep, book=self.book)
        except (OSError, heal.HealFailed) as exc:
            log.error("aiter.quarantine_prune_failed", jit_dir=str(jit_dir), error=str(exc))  # noqa: TRY400
            return
        if pruned.removed:
            log.info(
                "aiter.quarantine_pruned", jit_dir=str(jit_dir), quarantines=list(pruned.removed)
            )
        for qid, why in pruned.kept:
            log.warning("aiter.quarantine_kept", jit_dir=str(jit_dir), quarantine=qid, reason=why)

    def _report(self, plans: list[plan.EnvPlan]) -> None:
        """Log each finding once, when it first appears."""
        current: set[_Fingerprint] = set()
        uncovered: set[str] = set()

        def new(fp: _Fingerprint) -> bool:
            fresh = fp not in self._last and fp not in current
            current.add(fp)
            return fresh

        for slot in self.surveyor.last_slots:
            if slot.error is not None and new(("slot", slot.name, slot.error)):
                log.warning("aiter.slot_unreadable", slot=slot.name, reason=slot.error)
        for p in plans:
            where = {"tree": p.tree, "environment": p.environment}
            if new(("rules", p.tree, p.rules)):
                log.info("aiter.rules_chosen", tree=p.tree, rules=p.rules)
            if p.handled_as and new(("handled", p.tree, p.handled_as)):
                if p.handled_as.startswith("refused"):
                    log.error("aiter.tree_refused", tree=p.tree, reason=p.handled_as)
                else:
                    log.info("aiter.tree_handled", tree=p.tree, credentials=p.handled_as)
            if p.rules_note and new(("rules_note", p.tree, p.rules_note)):
                log.warning("aiter.rules_guessed", tree=p.tree, note=p.rules_note)
            for problem in p.problems:
                if problem in p.fatal:
                    if new(("fatal", p.tree, p.environment, problem)):
                        log.error("aiter.boot_fatal", **where, problem=problem)
                elif new(("problem", p.tree, p.environment, problem)):
                    log.warning("aiter.config_problem", **where, problem=problem)
            for note in p.notes:
                if new(("note", p.tree, p.environment, note)):
                    log.info("aiter.config_noted", **where, note=note)
            for src in p.sources:
                if src.error is not None and new(("table", str(src.file.path), src.error)):
                    log.warning("aiter.table_unreadable", path=str(src.file.path), reason=src.error)
                if (
                    src.table is not None
                    and src.table.quirks
                    and new(("quirks", str(src.file.path), *src.table.quirks))
                ):
                    log.info(
                        "aiter.table_quirks", path=str(src.file.path), quirks=list(src.table.quirks)
                    )
            for mod in p.modules:
                key = f"{p.tree}|{p.environment}|{mod.module}"
                for bad in mod.broken:  # the boot dies on it; no rebuild fixes it
                    if new(("broken", str(bad.table), str(bad.line), bad.reason)):
                        log.error(
                            "aiter.table_row_broken",
                            path=str(bad.table),
                            line=bad.line,
                            module=mod.module,
                            reason=bad.reason,
                        )
                if mod.status is plan.Status.UNCOVERED:
                    uncovered.add(key)
                if not new(
                    (
                        "module",
                        key,
                        mod.status,
                        mod.action,
                        mod.digest,
                        *sorted(m.name for m in mod.missing),
                    )
                ):
                    continue
                fields = {
                    **where,
                    "module": mod.module,
                    "missing": len(mod.missing),
                    "sample": _sample(mod),
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
                    log.warning(
                        "aiter.module_unreadable", **where, module=mod.module, reason=mod.reason
                    )
                elif key in self._uncovered:
                    log.info(
                        "aiter.module_covered", **where, module=mod.module, status=str(mod.status)
                    )
        self._last = current
        self._uncovered = uncovered


def _sample(mod: plan.ModulePlan, limit: int = 3) -> list[str]:
    """A few missing names with the rows that name them (``name @ table:line``)."""
    return [
        f"{m.name} @ {', '.join(f'{r.table}:{r.line}' for r in m.refs[:2])}"
        for m in mod.missing[:limit]
    ]
