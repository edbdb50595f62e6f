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

from hal0_reconciler.aiter import resolve, routing, tables


class Status(enum.StrEnum):
    COVERED = "covered"
    NOT_BUILT = "not-built"  # no module_<name>.so: aiter builds it from the current tables
    UNCOVERED = "uncovered"
    UNREADABLE = "unreadable"  # the .so exists but could not be read


class Action(enum.StrEnum):
    NONE = "none"
    HEAL = "heal"  # invalidate: quarantine the .so and build/<module>/
    WARN = "warn"  # shape-keyed miss: slow fallback, healing it is a setting
    STUCK = "not-converging"  # healed for these tables and target already; rebuilding cannot help
    HELD = "held"  # the operator restored this module; left alone until tables or target change


@dataclass(frozen=True)
class Reference:
    table: PurePath
    line: int


@dataclass(frozen=True)
class Missing:
    name: str
    refs: tuple[Reference, ...]


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


@dataclass(frozen=True)
class MemoryEntry:
    """What a heal (or restore) remembered for one module."""

    digest: str
    missing: frozenset[str]
    kind: str  # "healed" | "restored"
    quarantine: str


@dataclass(frozen=True)
class ModulePlan:
    module: str
    so_path: PurePath
    keyed: routing.Keyed
    status: Status
    action: Action
    needed: int  # distinct names the loaded tables route to this module
    missing: tuple[Missing, ...]
    digest: str  # tables + target this verdict was made for (the convergence guard's key)
    reason: str


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

    @property
    def heal_pending(self) -> bool:
        return any(m.action is Action.HEAL for m in self.modules)


def needed_names(sources: Iterable[TableSource]) -> dict[str, dict[str, list[Reference]]]:
    """module → kernel name → the table rows that name it."""
    needs: dict[str, dict[str, list[Reference]]] = {}
    for src in sources:
        if src.table is None:
            continue
        for row in src.table.rows:
            needs.setdefault(row.module, {}).setdefault(row.name, []).append(
                Reference(src.file.path, row.line)
            )
    return needs


def module_digest(module: str, sources: Iterable[TableSource], target: str) -> str:
    """A digest of the tables that feed ``module`` (path + content) and the target."""
    h = hashlib.sha256(f"{module}\0{target}\0".encode())
    for src in sorted(sources, key=lambda s: str(s.file.path)):
        if module in src.route.modules.values():
            content = src.table.digest if src.table is not None else f"error:{src.error}"
            h.update(f"{src.file.path}\0{content}\0".encode())
    return h.hexdigest()


def decide(
    module: str,
    *,
    keyed: routing.Keyed,
    needs: Mapping[str, Sequence[Reference]],
    facts: ModuleFacts,
    digest: str,
    memory: MemoryEntry | None,
    heal_shape_keyed: bool,
) -> ModulePlan:
    """The verdict for one module and the action that follows from it."""

    def verdict(
        status: Status, action: Action, reason: str, missing: tuple[Missing, ...] = ()
    ) -> ModulePlan:
        return ModulePlan(
            module, facts.so_path, keyed, status, action, len(needs), missing, digest, reason
        )

    if not facts.exists:
        return verdict(
            Status.NOT_BUILT,
            Action.NONE,
            "not built yet: aiter builds it from the current tables on first use",
        )
    if facts.error is not None:
        return verdict(Status.UNREADABLE, Action.NONE, f"cannot read the module: {facts.error}")
    missing = tuple(
        Missing(n, tuple(needs[n])) for n in sorted(needs) if not facts.registered.get(n, False)
    )
    if not missing:
        return verdict(
            Status.COVERED,
            Action.NONE,
            f"all {len(needs)} kernel name(s) the tables route here are registered",
        )
    names = frozenset(m.name for m in missing)
    if memory is not None and memory.digest == digest and names <= memory.missing:
        if memory.kind == "restored":
            return verdict(
                Status.UNCOVERED,
                Action.HELD,
                f"restored by the operator from quarantine {memory.quarantine}; "
                "left alone until the tables or the target change",
                missing,
            )
        return verdict(
            Status.UNCOVERED,
            Action.STUCK,
            f"already invalidated in quarantine {memory.quarantine} for these tables "
            "and target, and the rebuild still lacks these kernels: rebuilding cannot "
            "produce them",
            missing,
        )
    if keyed is routing.Keyed.NAME:
        return verdict(
            Status.UNCOVERED,
            Action.HEAL,
            f"{len(missing)} name-keyed kernel(s) missing: the server crashes at load "
            "or graph capture",
            missing,
        )
    if heal_shape_keyed:
        return verdict(
            Status.UNCOVERED,
            Action.HEAL,
            f"{len(missing)} shape-keyed kernel(s) missing (heal_shape_keyed is on)",
            missing,
        )
    return verdict(
        Status.UNCOVERED,
        Action.WARN,
        f"{len(missing)} shape-keyed kernel(s) missing: silent slow fallback "
        "(healing it is the setting heal_shape_keyed)",
        missing,
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
