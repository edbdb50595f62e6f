"""Gather the facts for every environment of every tree and turn them into plans.

The I/O side of planning: slot files, ``model_configs/`` listings, tables (read once per change),
module registries (through the cache), the KFD topology. Decisions are ``plan.decide``'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePath

from hal0_reconciler import fsio
from hal0_reconciler.aiter import (
    installed,
    plan,
    registry,
    resolve,
    routing,
    tablecache,
    tables,
    target,
)
from hal0_reconciler.errors import ReconcilerError
from hal0_reconciler.settings import AiterTree, Settings
from hal0_reconciler.slots import document, store

_FileKey = tuple[str, tuple[int, int, int, int]]
_TableKey = tuple[_FileKey, str, frozenset[tables.Target], tuple[str, ...]]
_Merged = tuple[dict[PurePath, frozenset[int]], int]


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
    return (
        resources.files("hal0_reconciler.aiter")
        .joinpath("routing.toml")
        .read_text(encoding="utf-8")
    )


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
        # parsed tables survive a restart (a check in a new process parses what changed)
        self.table_cache = tablecache.TableCache(
            None if cache_file is None else cache_file.with_name("tables.json")
        )
        self.table_reads = 0
        self._tables: dict[_TableKey, plan.TableSource] = {}
        self.installs = installed.Installs()
        self._untuned: dict[Path, tuple[object, tuple[str, ...]]] = {}
        self._merges: dict[tuple[object, ...], _Merged] = {}
        self._needs: dict[tuple[object, ...], dict[str, plan.Needs]] = {}
        self._needs_used: dict[tuple[object, ...], dict[str, plan.Needs]] = {}
        self._merges_used: dict[tuple[object, ...], _Merged] = {}
        self._slots: dict[_FileKey, SlotEnv] = {}
        self._kfd: tuple[frozenset[tables.Target], str | None] | None = None
        self.last_slots: list[SlotEnv] = []

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
            slot = self._slots.get(key) or _read_slot(path)
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
        used: dict[_TableKey, plan.TableSource] = {}
        plans: list[plan.EnvPlan] = []
        modules_seen: list[Path] = []
        for tree in self.settings.aiter.trees:
            for environment in environments(tree, slots):
                env_plan = self._plan_env(environment, rules, memory, used, modules_seen)
                plans.append(env_plan)
        self._tables = used
        self._merges, self._merges_used = self._merges_used, {}
        self._needs, self._needs_used = self._needs_used, {}
        self.registry.forget_missing(modules_seen)
        return plans

    def _plan_env(
        self,
        environment: Environment,
        rules_in: routing.Routing,
        memory: dict[str, plan.MemoryEntry],
        used: dict[_TableKey, plan.TableSource],
        modules_seen: list[Path],
    ) -> plan.EnvPlan:
        tree, env = environment.tree, environment.env
        label = tree_label(tree)
        chosen, found = self.installs.choose(tree.package_dir)
        ruleset = chosen.rules
        choice = target.choose_target(tree.target, env, kfd=self.kfd(), build_cu=ruleset.build_cu)
        jit = jit_dir_for(tree, env)
        configs = tree.package_dir / "configs"
        try:
            overlays = [p.name for p in (configs / "model_configs").iterdir()]
        except OSError:
            overlays = []
        resolutions = tuple(
            resolve.resolve(
                route,
                env,
                configs_dir=configs,
                overlay_names=overlays,
                exists=lambda p: Path(p).is_file(),
                rules=ruleset,
            )
            for route in rules_in.tables
        )
        problems = [*found.notes, *(p for r in resolutions for p in r.problems)]
        checked = choice.error is None and bool(choice.targets)
        sources: list[plan.TableSource] = []
        modules: list[plan.ModulePlan] = []
        if checked:
            losers: dict[PurePath, frozenset[int]] = {}
            for res in resolutions:
                feeds = [r for r in rules_in.registries if res.route.stem in r.tables]
                if not (res.route.compiled or feeds):
                    continue
                keys = self._merge_keys(configs, res.route.stem) if res.merged else ()
                read = [self._table(f, res.route, choice.targets, used, keys) for f in res.loaded]
                if res.route.compiled:
                    sources.extend(read)
                if keys:
                    lost, in_dups = self._merge(read, (str(choice), *keys))
                    losers.update(lost)
                    problems.extend(plan.merge_problem(res, lost, in_dups, ruleset))
                for reg in feeds:
                    for f in res.loaded:
                        src = self._table(f, reg.route, choice.targets, used, ())
                        if src.table is not None and (src.table.rows or src.table.broken):
                            sources.append(src)  # only files with rows of its libtype
            for reg in rules_in.registries:
                sources.extend(
                    self._table(f, reg.route, choice.targets, used, ())
                    for f in _fixed_files(configs, reg.files)
                )
            if choice.why_apart:
                problems.append(
                    f"{choice.why_apart}: rows only looked up are never compiled and never "
                    "healed (set CU_NUM to the live CU count, or unset GPU_ARCHS)"
                )
            modules = self._module_plans(
                jit,
                sources,
                rules=rules_in,
                memory=memory,
                choice=choice,
                losers=losers,
                modules_seen=modules_seen,
            )
        else:
            problems.append(f"target unknown: {choice.error}; nothing is checked or healed")
        return plan.EnvPlan(
            label,
            environment.name,
            jit,
            str(choice),
            resolutions,
            tuple(sources),
            tuple(modules),
            tuple(problems),
            checked=checked,
            rules=f"aiter {found.version or 'version unknown'}, rules {ruleset.name} "
            f"(chosen by {chosen.how})",
            rules_note=chosen.note,
        )

    def _merge(
        self, read: list[plan.TableSource], context: tuple[str, ...]
    ) -> tuple[dict[PurePath, frozenset[int]], int]:
        """The duplicate-shape merge of ``read`` (in order), computed once per change of them
        (``context``: the targets and key columns they were read for)."""
        files = [(s.file.path, s.table) for s in read if s.table is not None]
        key = (context, *((str(path), table.digest) for path, table in files))
        found = self._merges.get(key)
        if found is None:
            found = plan.merge_losers(files)
        self._merges_used[key] = found
        return found

    def _merge_keys(self, configs: Path, stem: str) -> tuple[str, ...]:
        """aiter's duplicate-merge keys: the untuned sibling's columns + cu_num + gfx; none
        (no merge) when the untuned file is absent."""
        path = configs / f"{'untuned'.join(stem.rsplit('tuned', 1))}.csv"
        ident = _identity(path)
        cached = self._untuned.get(path)
        if cached is not None and cached[0] == ident:
            return cached[1]
        keys: tuple[str, ...] = ()
        if ident is not None:
            try:
                with path.open("rb") as fh:
                    head = fh.readline(65536).decode("utf-8-sig", errors="replace")
                cols = [c.strip() for c in head.strip().split(",") if c.strip()]
                keys = tuple(dict.fromkeys([*cols, "cu_num", "gfx"]))
            except OSError:
                keys = ()
        self._untuned[path] = (ident, keys)
        return keys

    def _module_plans(
        self,
        jit: Path,
        sources: list[plan.TableSource],
        *,
        rules: routing.Routing,
        memory: dict[str, plan.MemoryEntry],
        choice: target.TargetChoice,
        losers: dict[PurePath, frozenset[int]],
        modules_seen: list[Path],
    ) -> list[plan.ModulePlan]:
        """The verdict for every module the tables need, from what each ``.so`` registered."""
        key = (
            str(choice),
            *((str(s.file.path), s.route.stem, s.table.digest) for s in sources if s.table),
            *sorted((str(p), tuple(sorted(lines))) for p, lines in losers.items()),
        )
        needs = self._needs.get(key)
        if needs is None:  # an unchanged tree costs no pass over its rows
            needs = plan.module_needs(
                sources, lookup=choice.lookup, compiled=choice.compiled, losers=losers
            )
        self._needs_used[key] = needs
        modules: list[plan.ModulePlan] = []
        for module in sorted(needs):
            so = jit / f"{module}.so"
            keyed = rules.by_module(module)[0].keyed
            if keyed is routing.Keyed.ID:  # nothing to read: ids are not strings in the file
                modules.append(
                    plan.decide(
                        module,
                        keyed=keyed,
                        needs=needs[module],
                        facts=plan.ModuleFacts(so, exists=so.exists()),
                        digest="",
                        memory=None,
                        heal_shape_keyed=False,
                    )
                )
                continue
            modules_seen.append(so)
            wanted = [*needs[module].names, *needs[module].unbuildable]
            try:
                scan = self.registry.scan(so, wanted)
                facts = (
                    plan.ModuleFacts(so, exists=False)
                    if scan is None
                    else plan.ModuleFacts(so, exists=True, registered=scan.registered)
                )
            except OSError as exc:
                facts = plan.ModuleFacts(so, exists=True, error=exc.strerror or str(exc))
            modules.append(
                plan.decide(
                    module,
                    keyed=keyed,
                    needs=needs[module],
                    facts=facts,
                    digest=plan.module_digest(module, sources, str(choice)),
                    memory=memory.get(str(so)),
                    heal_shape_keyed=self.settings.aiter.heal_shape_keyed,
                )
            )
        return modules

    def _table(
        self,
        file: resolve.ResolvedFile,
        route: routing.TableRoute,
        targets: frozenset[tables.Target],
        used: dict[_TableKey, plan.TableSource],
        keys: tuple[str, ...],
    ) -> plan.TableSource:
        path = Path(file.path)
        try:
            st = path.stat()
        except OSError as exc:
            return plan.TableSource(file, route, error=exc.strerror or str(exc))
        identity = fsio.identity_of(st)
        key = ((str(path), identity), route.stem, targets, keys)
        cached = used.get(key) or self._tables.get(key)
        disk_key = tablecache.key_of(path, identity, route, targets, keys)
        if cached is None and (on_disk := self.table_cache.get(disk_key)) is not None:
            cached = plan.TableSource(file, route, table=on_disk)
        if cached is None:
            try:
                read_at = tablecache.now_ns()
                data = path.read_bytes()
                self.table_reads += 1
                table = tables.parse_table(data, route=route, targets=targets, key_columns=keys)
                cached = plan.TableSource(file, route, table=table)
                if tablecache.settled(st, read_at_ns=read_at) and len(data) == st.st_size:
                    self.table_cache.put(disk_key, table)
            except OSError as exc:
                cached = plan.TableSource(file, route, error=exc.strerror or str(exc))
            except tables.TableUnreadable as exc:
                cached = plan.TableSource(file, route, error=str(exc))
        elif cached.file != file:
            cached = plan.TableSource(file, route, cached.table, cached.error)
        used[key] = cached
        return cached


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return fsio.identity_of(path.stat())
    except OSError:
        return None


def _fixed_files(configs: Path, patterns: tuple[str, ...]) -> list[resolve.ResolvedFile]:
    """The files fixed globs under ``configs/`` name (sorted, as aiter's generator globs them)."""
    found: list[resolve.ResolvedFile] = []
    for pattern in patterns:
        found.extend(
            resolve.ResolvedFile(p, resolve.Origin.FIXED, exists=True)
            for p in sorted(configs.glob(pattern))
            if p.is_file()
        )
    return list({f.path: f for f in found}.values())


def _read_slot(path: Path) -> SlotEnv:
    name = path.stem
    try:
        text = store.read_slot(path).data.decode("utf-8")
        return SlotEnv(name, dict(document.parse_slot(text, stem=name).server_env))
    except (OSError, UnicodeDecodeError, ReconcilerError) as exc:
        return SlotEnv(name, None, str(exc))
