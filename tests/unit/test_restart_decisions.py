"""The decisions of a careful restart, apart from any I/O: each of hal0's facts on its own."""

from __future__ import annotations

import pytest

from hal0_reconciler.host.restarts import rules as restart_rules
from hal0_reconciler.host.restarts.rules import Load, Outcome


@pytest.mark.parametrize(
    ("state", "row", "load"),
    [
        ("ready", {"requests_processing": 0, "requests_deferred": 0}, Load.IDLE),
        ("idle", {"requests_processing": 0, "requests_deferred": 0}, Load.IDLE),
        ("ready", {"requests_processing": 1, "requests_deferred": 0}, Load.BUSY),
        ("ready", {"requests_processing": 0, "requests_deferred": 2}, Load.BUSY),
        ("ready", {"requests_processing": 0, "requests_deferred": 1}, Load.BUSY),
        ("serving", {"requests_processing": 0, "requests_deferred": 0}, Load.BUSY),
        ("warming", {"requests_processing": 0, "requests_deferred": 0}, Load.BUSY),
        ("ready", {"requests_processing": 0}, Load.NO_COUNTERS),
        ("ready", {"requests_deferred": 0}, Load.NO_COUNTERS),
        ("ready", None, Load.NO_COUNTERS),
        ("ready", {"requests_processing": True, "requests_deferred": 0}, Load.NO_COUNTERS),
        ("ready", {"requests_processing": "0", "requests_deferred": 0}, Load.NO_COUNTERS),
        ("ready", {"requests_processing": 0.0, "requests_deferred": 0.0}, Load.IDLE),
        ("offline", {"requests_processing": 3, "requests_deferred": 3}, Load.OFFLINE),
        ("error", None, Load.ERROR),
    ],
)
def test_the_load_of_a_slot(state: str, row: dict[str, object] | None, load: Load) -> None:
    assert load is restart_rules.judge_load(state, row).load


def test_a_reading_says_its_counters() -> None:
    busy = restart_rules.judge_load("ready", {"requests_processing": 2, "requests_deferred": 1})
    assert (2, 1) == (busy.processing, busy.deferred)
    assert "state ready, 2 processing, 1 deferred" == busy.describe()
    bare = restart_rules.judge_load("idle", {})
    assert "state idle, counters unavailable" == bare.describe()


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        ("ready", Outcome.DONE),
        ("idle", Outcome.DONE),
        ("serving", Outcome.DONE),
        ("offline", Outcome.NEXT_LOAD),
        ("error", Outcome.ERROR),
        ("warming", Outcome.WARMING),
        ("", Outcome.WARMING),
    ],
)
def test_how_a_restart_ended(state: str, outcome: Outcome) -> None:
    assert outcome is restart_rules.judge_answer(state)


def test_an_update_in_progress_is_queued_or_running_and_not_stale() -> None:
    assert restart_rules.update_in_progress({"state": "running"}, age=10, max_age=10)
    assert restart_rules.update_in_progress({"state": "queued"}, age=0, max_age=10)
    assert not restart_rules.update_in_progress({"state": "running"}, age=11, max_age=10)
    assert not restart_rules.update_in_progress({"state": "done"}, age=0, max_age=10)
    assert not restart_rules.update_in_progress({}, age=0, max_age=10)


@pytest.mark.parametrize(
    ("value", "allowed"),
    [("1", True), ("true", True), ("yes", True), (" yes ", True), ("True", False), ("0", False)],
)
def test_the_vulkan_opt_in_as_hal0_reads_it(value: str, allowed: bool) -> None:
    env = {restart_rules.VULKAN_FALLBACK_VARIABLE: value}
    assert allowed is restart_rules.vulkan_fallback_allowed(env)
    assert not restart_rules.vulkan_fallback_allowed({})


def test_hands_off_names_a_slot_by_name_or_id() -> None:
    """The settings strip each name once; the rule looks names and ids up as they are."""
    assert restart_rules.is_hands_off(frozenset({"coder"}), name="coder", slot_id=None)
    assert not restart_rules.is_hands_off(frozenset({" coder "}), name="coder", slot_id=None)
    assert restart_rules.is_hands_off(frozenset({"7"}), name="coder", slot_id="7")
    assert not restart_rules.is_hands_off(frozenset({"7"}), name="coder", slot_id="8")
    assert not restart_rules.is_hands_off(frozenset({"coder"}), name=None, slot_id=None)
    assert not restart_rules.is_hands_off(frozenset(), name="coder", slot_id="7")
