"""Gather the facts for every environment of every tree and turn them into plans.

The I/O side of planning: slot files, ``model_configs/`` listings, tables (read once per change),
module registries (through the cache), the KFD topology. Decisions are ``verdict.decide``'s.

Per environment, the table reads a plan needs are listed here (``sources.Read``) and turned
into the plan's sources, merges and needs by ``sources.Sources`` (no table decoded when nothing
changed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from hal0_reconciler import boundedread, fsio
from hal0_reconciler.aiter.decision import plan, verdict
from hal0_reconciler.aiter.registry import cache as registry
from hal0_reconciler.aiter.rules import installed, routing
from hal0_reconciler.aiter.rules import sets as rules_mod
from hal0_reconciler.aiter.tables import resolve, sources, target
from hal0_reconciler.aiter.tables import rows as tables
from hal0_reconciler.aiter.tables.reads import TableReads
from hal0_reconciler.aiter.trees import access as treeaccess
from hal0_reconciler.aiter.trees import owner_io as treeio
from hal0_reconciler.errors import ReconcilerError
from hal0_reconciler.settings import AiterTree, Settings
from hal0_reconciler.slots import document, store

_FileKey = tuple[str, tuple[int, int, int, int]]


@dataclass(frozen=True)
class Environment:
    """One environment a server boots with from one tree: the base, or a slot's env over it."""

    tree: AiterTree
    name: str  # "base" or "slot:<slot file stem>"
    env: dict[str, str]


@dataclass(frozen=True)
class SlotEnv:
    name: str
    env: dict[str, str] | None  # None: the file could not be read
    error: str | None = None


def tree_label(tree: AiterTree) -> str:
    return tree.name or str(tree.package_dir)


def jit_dir_for(tree: AiterTree, env: dict[str, str]) -> Path:
    """aiter's rule: ``$AITER_JIT_DIR`` verbatim, else ``<pkg>/jit`` if writable, else
    ``~/.aiter/jit``."""
    if tree.jit_dir is not None:
        return tree.jit_dir
    if env.get("AITER_JIT_DIR"):
        return Path(env["AITER_JIT_DIR"])
    pkg_jit = tree.package_dir / "jit"
    if os.access(pkg_jit, os.W_OK):
        return pkg_jit
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".aiter" / "jit"


def routing_text(settings: Settings) -> str:
    """The routing data: the operator's file when set, else the one shipped in this package."""
    if settings.aiter.routing_file is not None:
        return settings.aiter.routing_file.read_text(encoding="utf-8")
    return installed.shipped_text("routing.toml")


TARGET_VARIABLES = frozenset({"GPU_ARCHS", "CU_NUM"})
"""Variables that change which rows aiter compiles or looks up (besides ``AITER_*``)."""


def environments(tree: AiterTree, slots: list[SlotEnv]) -> list[Environment]:
    """The base environment plus each slot whose env sets an ``AITER_*`` variable, ``GPU_ARCHS``
    or ``CU_NUM`` (over base)."""
    envs = [Environment(tree, "base", dict(tree.base_env))]
    if tree.slot_envs:
        envs.extend(
            Environment(tree, f"slot:{slot.name}", {**tree.base_env, **slot.env})
            for slot in slots
            if slot.env is not None
            and any(k.startswith("AITER_") or k in TARGET_VARIABLES for k in slot.env)
        )
    return envs


