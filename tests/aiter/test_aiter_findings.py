"""What a check found is logged once, when it first appears, and a module covered again is said."""

from __future__ import annotations

from pathlib import PurePath

from structlog.testing import capture_logs

from hal0_reconciler.aiter import findings, survey
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.rules import routing

SO = PurePath("/jit/module_x.so")
TABLE = PurePath("/configs/t.csv")


def _module(status: plan.Status, action: plan.Action, *, broken=()) -> plan.ModulePlan:
    missing = (
        (plan.Missing("k1", (plan.Reference(TABLE, 2),)),)
        if status is plan.Status.UNCOVERED
        else ()
    )
    return plan.ModulePlan(
        "module_x",
        SO,
        routing.Keyed.NAME,
        status,
        action,
        1,
        missing,
        "d1",
        f"{status} because",
        broken=tuple(plan.Broken(TABLE, line, "blank kernelName") for line in broken),
    )


def _plan(*modules: plan.ModulePlan, problems=(), fatal=(), notes=()) -> plan.EnvPlan:
    return plan.EnvPlan(
        "tree",
        "base",
        PurePath("/jit"),
        "gfx950:256",
        (),
        (),
        modules,
        problems=problems,
        rules="v0.1.15",
        fatal=fatal,
        handled_as="owner aiter (uid 808)",
        notes=notes,
    )


def _said(f: findings.Findings, plans, slots=()) -> list[tuple[str, str]]:
    with capture_logs() as logs:
        f.say(plans, slots)
    return [(e["event"], e["log_level"]) for e in logs]


def test_a_finding_is_said_once_and_again_only_after_it_went_away():
    """The same plans twice: the second check is silent; once a finding is gone and back, it is
    said again."""
    f = findings.Findings()
    uncovered = _plan(_module(plan.Status.UNCOVERED, plan.Action.HEAL), problems=("p",))
    first = _said(f, [uncovered])
    assert [
        ("aiter.rules_chosen", "info"),
        ("aiter.tree_handled", "info"),
        ("aiter.config_problem", "warning"),
        ("aiter.module_uncovered", "error"),
    ] == first
    assert [] == _said(f, [uncovered])
    assert ("aiter.module_covered", "info") in _said(
        f, [_plan(_module(plan.Status.COVERED, plan.Action.NONE))]
    )
    assert [("aiter.config_problem", "warning"), ("aiter.module_uncovered", "error")] == _said(
        f, [uncovered]
    )


def test_a_covered_module_never_uncovered_is_not_said():
    """Covered from the start: nothing to say about the module."""
    f = findings.Findings()
    events = _said(f, [_plan(_module(plan.Status.COVERED, plan.Action.NONE))])
    assert [] == [e for e, _ in events if e.startswith("aiter.module_")]


def test_fatal_problems_broken_rows_and_guards_have_their_own_events():
    """A fatal problem is an error of its own, a broken row is named, the guard's verdicts are
    not-converging (error) and held (warning); a note is info."""
    f = findings.Findings()
    stuck = _module(plan.Status.UNCOVERED, plan.Action.STUCK, broken=(7,))
    events = _said(f, [_plan(stuck, problems=("dies", "odd"), fatal=("dies",), notes=("n",))])
    assert [
        ("aiter.rules_chosen", "info"),
        ("aiter.tree_handled", "info"),
        ("aiter.boot_fatal", "error"),
        ("aiter.config_problem", "warning"),
        ("aiter.config_noted", "info"),
        ("aiter.table_row_broken", "error"),
        ("aiter.heal_not_converging", "error"),
    ] == events
    held = _module(plan.Status.UNCOVERED, plan.Action.HELD)
    assert ("aiter.module_held", "warning") in _said(f, [_plan(held)])


def test_an_unreadable_slot_and_unreadable_routing_are_said_once():
    """A slot file that cannot be read is a warning once; routing data that cannot be read is an
    error once, and forgets every other finding."""
    f = findings.Findings()
    slot = survey.SlotEnv("a", None, "Permission denied")
    assert [("aiter.slot_unreadable", "warning")] == _said(f, [], [slot])
    assert [] == _said(f, [], [slot])
    with capture_logs() as logs:
        f.routing_unreadable("bad toml")
        f.routing_unreadable("bad toml")
    assert ["aiter.routing_unreadable"] == [e["event"] for e in logs]
    assert [("aiter.slot_unreadable", "warning")] == _said(f, [], [slot])
