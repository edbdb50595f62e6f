"""One module's verdict as a table: named conditions in order, the first that holds wins.  [pure]

The facts a verdict looks at are read once into a ``Case`` (the costly readings, such as which
needed names the ``.so`` lacks, only when a row asks for them); ``TABLE`` says, row by row, which
condition gives which status and action; ``decide`` picks the first row that holds and builds the
plan. Two rules then apply to every row alike (``_settled``): a broken row, or a name no rebuild
can add, makes a quiet verdict or a heal a matter for the operator, since a rebuild would fail
on the broken row or still lack the name.

Only names a rebuild from the current tables can provide ever ask for a heal: never rows that
lose the merge, rows looked up on a target the build does not compile, or broken rows. The
convergence guard is two rows: a module healed (or restored) for the same tables and target
that still misses the same names is not invalidated again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from hal0_reconciler.aiter.decision.plan import (
    Action,
    MemoryEntry,
    Missing,
    ModuleFacts,
    ModulePlan,
    Needs,
    Status,
)
from hal0_reconciler.aiter.rules import routing


@dataclass(frozen=True)
class Case:
    """What the verdict for one module is made from."""

    keyed: routing.Keyed
    needs: Needs
    facts: ModuleFacts
    digest: str  # tables + target this verdict is made for (the convergence guard's key)
    memory: MemoryEntry | None  # what the last heal or restore of this module remembered

    @property
    def needed(self) -> int:
        """Distinct names the loaded tables route to this module."""
        return len(self.needs.names) + len(self.needs.unbuildable)

    @cached_property
    def lookup_only(self) -> tuple[Missing, ...]:
        """Every name looked up only on a target the build never compiles."""
        return tuple(Missing(n, tuple(r)) for n, r in sorted(self.needs.unbuildable.items()))

    @cached_property
    def missing(self) -> tuple[Missing, ...]:
        """Names a rebuild provides that the ``.so`` did not register."""
        registered = self.facts.registered
        return tuple(
            Missing(n, tuple(refs))
            for n, refs in sorted(self.needs.names.items())
            if not registered.get(n, False)
        )

    @cached_property
    def unbuildable(self) -> tuple[Missing, ...]:
        """Names no rebuild provides that the ``.so`` did not register either."""
        return tuple(m for m in self.lookup_only if not self.facts.registered.get(m.name, False))

    @cached_property
    def remembered(self) -> MemoryEntry | None:
        """The memory that still speaks for this module: none when the very file a heal
        quarantined is back (a rename undone, e.g. by a power cut)."""
        memory = self.memory
        if (
            memory is not None
            and memory.kind == "healed"
            and memory.identity is not None
            and memory.identity == self.facts.identity
        ):
            return None
        return memory

    @property
    def seen_before(self) -> bool:
        """Healed or restored already for these tables and target, missing no new name."""
        memory = self.remembered
        names = frozenset(m.name for m in self.missing)
        return memory is not None and memory.digest == self.digest and names <= memory.missing


# -- the conditions, in the order the table asks them -------------------------------------------
def id_keyed_not_built(c: Case) -> bool:
    return c.keyed is routing.Keyed.ID and not c.facts.exists


def id_keyed(c: Case) -> bool:
    return c.keyed is routing.Keyed.ID


def not_built(c: Case) -> bool:
    return not c.facts.exists


def unreadable(c: Case) -> bool:
    return c.facts.error is not None


def shape_keyed(c: Case) -> bool:
    return c.keyed is routing.Keyed.SHAPE


def covered(c: Case) -> bool:
    return not c.missing and not c.unbuildable


def only_unbuildable_missing(c: Case) -> bool:
    return not c.missing


def restored_for_these_tables(c: Case) -> bool:
    return c.seen_before and c.remembered is not None and c.remembered.kind == "restored"


def healed_for_these_tables(c: Case) -> bool:
    return c.seen_before


def otherwise(c: Case) -> bool:
    del c
    return True


# -- what each row says -------------------------------------------------------------------------
def _id_not_built(c: Case) -> str:
    del c
    return (
        "not built yet: aiter builds it from the current tables on first use (by kernel "
        "id, which the file does not show afterwards either)"
    )


def _id_unverifiable(c: Case) -> str:
    return (
        f"{c.needed} kernel id(s) route here; the module "
        "keeps ids as integers in a lookup table, not as strings, so whether it compiled "
        "them cannot be verified from the file (never healed; a miss raises 'Kernel id N "
        "not found in ... tune lookup table')"
    )


def _not_built(c: Case) -> str:
    del c
    return "not built yet: aiter builds it from the current tables on first use"


NOT_CHECKED = "not checked:"
"""How a module the check would not read starts its reason (too large, sparse, keeps
changing, past the check's budget): degraded, never healed."""


def _unreadable(c: Case) -> str:
    error = str(c.facts.error)
    if error.startswith(NOT_CHECKED):
        return error
    return f"cannot read the module: {error}"


def _shape_unverifiable(c: Case) -> str:
    return (
        f"shape-keyed: {c.needed} kernel name(s) route "
        "here, but the module holds a shape -> instance map whose keys are integers, with "
        "names only inside mangled symbols; whether it compiled each shape cannot be read "
        "from the file (not verifiable, never healed; a missing shape falls back silently "
        "to a slower kernel)"
    )


def _covered(c: Case) -> str:
    return f"all {len(c.needs.names)} kernel name(s) the tables route here are registered"


def _only_unbuildable(c: Case) -> str:
    return (
        f"{len(c.unbuildable)} kernel(s) are looked up only in rows for a target the build "
        "does not compile: a rebuild cannot add them (see the target line)"
    )


def _held(c: Case) -> str:
    quarantine = c.remembered.quarantine if c.remembered is not None else ""
    return (
        f"restored by the operator from quarantine {quarantine}; "
        "left alone until the tables or the target change"
    )


def _stuck(c: Case) -> str:
    quarantine = c.remembered.quarantine if c.remembered is not None else ""
    return (
        f"already invalidated in quarantine {quarantine} for these tables "
        "and target, and the rebuild still lacks these kernels: rebuilding cannot "
        "produce them"
    )


def _heal(c: Case) -> str:
    return (
        f"{len(c.missing)} name-keyed kernel(s) missing: the server crashes at load or graph "
        "capture"
    )


class Names(enum.StrEnum):
    """Which names a row's plan lists as missing and as unbuildable."""

    NONE = "none"  # nothing was compared: the file does not show what it registered
    LOOKUP_ONLY = "lookup-only"  # not built: every name looked up only where nothing compiles
    UNREGISTERED = "unregistered"  # compared with the file: what it lacks, of either kind


@dataclass(frozen=True)
class Row:
    when: Callable[[Case], bool]
    status: Status
    action: Action
    reason: Callable[[Case], str]
    names: Names = Names.NONE


S, A, N = Status, Action, Names
TABLE: tuple[Row, ...] = (
    Row(id_keyed_not_built, S.NOT_BUILT, A.NONE, _id_not_built),
    Row(id_keyed, S.UNVERIFIABLE, A.NONE, _id_unverifiable),
    Row(not_built, S.NOT_BUILT, A.NONE, _not_built, N.LOOKUP_ONLY),
    Row(unreadable, S.UNREADABLE, A.NONE, _unreadable),
    Row(shape_keyed, S.UNVERIFIABLE, A.NONE, _shape_unverifiable),
    Row(covered, S.COVERED, A.NONE, _covered, N.UNREGISTERED),
    Row(only_unbuildable_missing, S.UNCOVERED, A.OPERATOR, _only_unbuildable, N.UNREGISTERED),
    Row(restored_for_these_tables, S.UNCOVERED, A.HELD, _held, N.UNREGISTERED),
    Row(healed_for_these_tables, S.UNCOVERED, A.STUCK, _stuck, N.UNREGISTERED),
    Row(otherwise, S.UNCOVERED, A.HEAL, _heal, N.UNREGISTERED),
)
"""The first row whose condition holds gives the verdict (the last always holds)."""
del S, A, N


def row_for(case: Case) -> Row:
    """The row of ``TABLE`` that decides ``case``."""
    return next(row for row in TABLE if row.when(case))


def _names(case: Case, which: Names) -> tuple[tuple[Missing, ...], tuple[Missing, ...]]:
    """The (missing, unbuildable) names a plan of this row lists."""
    if which is Names.LOOKUP_ONLY:
        return (), case.lookup_only
    if which is Names.UNREGISTERED:
        return case.missing, case.unbuildable
    return (), ()


def _settled(
    action: Action, reason: str, case: Case, unbuildable: tuple[Missing, ...]
) -> tuple[Action, str]:
    """The rules for every row: a broken row fails a rebuild (the module would be lost), and a
    quiet verdict with names no rebuild adds still needs the operator; broken rows are named."""
    broken = case.needs.broken
    if (action is Action.NONE and unbuildable) or (
        broken and action in {Action.NONE, Action.HEAL, Action.WARN}
    ):
        action = Action.OPERATOR
    if broken:
        reason += (
            f"; {len(broken)} broken row(s) no rebuild fixes "
            f"(first {broken[0].table}:{broken[0].line})"
        )
    return action, reason


def decide(
    module: str,
    *,
    keyed: routing.Keyed,
    needs: Needs,
    facts: ModuleFacts,
    digest: str,
    memory: MemoryEntry | None,
    heal_shape_keyed: bool = False,  # deprecated and ignored: shape-keyed modules are never healed
) -> ModulePlan:
    """The verdict for one module and the action that follows from it (``TABLE``)."""
    del heal_shape_keyed
    case = Case(keyed, needs, facts, digest, memory)
    row = row_for(case)
    missing, unbuildable = _names(case, row.names)
    action, reason = _settled(row.action, row.reason(case), case, unbuildable)
    return ModulePlan(
        module,
        facts.so_path,
        keyed,
        row.status,
        action,
        case.needed,
        missing,
        digest,
        reason,
        unbuildable,
        tuple(needs.broken),
        needs.merged_away,
    )
