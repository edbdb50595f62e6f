"""One module's verdict, row by row of the decision table: facts in, status, action and names out."""

from __future__ import annotations

from pathlib import PurePath

import pytest

from hal0_reconciler.aiter.decision import plan, verdict
from hal0_reconciler.aiter.rules import routing

SO = PurePath("/jit/module_x.so")
TABLE = PurePath("/configs/t.csv")
IDENTITY = (1, 2, 3, 4)


def _needs(names=("a", "b"), unbuildable=(), broken=()) -> plan.Needs:
    return plan.Needs(
        names={n: [plan.Reference(TABLE, i + 2)] for i, n in enumerate(names)},
        unbuildable={n: [plan.Reference(TABLE, i + 20)] for i, n in enumerate(unbuildable)},
        broken=[plan.Broken(TABLE, line, "blank kernelName") for line in broken],
    )


def _facts(registered=(), *, exists=True, error=None) -> plan.ModuleFacts:
    return plan.ModuleFacts(
        SO,
        exists=exists,
        registered=dict.fromkeys(registered, True),
        error=error,
        identity=IDENTITY,
    )


def _decide(needs, facts, *, keyed=routing.Keyed.NAME, memory=None) -> plan.ModulePlan:
    return verdict.decide(
        "module_x", keyed=keyed, needs=needs, facts=facts, digest="d1", memory=memory
    )


def _missing(p: plan.ModulePlan) -> tuple[list[str], list[str]]:
    return [m.name for m in p.missing], [m.name for m in p.unbuildable]


@pytest.mark.parametrize(
    ("keyed", "facts", "status"),
    [
        (routing.Keyed.ID, _facts(exists=False), plan.Status.NOT_BUILT),
        (routing.Keyed.ID, _facts(), plan.Status.UNVERIFIABLE),
        (routing.Keyed.NAME, _facts(exists=False), plan.Status.NOT_BUILT),
        (routing.Keyed.NAME, _facts(error="Permission denied"), plan.Status.UNREADABLE),
        (routing.Keyed.SHAPE, _facts(), plan.Status.UNVERIFIABLE),
        (routing.Keyed.NAME, _facts(["a", "b"]), plan.Status.COVERED),
    ],
    ids=["id-not-built", "id", "not-built", "unreadable", "shape", "covered"],
)
def test_a_module_whose_file_cannot_miss_a_buildable_name_is_left_alone(keyed, facts, status):
    """Not built, unreadable, id- or shape-keyed, or registering every name: no action, and no
    name listed as missing, whatever the tables ask."""
    p = _decide(_needs(), facts, keyed=keyed)
    assert (status, plan.Action.NONE, ([], [])) == (p.status, p.action, _missing(p))
    assert 2 == p.needed, "the names the tables route here are counted in every verdict"


def test_a_not_built_module_with_names_no_build_compiles_is_for_the_operator():
    """Not built yet, but the tables look names up only on a target the build never compiles:
    every such name is listed, and no rebuild helps."""
    p = _decide(_needs(unbuildable=["u1", "u2"]), _facts(exists=False))
    assert (plan.Status.NOT_BUILT, plan.Action.OPERATOR) == (p.status, p.action)
    assert ([], ["u1", "u2"]) == _missing(p)


def test_a_built_module_missing_only_names_no_build_compiles_is_for_the_operator():
    """Every buildable name registered, one lookup-only name missing (the other registered):
    uncovered, fix-tables, and only the unregistered one is listed."""
    p = _decide(_needs(unbuildable=["u1", "u2"]), _facts(["a", "b", "u2"]))
    assert (plan.Status.UNCOVERED, plan.Action.OPERATOR) == (p.status, p.action)
    assert ([], ["u1"]) == _missing(p)
    assert p.reason.startswith("1 kernel(s) are looked up only")


def test_a_built_module_missing_a_buildable_name_is_healed():
    """A name a rebuild provides is not registered: heal, naming that one kernel."""
    p = _decide(_needs(), _facts(["a"]))
    assert (plan.Status.UNCOVERED, plan.Action.HEAL, (["b"], [])) == (
        p.status,
        p.action,
        _missing(p),
    )
    assert p.reason.startswith("1 name-keyed kernel(s) missing")


def _memory(kind: str, *, digest="d1", missing=("b",), identity=None) -> plan.MemoryEntry:
    return plan.MemoryEntry(digest, frozenset(missing), kind, "q-7", identity)


