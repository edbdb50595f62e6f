"""The plan: per environment and module, covered / not built / uncovered, and what to do.  [pure]

Kept apart from ``heal.py`` (which moves files) so the decision is testable as a table:
facts in, records with reasons out. The records and what the loaded tables ask of each module
are here; one module's verdict is ``verdict.decide``'s (the decision table, with the
convergence guard).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.rules import sets as rules
from hal0_reconciler.aiter.tables import resolve
from hal0_reconciler.aiter.tables import rows as tables


class Status(enum.StrEnum):
    COVERED = "covered"
    NOT_BUILT = "not-built"  # no module_<name>.so: aiter builds it from the current tables
    UNCOVERED = "uncovered"
    UNREADABLE = "unreadable"  # the .so exists but could not be read
    UNVERIFIABLE = "unverifiable"  # id- or shape-keyed: the .so does not show what it registered


class Action(enum.StrEnum):
    NONE = "none"
    HEAL = "heal"  # invalidate: quarantine the .so and build/<module>/
    WARN = "warn"  # kept for old memory and status readers: no verdict asks for it any more
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
    fatal: tuple[str, ...] = ()  # the boot dies at a first lookup: the variable and why
    handled_as: str = ""  # whose credentials the tree's files were handled with
    notes: tuple[str, ...] = ()  # what aiter does as a matter of course (info, not a problem)

    @property
    def fatal_boot(self) -> bool:
        return bool(self.fatal)

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


def duplicate_rows(
    res: resolve.Resolution, lost: Mapping[PurePath, frozenset[int]]
) -> dict[str, list[Broken]]:
    """module → rows of an unmerged file (one path, read as it is) that repeat another row's
    shape: aiter's lookup raises 'index must be unique' on every boot; no rebuild fixes it."""
    if res.merged or not lost:
        return {}
    out: dict[str, list[Broken]] = {}
    for path, lines in sorted(lost.items()):
        for line in sorted(lines):
            for module in sorted(set(res.route.modules.values())):
                out.setdefault(module, []).append(Broken(path, line, DUPLICATE_SHAPE))
    return out


DUPLICATE_SHAPE = (
    "repeats the shape of another row in this file, which aiter loads unmerged: its lookup "
    "raises 'index must be unique' on every boot; no rebuild fixes it (delete one of the rows)"
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