class Surveyor:
    """Holds the caches between checks: tables, slot files, the registry, the KFD reading."""

    def __init__(self, settings: Settings, *, cache_file: Path | None) -> None:
        self.settings = settings
        self.registry = registry.Registry(cache_file, max_bytes=settings.aiter.module_max_bytes)
        self.deadline: float | None = None  # this survey's end of budget (time.monotonic)
        # parsed tables and what they ask of each module survive a restart (a check in a new
        # process with nothing changed reads needs.json and stats its inputs)
        self.sources = sources.Sources(None if cache_file is None else cache_file.parent)
        self.table_cache = self.sources.table_cache
        self.needs_cache = self.sources.needs_cache
        self.installs = installed.Installs()
        self.reads = TableReads()
        self._slots: dict[_FileKey, SlotEnv] = {}
        self._kfd: tuple[frozenset[tables.Target], str | None] | None = None
        self._routings: dict[str, routing.Routing | str] = {}  # by version key (str: error)
        self.last_slots: list[SlotEnv] = []
        self.trees = treeaccess.Trees(timeout=settings.aiter.child_timeout)
        self.handled_as: dict[str, str] = {}  # tree label -> whose credentials handled it

    @property
    def table_reads(self) -> int:
        """Tables parsed since start (tests and the benchmark count these)."""
        return self.sources.table_reads

    def kfd(self) -> tuple[frozenset[tables.Target], str | None]:
        if self._kfd is None:
            self._kfd = target.read_kfd(self.settings.aiter.kfd_topology_dir)
        return self._kfd

    def slot_envs(self) -> list[SlotEnv]:
        """``[server].env`` of every slot file; unreadable ones carry their error.

        Slot files are listed and read the way the slot engine does (``slots.store``: no
        symlink followed, no FIFO opened) and parsed by ``slots.document``; a file is parsed
        again only when its identity changed.
        """
        found: list[SlotEnv] = []
        fresh: dict[_FileKey, SlotEnv] = {}
        for path in store.list_slot_paths(self.settings.slots_dir):
            try:
                key = (str(path), fsio.identity_of(path.lstat()))
            except OSError:
                continue
            slot = self._slots.get(key) or _read_slot(path, self.settings.slot_max_bytes)
            fresh[key] = slot
            found.append(slot)
        self._slots = fresh
        self.last_slots = found
        return found

    def survey(
        self,
        rules: routing.Routing,
        memory: dict[str, plan.MemoryEntry],
        *,
        deadline: float | None = None,
    ) -> list[plan.EnvPlan]:
        """Plan every environment of every tree. Reads only what changed since the last call;
        past ``deadline`` (``time.monotonic``) a module not known yet is not read ("not
        checked: the check ran past its time budget", read at the next check)."""
        self.deadline = deadline
        slots = self.slot_envs()
        self.sources.next_survey()
        plans: list[plan.EnvPlan] = []
        modules_seen: list[Path] = []
        for tree in self.settings.aiter.trees:
            label = tree_label(tree)
            access = self.trees.access(label, tree, jit_dir_for(tree, tree.base_env))
            self.handled_as[label] = access.handled_as
            for environment in environments(tree, slots):
                env_plan = self._plan_env(environment, rules, memory, modules_seen, access)
                plans.append(env_plan)
        self.registry.forget_missing(modules_seen)
        return plans

    def _plan_env(
        self,
        environment: Environment,
        rules_in: routing.Routing,
        memory: dict[str, plan.MemoryEntry],
        modules_seen: list[Path],
        access: treeaccess.Access,
    ) -> plan.EnvPlan:
        tree, env = environment.tree, environment.env
        label = tree_label(tree)
        jit = jit_dir_for(tree, env)
        io = access.io
        if io is None or (unchecked := self._unchecked(environment, io, jit)):
            why = [f"tree refused: {access.refused}"] if io is None else unchecked
            return plan.EnvPlan(
                label, environment.name, jit, "not checked", (), (), (), tuple(why),
                checked=False, handled_as=access.handled_as,
            )  # fmt: skip
        chosen, found = self.installs.choose(tree.package_dir)
        ruleset = chosen.rules
        rules_in, routing_problem = self._routing_for(tree, ruleset, rules_in)
        routing_key = hashlib.sha256(repr(rules_in).encode()).hexdigest()
        choice = target.choose_target(tree.target, env, kfd=self.kfd(), build_cu=ruleset.build_cu)
        configs = tree.package_dir / "configs"
        resolutions = _resolutions(rules_in, env, configs, io, ruleset)
        problems = [*found.notes, *routing_problem, *(p for r in resolutions for p in r.problems)]
        notes: list[str] = []
        checked = choice.error is None and bool(choice.targets)
        found_sources: list[plan.TableSource] = []
        modules: list[plan.ModulePlan] = []
        if checked:
            context = (
                str(choice),
                sorted(choice.lookup),
                sorted(choice.compiled),
                repr(ruleset),
                found.version,
            )
            found_sources, modules = self._checked(
                _Checking(jit, configs, io, rules_in, routing_key, ruleset, choice, context),
                resolutions,
                memory,
                modules_seen,
                notes=notes,
                problems=problems,
            )
        else:
            problems.append(f"target unknown: {choice.error}; nothing is checked or healed")
        return plan.EnvPlan(
            label,
            environment.name,
            jit,
            str(choice),
            resolutions,
            tuple(found_sources),
            tuple(modules),
            tuple(problems),
            checked=checked,
            rules=f"aiter {found.version or 'version unknown'}, rules {ruleset.name} "
            f"(chosen by {chosen.how}), routing {rules_in.version}",
            rules_note=chosen.note,
            fatal=tuple(r.fatal for r in resolutions if r.fatal),
            notes=tuple(notes),
            handled_as=access.handled_as,
        )

    def _checked(
        self,
        c: _Checking,
        resolutions: tuple[resolve.Resolution, ...],
        memory: dict[str, plan.MemoryEntry],
        modules_seen: list[Path],
        *,
        notes: list[str],
        problems: list[str],
    ) -> tuple[list[plan.TableSource], list[plan.ModulePlan]]:
        """The sources and module verdicts of an environment whose target is known; what the
        merges and the target say is added to ``notes`` and ``problems``."""
        reads, merged = self.reads.plan(resolutions, c.rules, c.configs, c.io, c.ruleset.dedup_keys)
        found_sources, merges, needs = self.sources.derive(
            reads, len(merged), c.choice, c.context, c.routing_key, io=c.io, limits=self._limits
        )
        needs = _with_merges(merged, merges, needs, c.ruleset, notes=notes, problems=problems)
        if c.choice.why_apart:
            problems.append(
                f"{c.choice.why_apart}: rows only looked up are never compiled and never "
                "healed (set CU_NUM to the live CU count, or unset GPU_ARCHS)"
            )
        modules = self._module_plans(
            c.jit,
            found_sources,
            rules=c.rules,
            memory=memory,
            choice=c.choice,
            needs=needs,
            modules_seen=modules_seen,
            io=c.io,
        )
        return found_sources, modules

    def _routing_for(
        self, tree: AiterTree, ruleset: rules_mod.RuleSet, given: routing.Routing
    ) -> tuple[routing.Routing, list[str]]:
        """The routing of the installed aiter's rule set (the tree's ``routing_version`` wins)."""
        if tree.routing_version or not ruleset.routing or ruleset.routing == given.version:
            return given, []
        found = self._routings.get(ruleset.routing)
        if found is None:
            try:
                found = routing.parse_routing(routing_text(self.settings), version=ruleset.routing)
            except (OSError, routing.RoutingError) as exc:
                found = str(exc)
            self._routings[ruleset.routing] = found
        if isinstance(found, str):
            return given, [f"routing for rules {ruleset.name}: {found}; using {given.version}"]
        return found, []

    @property
    def _limits(self) -> sources.Limits:
        cfg = self.settings.aiter
        return sources.Limits(cfg.table_max_bytes, cfg.table_max_rows)

    def _unchecked(self, environment: Environment, io: treeio.TreeIO, jit: Path) -> list[str]:
        """Why a slot's environment is not checked: its env names paths outside the tree."""
        if not environment.name.startswith("slot:"):
            return []
        slot = environment.name.removeprefix("slot:")
        bad = treeaccess.outside(io, environment.env, jit_from_env=environment.tree.jit_dir is None)
        why = [f"{treeaccess.OUTSIDE} (slot {slot}, {var} = {value!r})" for var, value in bad]
        if not bad and not io.beneath(jit):
            why.append(f"{treeaccess.OUTSIDE} (slot {slot}, its JIT folder {str(jit)!r})")
        return why

    def _module_plans(
        self,
        jit: Path,
        sources: list[plan.TableSource],
        *,
        rules: routing.Routing,
        memory: dict[str, plan.MemoryEntry],
        choice: target.TargetChoice,
        needs: dict[str, plan.Needs],
        modules_seen: list[Path],
        io: treeio.TreeIO,
    ) -> list[plan.ModulePlan]:
        """The verdict for every module the tables need, from what each ``.so`` registered."""
        modules: list[plan.ModulePlan] = []
        for module in sorted(needs):
            so = jit / f"{module}.so"
            keyed = rules.by_module(module)[0].keyed
            if keyed is routing.Keyed.ID:  # nothing to read: ids are not strings in the file
                modules.append(
                    verdict.decide(
                        module,
                        keyed=keyed,
                        needs=needs[module],
                        facts=plan.ModuleFacts(so, exists=_exists(io, so)),
                        digest="",
                        memory=None,
                    )
                )
                continue
            modules_seen.append(so)
            wanted = [*needs[module].names, *needs[module].unbuildable]
            try:
                scan = self.registry.scan(so, wanted, io=io, deadline=self.deadline)
                facts = (
                    plan.ModuleFacts(so, exists=False)
                    if scan is None
                    else plan.ModuleFacts(
                        so,
                        exists=True,
                        registered=scan.registered,
                        identity=scan.identity[:4],
                    )
                )
            except OSError as exc:
                facts = plan.ModuleFacts(so, exists=True, error=exc.strerror or str(exc))
            except boundedread.ReadRefused as exc:
                facts = plan.ModuleFacts(so, exists=True, error=exc.reason)
            modules.append(
                verdict.decide(
                    module,
                    keyed=keyed,
                    needs=needs[module],
                    facts=facts,
                    digest=plan.module_digest(module, sources, str(choice)),
                    memory=memory.get(str(so)),
                )
            )
        return modules