@pytest.mark.parametrize(
    ("memory", "action"),
    [
        (_memory("healed"), plan.Action.STUCK),
        (_memory("restored"), plan.Action.HELD),
        (_memory("healed", missing=("b", "c")), plan.Action.STUCK),
        (_memory("healed", digest="d0"), plan.Action.HEAL),
        (_memory("restored", digest="d0"), plan.Action.HEAL),
        (_memory("healed", missing=("c",)), plan.Action.HEAL),
        (_memory("healed", identity=IDENTITY), plan.Action.HEAL),
        (_memory("restored", identity=IDENTITY), plan.Action.HELD),
        (_memory("healed", identity=(9, 9, 9, 9)), plan.Action.STUCK),
    ],
    ids=[
        "healed",
        "restored",
        "healed-for-more",
        "healed-other-tables",
        "restored-other-tables",
        "new-name",
        "quarantined-file-back",
        "restored-file-same",
        "healed-other-file",
    ],
)
def test_a_module_healed_or_restored_for_these_tables_is_not_healed_again(memory, action):
    """The convergence guard: the same tables and target, no new missing name, and not the very
    file the heal quarantined back in place: held (restored) or not converging (healed)."""
    p = _decide(_needs(), _facts(["a"]), memory=memory)
    assert (plan.Status.UNCOVERED, action, (["b"], [])) == (p.status, p.action, _missing(p))
    if action is not plan.Action.HEAL:
        assert "quarantine q-7" in p.reason


@pytest.mark.parametrize(
    ("facts", "keyed", "action"),
    [
        (_facts(["a"]), routing.Keyed.NAME, plan.Action.OPERATOR),  # a heal would lose it
        (_facts(["a", "b"]), routing.Keyed.NAME, plan.Action.OPERATOR),
        (_facts(), routing.Keyed.SHAPE, plan.Action.OPERATOR),
        (_facts(["a"]), routing.Keyed.NAME, plan.Action.STUCK),
    ],
    ids=["missing", "covered", "shape", "stuck"],
)
def test_a_broken_row_makes_a_quiet_verdict_or_a_heal_the_operators(facts, keyed, action):
    """A broken row fails any rebuild: a heal or a quiet verdict becomes fix-tables, a guard's
    verdict stays; the reason names how many rows and the first one's file and line."""
    memory = _memory("healed") if action is plan.Action.STUCK else None
    p = _decide(_needs(broken=[7, 9]), facts, keyed=keyed, memory=memory)
    assert action == p.action
    assert p.reason.endswith(f"; 2 broken row(s) no rebuild fixes (first {TABLE}:7)")
    assert 2 == len(p.broken)


def test_every_verdict_comes_from_one_row_of_the_table_and_the_last_always_holds():
    """The table's last row holds for any case, so every module gets a verdict."""
    case = verdict.Case(routing.Keyed.NAME, _needs(), _facts(["a"]), "d1", None)
    assert verdict.TABLE[-1] is verdict.row_for(case)
    assert plan.Action.HEAL == verdict.TABLE[-1].action


@pytest.mark.parametrize(
    "why",
    [
        "not checked: module too large (2147483648 bytes, over module_max_bytes = 1073741824)",
        "not checked: sparse module (holes before its end; 8589934592 bytes apparent)",
        "not checked: keeps changing (rewritten while read at 3 checks in a row)",
        "not checked: the check ran past its time budget",
    ],
)
def test_a_module_not_checked_says_why_in_its_own_words_and_is_never_healed(why):
    """A module the check would not read: its reason is the "not checked" words themselves
    (status and the daemon's degraded state match on them), unreadable, no action."""
    p = _decide(_needs(), _facts(error=why))
    assert (plan.Status.UNREADABLE, plan.Action.NONE, why) == (p.status, p.action, p.reason)
    assert p.reason.startswith(verdict.NOT_CHECKED)


def test_a_module_that_cannot_be_read_says_so_before_why():
    p = _decide(_needs(), _facts(error="rewritten while read; judged again at the next check"))
    assert "cannot read the module: rewritten while read; judged again at the next check" == (
        p.reason
    )
    assert not p.reason.startswith(verdict.NOT_CHECKED)


@pytest.mark.parametrize("keyed", list(routing.Keyed))
def test_a_module_not_built_yet_says_aiter_builds_it_on_first_use(keyed):
    """Not built yet: nothing is wrong, aiter builds it at its first use; an id-keyed module's
    reason adds that the file will not show its ids afterwards either."""
    p = _decide(_needs(), _facts(exists=False), keyed=keyed)
    assert p.reason.startswith(
        "not built yet: aiter builds it from the current tables on first use"
    )
    assert (keyed is routing.Keyed.ID) == ("by kernel id" in p.reason)
