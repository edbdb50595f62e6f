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
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import boundedread, fsio
from hal0_reconciler.aiter import (
    installed,
    plan,
    registry,
    resolve,
    routing,
    sources,
    tablecache,
    tables,
    target,
    treeaccess,
    treeio,
    verdict,
)
from hal0_reconciler.aiter import rules as rules_mod
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
        self.registry = registry.Registry(cache_file)
        # parsed tables and what they ask of each module survive a restart (a check in a new
        # process with nothing changed reads needs.json and stats its inputs)
        self.sources = sources.Sources(None if cache_file is None else cache_file.parent)
        self.table_cache = self.sources.table_cache
        self.needs_cache = self.sources.needs_cache
        self.installs = installed.Installs()
        self._untuned: dict[Path, tuple[object, tuple[str, ...]]] = {}
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
        self, rules: routing.Routing, memory: dict[str, plan.MemoryEntry]
    ) -> list[plan.EnvPlan]:
        """Plan every environment of every tree. Reads only what changed since the last call."""
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
        overlays = treeaccess.listdir(io, configs / "model_configs")
        resolutions = tuple(
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
        problems = [*found.notes, *routing_problem, *(p for r in resolutions for p in r.problems)]
        notes: list[str] = []
        checked = choice.error is None and bool(choice.targets)
        found_sources: list[plan.TableSource] = []
        modules: list[plan.ModulePlan] = []
        if checked:
            reads, merged = self._reads(resolutions, rules_in, configs, io, ruleset.dedup_keys)
            context = (
                str(choice),
                sorted(choice.lookup),
                sorted(choice.compiled),
                repr(ruleset),
                found.version,
            )
            found_sources, merges, needs = self.sources.derive(
                reads, len(merged), choice, context, routing_key, io=io, limits=self._limits
            )
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
            if choice.why_apart:
                problems.append(
                    f"{choice.why_apart}: rows only looked up are never compiled and never "
                    "healed (set CU_NUM to the live CU count, or unset GPU_ARCHS)"
                )
            modules = self._module_plans(
                jit,
                found_sources,
                rules=rules_in,
                memory=memory,
                choice=choice,
                needs=needs,
                modules_seen=modules_seen,
                io=io,
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

    def _reads(
        self,
        resolutions: tuple[resolve.Resolution, ...],
        rules_in: routing.Routing,
        configs: Path,
        io: treeio.TreeIO,
        dedup_keys: tuple[str, ...] = ("cu_num", "gfx"),
    ) -> tuple[list[sources.Read], list[resolve.Resolution]]:
        """The table reads a plan needs, in plan order, and the resolutions aiter merges."""
        reads: list[sources.Read] = []
        merged: list[resolve.Resolution] = []
        for res in resolutions:
            feeds = [r for r in rules_in.registries if res.route.stem in r.tables]
            if not (res.route.compiled or feeds):
                continue
            # merged files: aiter's duplicate merge; one file: its lookup needs unique shapes
            keys = self._merge_keys(configs, res.route.stem, dedup_keys, io) if res.loaded else ()
            group = -1
            if keys:
                group = len(merged)
                merged.append(res)
            part = sources.Part.SOURCE if res.route.compiled else sources.Part.MERGE
            reads.extend(sources.Read(f, res.route, keys, part, group) for f in res.loaded)
            # an id-keyed module's rows: a source only when the file has rows of its libtype
            reads.extend(
                sources.Read(f, reg.route, (), sources.Part.FEED, -1)
                for reg in feeds
                for f in res.loaded
            )
        for reg in rules_in.registries:
            reads.extend(
                sources.Read(f, reg.route, (), sources.Part.SOURCE, -1)
                for f in _fixed_files(io, configs, reg.files)
            )
        return reads, merged

    def _merge_keys(
        self, configs: Path, stem: str, extra: tuple[str, ...], io: treeio.TreeIO
    ) -> tuple[str, ...]:
        """aiter's duplicate-merge keys: the untuned sibling's columns + ``extra`` (the installed
        aiter's); none (no merge) when the untuned file is absent."""
        path = configs / f"{'untuned'.join(stem.rsplit('tuned', 1))}.csv"
        ident = _identity(io, path)
        cached = self._untuned.get(path)
        if cached is not None and cached[0] == (ident, extra):
            return cached[1]
        keys: tuple[str, ...] = ()
        if ident is not None and (head := treeaccess.header_line(io, path)) is not None:
            cols = [c.strip() for c in head.strip().split(",") if c.strip()]
            keys = tuple(dict.fromkeys([*cols, *extra]))
        self._untuned[path] = ((ident, extra), keys)
        return keys

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
                scan = self.registry.scan(so, wanted, io=io)
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


def _identity(io: treeio.TreeIO, path: Path) -> tablecache.Stamp | None:
    try:
        st = io.lstat(path)
    except OSError:
        return None
    return None if st is None or not st.is_file else sources.stamp(st)


def _exists(io: treeio.TreeIO, path: Path) -> bool:
    try:
        return io.lstat(path) is not None
    except OSError:
        return False


def _fixed_files(
    io: treeio.TreeIO, configs: Path, patterns: tuple[str, ...]
) -> list[resolve.ResolvedFile]:
    """The files fixed globs under ``configs/`` name (sorted, as aiter's generator globs them)."""
    return [
        resolve.ResolvedFile(p, resolve.Origin.FIXED, exists=True)
        for p in treeaccess.fixed_files(io, configs, patterns)
    ]


def _read_slot(path: Path, max_bytes: int) -> SlotEnv:
    """A slot's ``[server].env``: read capped (``boundedread``), never following a link."""
    name = path.stem
    try:
        text = boundedread.read_bounded_text(path, max_bytes=max_bytes)
        assert text is not None  # noqa: S101 - missing_ok is False
        return SlotEnv(name, dict(document.parse_slot(text, stem=name).server_env))
    except (OSError, ReconcilerError) as exc:
        return SlotEnv(name, None, str(exc))
