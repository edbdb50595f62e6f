"""The plan: per environment and module, covered / not built / uncovered, and what to do.  [pure]

Kept apart from ``heal.py`` (which moves files) so the decision is testable as a table:
facts in, records with reasons out. The convergence guard lives here: a module healed for the
same tables and target that still misses the same names is not invalidated again.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from hal0_reconciler.aiter import resolve, routing, rules, tables


class Status(enum.StrEnum):
    COVERED = "covered"
    NOT_BUILT = "not-built"  # no module_<name>.so: aiter builds it from the current tables
    UNCOVERED = "uncovered"
    UNREADABLE = "unreadable"  # the .so exists but could not be read
    UNVERIFIABLE = "unverifiable"  # id-keyed (opus): the .so does not show what it registered


class Action(enum.StrEnum):
    NONE = "none"
    HEAL = "heal"  # invalidate: quarantine the .so and build/<module>/
    WARN = "warn"  # shape-keyed miss: slow fallback, healing it is a setting
    STUCK = "not-converging"  # healed for these tables and target already; rebuilding cannot help
    HELD = "held"  # the operator restored this module; left alone until tables or target change
    OPERATOR = "fix-tables"  # no rebuild fixes it: a table row or the environment must change


@dataclass(frozen=True)
class Reference:
    table: PurePath
    line: int


@dataclass(frozen=True)
class Missing:
    name: str
    refs: tuple[Reference, ...]


@dataclass(frozen=True)
class Broken:
    """A row no rebuild can make work (file:line and why)."""

    table: PurePath
    line: int
    reason: str


@dataclass
class Needs:
    """What the loaded tables ask of one module, sorted by what a rebuild can do about it.

    A name's references are any sequence: lists when computed, lazily decoded ones when read
    back from the derived cache (``needscache``; only a missing name's are ever looked at)."""

    names: dict[str, Sequence[Reference]] = field(default_factory=dict)  # looked up, compiled
    unbuildable: dict[str, Sequence[Reference]] = field(default_factory=dict)  # looked up only
    broken: list[Broken] = field(default_factory=list)
    merged_away: int = 0  # rows losing the duplicate-shape merge: never compiled, not needed


@dataclass(frozen=True)
class TableSource:
    """One file a boot loads, as read: the table, or why it could not be read."""

    file: resolve.ResolvedFile
    route: routing.TableRoute
    table: tables.Table | None = None
    error: str | None = None


@dataclass(frozen=True)
class ModuleFacts:
    """What is on disk for one module."""

    so_path: PurePath
    exists: bool
    registered: Mapping[str, bool] = field(default_factory=dict)
    error: str | None = None
    identity: tuple[int, int, int, int] | None = None  # (device, inode, size, mtime_ns)


@dataclass(frozen=True)
class MemoryEntry:
    """What a heal (or restore) remembered for one module."""

    digest: str
    missing: frozenset[str]
    kind: str  # "healed" | "restored"
    quarantine: str
    identity: tuple[int, int, int, int] | None = (
        None  # the quarantined .so's (dev, ino, size, mtime)
    )


@dataclass(frozen=True)
class ModulePlan:
    module: str
    so_path: PurePath
    keyed: routing.Keyed
    status: Status
    action: Action
    needed: int  # distinct names the loaded tables route to this module
    missing: tuple[Missing, ...]  # a rebuild from the current tables provides these
    digest: str  # tables + target this verdict was made for (the convergence guard's key)
    reason: str
    unbuildable: tuple[Missing, ...] = ()  # looked up on a target the build never compiles
    broken: tuple[Broken, ...] = ()
    merged_away: int = 0


@dataclass(frozen=True)
class EnvPlan:
    """The whole verdict for one environment of one tree."""

    tree: str
    environment: str
    jit_dir: PurePath | None
    target: str
    resolutions: tuple[resolve.Resolution, ...]
    sources: tuple[TableSource, ...]
    modules: tuple[ModulePlan, ...]
    problems: tuple[str, ...] = ()
    checked: bool = True  # False: the target is unknown, so nothing was checked or healed
    rules: str = ""  # the aiter version and rule set this plan followed
    rules_note: str | None = None  # why the rule set is a guess (said once per tree)
    handled_as: str = ""  # whose credentials the tree's files were handled with

    @property
    def heal_pending(self) -> bool:
        return any(m.action is Action.HEAL for m in self.modules)


def module_needs(
    sources: Iterable[TableSource],
    *,
    lookup: frozenset[tables.Target],
    compiled: frozenset[tables.Target],
    losers: Mapping[PurePath, frozenset[int]],
) -> dict[str, Needs]:
    """module → what the loaded rows ask of it: names the runtime looks up on ``lookup`` that a
    build for ``compiled`` provides, names looked up that no build row provides, broken rows.
    Rows losing the duplicate-shape merge (``losers``) and rows only compiled are not needed."""
    needs: dict[str, Needs] = {}
    names: dict[str, dict[str, list[Reference]]] = {}  # module -> name -> refs
    unbuildable: dict[str, dict[str, list[Reference]]] = {}
    apart = lookup != compiled
    built_names: dict[str, set[str]] = {}
    looked_up: list[tuple[tables.KernelRow, Reference]] = []
    for src in sources:
        if src.table is None:
            continue
        lost = losers.get(src.file.path, frozenset())
        for bad in src.table.broken:
            if bad.line not in lost:
                needs.setdefault(bad.module, Needs()).broken.append(
                    Broken(src.file.path, bad.line, bad.reason)
                )
        for row in src.table.rows:
            if row.line in lost:
                needs.setdefault(row.module, Needs()).merged_away += 1
            elif not apart:  # every row read is for the one target: looked up and compiled
                ref = Reference(src.file.path, row.line)
                needs.setdefault(row.module, Needs())
                names.setdefault(row.module, {}).setdefault(row.name, []).append(ref)
            else:
                if row.on(compiled):
                    built_names.setdefault(row.module, set()).add(row.name)
                if row.on(lookup):
                    looked_up.append((row, Reference(src.file.path, row.line)))
    for row, ref in looked_up:
        needs.setdefault(row.module, Needs())
        into = names if row.name in built_names.get(row.module, set()) else unbuildable
        into.setdefault(row.module, {}).setdefault(row.name, []).append(ref)
    for module, need in needs.items():
        need.names.update(names.get(module, {}))
        need.unbuildable.update(unbuildable.get(module, {}))
    return needs


def merge_losers(
    files: Sequence[tuple[PurePath, tables.Table]],
) -> tuple[dict[PurePath, frozenset[int]], int]:
    """aiter's duplicate-shape merge over ``files`` (in merge order): per key, the row with the
    lowest ``us`` wins (ties: the earlier row). Returns the losing lines per file and how many
    rows take part in duplicates."""
    entries = [
        (shape.us, order, path, shape)
        for order, (path, table) in enumerate(files)
        for shape in table.shapes
    ]
    entries.sort(key=lambda e: (e[0], e[1], e[3].line))
    seen: dict[tuple[str, ...], int] = {}
    losers: dict[PurePath, set[int]] = {}
    for _, _, path, shape in entries:
        seen[shape.key] = seen.get(shape.key, 0) + 1
        if seen[shape.key] > 1:
            losers.setdefault(path, set()).add(shape.line)
    in_duplicates = sum(n for n in seen.values() if n > 1)
    return {p: frozenset(lines) for p, lines in losers.items()}, in_duplicates


def module_digest(module: str, sources: Iterable[TableSource], target: str) -> str:
    """A digest of the tables that feed ``module`` (path + content) and the target."""
    h = hashlib.sha256(f"{module}\0{target}\0".encode())
    for src in sorted(sources, key=lambda s: str(s.file.path)):
        if module in src.route.modules.values():
            content = src.table.digest if src.table is not None else f"error:{src.error}"
            h.update(f"{src.file.path}\0{content}\0".encode())
    return h.hexdigest()


def merge_problem(
    res: resolve.Resolution,
    lost: Mapping[PurePath, frozenset[int]],
    in_duplicates: int,
    ruleset: rules.RuleSet,
) -> list[str]:
    """What the duplicate-shape merge does to this boot, under the installed aiter's rule."""
    if not lost:
        return []
    count = sum(len(v) for v in lost.values())
    files = ", ".join(f"{p.name} ({len(v)})" for p, v in sorted(lost.items()))
    if ruleset.dedup_merge is rules.DedupMerge.REWRITE_AND_RERUN:
        text = (
            f"{res.route.stem}: {in_duplicates} rows share a shape across the merged files: "
            f"this aiter stops the first boot ('Found {in_duplicates} duplicate shape "
            f"entries'), rewrites the source CSVs without the {count} slower row(s) ({files}) "
            "and asks for a re-run; those rows are not counted"
        )
    else:
        text = (
            f"{res.route.stem}: {count} row(s) lose the duplicate-shape merge ({files}): never "
            "compiled, not counted"
        )
    return [text]


def decide(
    module: str,
    *,
    keyed: routing.Keyed,
    needs: Needs,
    facts: ModuleFacts,
    digest: str,
    memory: MemoryEntry | None,
    heal_shape_keyed: bool,
) -> ModulePlan:
    """The verdict for one module and the action that follows from it.

    Only names a rebuild from the current tables can provide ever ask for a heal: never rows
    that lose the merge, rows looked up on a target the build does not compile, or broken rows.
    """
    broken = tuple(needs.broken)

    def verdict(
        status: Status,
        action: Action,
        reason: str,
        missing: tuple[Missing, ...] = (),
        unbuildable: tuple[Missing, ...] = (),
    ) -> ModulePlan:
        if action is Action.NONE and (broken or unbuildable):
            action = Action.OPERATOR
        if broken:
            reason += (
                f"; {len(broken)} broken row(s) no rebuild fixes "
                f"(first {broken[0].table}:{broken[0].line})"
            )
        return ModulePlan(
            module,
            facts.so_path,
            keyed,
            status,
            action,
            len(needs.names) + len(needs.unbuildable),
            missing,
            digest,
            reason,
            unbuildable,
            broken,
            needs.merged_away,
        )

    lookup_only = tuple(Missing(n, tuple(r)) for n, r in sorted(needs.unbuildable.items()))
    if keyed is routing.Keyed.ID and not facts.exists:
        return verdict(
            Status.NOT_BUILT,
            Action.NONE,
            "not built yet: aiter builds it from the current tables on first use (by kernel "
            "id, which the file does not show afterwards either)",
        )
    if keyed is routing.Keyed.ID:
        return verdict(
            Status.UNVERIFIABLE,
            Action.NONE,
            f"{len(needs.names) + len(needs.unbuildable)} kernel id(s) route here; the module "
            "keeps ids as integers in a lookup table, not as strings, so whether it compiled "
            "them cannot be verified from the file (never healed; a miss raises 'Kernel id N "
            "not found in ... tune lookup table')",
        )
    if not facts.exists:
        return verdict(
            Status.NOT_BUILT,
            Action.NONE,
            "not built yet: aiter builds it from the current tables on first use",
            unbuildable=lookup_only,
        )
    if facts.error is not None:
        return verdict(Status.UNREADABLE, Action.NONE, f"cannot read the module: {facts.error}")
    missing = tuple(
        Missing(n, tuple(refs))
        for n, refs in sorted(needs.names.items())
        if not facts.registered.get(n, False)
    )
    unbuildable = tuple(m for m in lookup_only if not facts.registered.get(m.name, False))
    if not missing and not unbuildable:
        return verdict(
            Status.COVERED,
            Action.NONE,
            f"all {len(needs.names)} kernel name(s) the tables route here are registered",
        )
    if not missing:
        return verdict(
            Status.UNCOVERED,
            Action.OPERATOR,
            f"{len(unbuildable)} kernel(s) are looked up only in rows for a target the build "
            "does not compile: a rebuild cannot add them (see the target line)",
            unbuildable=unbuildable,
        )
    names = frozenset(m.name for m in missing)
    if (
        memory is not None
        and memory.kind == "healed"
        and memory.identity is not None
        and memory.identity == facts.identity
    ):
        memory = None  # the very file quarantined is back (a rename undone, e.g. a power cut)
    if memory is not None and memory.digest == digest and names <= memory.missing:
        if memory.kind == "restored":
            return verdict(
                Status.UNCOVERED,
                Action.HELD,
                f"restored by the operator from quarantine {memory.quarantine}; "
                "left alone until the tables or the target change",
                missing,
                unbuildable,
            )
        return verdict(
            Status.UNCOVERED,
            Action.STUCK,
            f"already invalidated in quarantine {memory.quarantine} for these tables "
            "and target, and the rebuild still lacks these kernels: rebuilding cannot "
            "produce them",
            missing,
            unbuildable,
        )
    if keyed is routing.Keyed.NAME:
        return verdict(
            Status.UNCOVERED,
            Action.HEAL,
            f"{len(missing)} name-keyed kernel(s) missing: the server crashes at load "
            "or graph capture",
            missing,
            unbuildable,
        )
    if heal_shape_keyed:
        return verdict(
            Status.UNCOVERED,
            Action.HEAL,
            f"{len(missing)} shape-keyed kernel(s) missing (heal_shape_keyed is on)",
            missing,
            unbuildable,
        )
    return verdict(
        Status.UNCOVERED,
        Action.WARN,
        f"{len(missing)} shape-keyed kernel(s) missing: silent slow fallback "
        "(healing it is the setting heal_shape_keyed)",
        missing,
        unbuildable,
    )


def heal_set(plans: Iterable[EnvPlan]) -> dict[PurePath, dict[str, ModulePlan]]:
    """JIT folder → module → the plan that asks to heal it (once, whatever the environments)."""
    chosen: dict[PurePath, dict[str, ModulePlan]] = {}
    for env_plan in plans:
        if env_plan.jit_dir is None:
            continue
        for mod in env_plan.modules:
            if mod.action is Action.HEAL:
                chosen.setdefault(env_plan.jit_dir, {}).setdefault(mod.module, mod)
    return chosen
