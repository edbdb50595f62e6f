"""The aiter check's time budget, and the registry cache a restart finds.

A check past its budget leaves the modules it has not read as "not checked: the check ran past
its time budget" (never healed), the next check reads them; the daemon says it once and is
degraded meanwhile. A new monitor on the same state folder (a restarted daemon) reads no module
whose identity did not change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiter_support import BPS_CK, BPS_CKTILE
from structlog.testing import capture_logs

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.registry import cache as registry
from hal0_reconciler.daemon import selfheal, status
from helpers.clock import FakeClock


def _tree(make_tree: Any, built_modules: dict[str, Path]) -> Any:
    tree = make_tree()
    tree.install(BPS_CK, built_modules[BPS_CK])
    tree.install(BPS_CKTILE, built_modules["stale_cktile"])
    return tree


def _by_module(report: monitor.MonitorReport) -> dict[str, plan.ModulePlan]:
    return {m.module: m for p in report.plans for m in p.modules}


def test_past_the_budget_modules_wait_for_the_next_check_and_are_never_healed(
    make_tree: Any, built_modules: dict[str, Path]
) -> None:
    tree = _tree(make_tree, built_modules)
    spent = monitor.AiterMonitor(tree.settings(), log_findings=False, budget=0.0)
    report = spent.check(heal=True)
    late = _by_module(report)
    for name in (BPS_CK, BPS_CKTILE):
        assert (plan.Status.UNREADABLE, plan.Action.NONE, registry.OVER_BUDGET) == (
            late[name].status,
            late[name].action,
            late[name].reason,
        )
    assert report.over_budget
    assert f"base: {BPS_CK}: {registry.OVER_BUDGET}" in "\n".join(report.modules_not_checked)
    assert () == report.heals
    assert (tree.jit / f"{BPS_CKTILE}.so").exists()
    assert 0 == spent.surveyor.registry.reads
    spent.budget = 60.0  # the next check, within its budget, reads them
    again = spent.check(heal=False)
    read = _by_module(again)
    assert (plan.Status.COVERED, plan.Status.UNCOVERED) == (
        read[BPS_CK].status,
        read[BPS_CKTILE].status,
    )
    assert (False, ()) == (again.over_budget, again.modules_not_checked)


def test_a_restarted_monitor_reads_no_unchanged_module(
    make_tree: Any, built_modules: dict[str, Path]
) -> None:
    """The registry cache is in the state folder, keyed by file identity: a restart (a new
    monitor, a new process's worth of memory) stats each module and reads none; a rewritten
    module is read again."""
    tree = _tree(make_tree, built_modules)
    first = monitor.AiterMonitor(tree.settings(), log_findings=False)
    first.check(heal=False)
    assert 2 == first.surveyor.registry.reads
    assert (tree.state / "aiter" / "registry.json").is_file()
    restarted = monitor.AiterMonitor(tree.settings(), log_findings=False)
    report = restarted.check(heal=False)
    assert 0 == restarted.surveyor.registry.reads
    assert plan.Status.COVERED is _by_module(report)[BPS_CK].status
    ck = tree.jit / f"{BPS_CK}.so"
    ck.write_bytes(ck.read_bytes())  # same bytes, a new ctime
    third = monitor.AiterMonitor(tree.settings(), log_findings=False)
    third.check(heal=False)
    assert 1 == third.surveyor.registry.reads


def test_the_daemon_says_an_over_budget_check_once_is_degraded_and_retries(
    make_tree: Any, built_modules: dict[str, Path]
) -> None:
    tree = _tree(make_tree, built_modules)
    settings = tree.settings()
    budgets = iter([0.0, 0.0, 60.0])
    clock = FakeClock()
    heal = selfheal.SelfHeal(
        settings,
        factory=lambda s: monitor.AiterMonitor(s, budget=next(budgets)),
        clock=clock,
    )
    assert "not checked yet" == (heal.status() or {})["state"]

    def one_check() -> list[dict[str, Any]]:
        heal._monitor = None  # a new monitor takes the next budget
        with capture_logs() as logs:
            assert heal.check()
        return logs

    first = one_check()
    assert "checked" == (heal.status() or {})["state"]
    assert 1 == [e["event"] for e in first].count("aiter.check_over_budget")
    problem = heal.problem()
    assert problem is not None
    assert registry.OVER_BUDGET in problem
    assert heal.retry_at() is not None
    assert "the last check ran past its time budget" == heal.retry_reason()
    second = one_check()
    assert 0 == [e["event"] for e in second].count("aiter.check_over_budget")  # said once
    third = one_check()
    assert ["aiter.check_within_budget"] == [
        e["event"] for e in third if e["event"].startswith("aiter.check_")
    ]
    assert heal.retry_at() is None
    assert heal.problem() is None or registry.OVER_BUDGET not in str(heal.problem())


def test_status_says_not_checked_yet_before_the_first_verdict() -> None:
    assert ["  aiter:      not checked yet"] == status._aiter_lines({"state": "not checked yet"})
    lines = status._aiter_lines({"state": "checked", "verdicts": {"covered": 2}})
    assert lines[0].startswith("  aiter:      2 covered")