def _resolutions(
    rules_in: routing.Routing,
    env: dict[str, str],
    configs: Path,
    io: treeio.TreeIO,
    ruleset: rules_mod.RuleSet,
) -> tuple[resolve.Resolution, ...]:
    """Which files each routed table resolves to in ``env`` (aiter's variables and overlays)."""
    overlays = treeaccess.listdir(io, configs / "model_configs")
    return tuple(
        resolve.resolve(
            route,
            env,
            configs_dir=configs,
            overlay_names=overlays,
            exists=io.is_file,
            rules=ruleset,
        )
        for route in rules_in.tables
    )


@dataclass(frozen=True)
class _Checking:
    """What checking one environment's tables goes by."""

    jit: Path
    configs: Path
    io: treeio.TreeIO
    rules: routing.Routing
    routing_key: str
    ruleset: rules_mod.RuleSet
    choice: target.TargetChoice
    context: tuple[object, ...]  # what the derived cache's entries are valid for


def _with_merges(
    merged: list[resolve.Resolution],
    merges: Sequence[tuple[Mapping[PurePath, frozenset[int]], int]],
    needs: dict[str, plan.Needs],
    ruleset: rules_mod.RuleSet,
    *,
    notes: list[str],
    problems: list[str],
) -> dict[str, plan.Needs]:
    """``needs`` with the rows an unmerged file repeats as broken; what the duplicate-shape
    merges do is said in ``notes`` (resolved in memory) or ``problems``."""
    duplicates: dict[str, list[plan.Broken]] = {}
    for res, (lost, in_dups) in zip(merged, merges, strict=True):
        if res.merged:  # resolved in memory: aiter's normal work, said as a note
            in_memory = ruleset.dedup_merge is not rules_mod.DedupMerge.REWRITE_AND_RERUN
            said = plan.merge_problem(res, lost, in_dups, ruleset)
            (notes if in_memory else problems).extend(said)
        for module, rows in plan.duplicate_rows(res, lost).items():
            duplicates.setdefault(module, []).extend(rows)
    for module, rows in duplicates.items():
        if module in needs:  # a copy: the derived cache's records stay as they were
            needs[module] = dataclasses.replace(
                needs[module], broken=[*needs[module].broken, *rows]
            )
    return needs


def _exists(io: treeio.TreeIO, path: Path) -> bool:
    try:
        return io.lstat(path) is not None
    except OSError:
        return False


def _read_slot(path: Path, max_bytes: int) -> SlotEnv:
    """A slot's ``[server].env``: read capped (``boundedread``), never following a link."""
    name = path.stem
    try:
        text = boundedread.read_bounded_text(path, max_bytes=max_bytes)
        assert text is not None  # noqa: S101 - missing_ok is False
        return SlotEnv(name, dict(document.parse_slot(text, stem=name).server_env))
    except (OSError, ReconcilerError) as exc:
        return SlotEnv(name, None, str(exc))
