"""The report memory (``reconcile.reports``): one event per decision that matters, and each
file's problem said once, again only when it changes or comes back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import structlog.testing

from hal0_reconciler.model import Action, Reason, Runtime, SlotKey, Verdict
from hal0_reconciler.reconcile.outcome import Outcome, OutcomeStatus
from hal0_reconciler.reconcile.reports import ReportMemory
from helpers.hosts import ROCM_UNUSABLE, ROCM_USABLE

PATH = Path("/etc/hal0/slots/agent.toml")
KEY = SlotKey(str(PATH))


def _outcome(status: OutcomeStatus, **fields: object) -> Outcome:
    return Outcome(KEY, PATH, "agent", "agent", status, **fields)  # type: ignore[arg-type]


def _said(memory: ReportMemory, *outcomes: Outcome, facts=ROCM_USABLE) -> list[str]:  # type: ignore[no-untyped-def]
    with structlog.testing.capture_logs() as logs:
        for outcome in outcomes:
            memory.report_new([outcome], facts)
    return [e["event"] for e in logs]


def _relabel(reason: Reason, old: str, new: str) -> Verdict:
    return Verdict(Action.RELABEL, reason, Runtime.LLAMA_SERVER, old, new)


def test_each_relabel_is_said_with_the_event_of_its_reason() -> None:
    """A demotion is a warning with the lane's reason, a restore and a relabel are info; a
    relabel that lost the file's comments says so too."""
    memory = ReportMemory()
    demoted = _outcome(
        OutcomeStatus.RELABELED,
        verdict=_relabel(Reason.NOT_CAPABLE_ROCM_UNUSABLE, "gpu-vulkan", "cpu"),
    )
    with structlog.testing.capture_logs() as logs:
        memory.report_new([demoted], ROCM_UNUSABLE)
    assert ["slot.demoted_to_cpu"] == [e["event"] for e in logs]
    assert ("warning", "cpu", "gpu-vulkan") == (
        logs[0]["log_level"],
        logs[0]["new"],
        logs[0]["old"],
    )
    restored = _outcome(
        OutcomeStatus.RELABELED, verdict=_relabel(Reason.RESTORE_OWN_DEMOTION, "cpu", "gpu-rocm")
    )
    relabeled = _outcome(
        OutcomeStatus.RELABELED,
        verdict=_relabel(Reason.NOT_CAPABLE_ROCM_USABLE, "gpu-vulkan", "gpu-rocm"),
        message="the file is rewritten whole",
    )
    assert ["slot.restored_to_rocm", "slot.relabeled", "slot.comments_lost"] == _said(
        memory, restored, relabeled
    )


def test_an_outcome_is_said_once_however_often_a_pass_gives_it_back() -> None:
    """The very outcome already said (a pass's memory gives it back) is not said again."""
    memory = ReportMemory()
    unreadable = _outcome(OutcomeStatus.UNREADABLE, message="not TOML")
    assert ["slot.unreadable"] == _said(memory, unreadable, unreadable)


def test_a_problem_is_said_once_per_content_and_again_after_it_went_away() -> None:
    """The same problem in a new outcome stays said; a new problem, or the same one after the
    file was fine in between, is said again."""
    memory = ReportMemory()
    first = _outcome(OutcomeStatus.UNREADABLE, message="not TOML")
    same = dataclasses.replace(first)
    other = _outcome(OutcomeStatus.UNREADABLE, message="not UTF-8")
    fine = _outcome(OutcomeStatus.UNCHANGED)
    assert ["slot.unreadable"] == _said(memory, first, same)
    assert ["slot.unreadable", "slot.unreadable"] == _said(memory, other, fine, first)


def test_each_kind_of_problem_has_its_event() -> None:
    """Not a regular file, and a runtime the profile does not give, are warnings of their own;
    a gone file says nothing, and its problem is said again when it comes back."""
    memory = ReportMemory()
    not_regular = _outcome(OutcomeStatus.NOT_REGULAR, message="a symlink")
    skipped = _outcome(OutcomeStatus.SKIPPED)
    gone = Outcome(KEY, PATH, None, None, OutcomeStatus.GONE)
    assert ["slot.not_regular_file", "slot.runtime_unresolved"] == _said(
        memory, not_regular, skipped, gone
    )
    assert ["slot.runtime_unresolved"] == _said(memory, dataclasses.replace(skipped))


def test_a_gone_file_is_not_remembered_and_a_forgotten_file_is_said_again() -> None:
    """Nothing of a gone file is kept; ``forget`` clears what was said of a file."""
    memory = ReportMemory()
    assert [] == _said(memory, Outcome(KEY, PATH, None, None, OutcomeStatus.GONE))
    assert [] == list(memory.keys())
    skipped = _outcome(OutcomeStatus.SKIPPED, unit_problem="a slash in the name")
    assert ["slot.name_invalid", "slot.runtime_unresolved"] == _said(memory, skipped)
    assert [KEY] == list(memory.keys())
    memory.forget(KEY)
    assert [] == list(memory.keys())
    again = dataclasses.replace(skipped)
    assert ["slot.name_invalid", "slot.runtime_unresolved"] == _said(memory, again)


def test_a_unit_problem_is_said_once_and_again_when_it_changes() -> None:
    """A name hal0 could not run: once per file, again for another problem or after it was
    fixed in between."""
    memory = ReportMemory()
    bad = _outcome(OutcomeStatus.UNCHANGED, unit_problem="a slash in the name")
    worse = _outcome(OutcomeStatus.UNCHANGED, unit_problem="too long")
    fixed = _outcome(OutcomeStatus.UNCHANGED)
    assert ["slot.name_invalid"] == _said(memory, bad, dataclasses.replace(bad))
    assert ["slot.name_invalid", "slot.name_invalid"] == _said(memory, worse, fixed, bad)


def test_a_write_cut_short_by_a_stop_is_no_error() -> None:
    """A failed write is an error, unless the daemon is stopping: then it was abandoned."""
    stopping = [False]
    memory = ReportMemory(stopping=lambda: stopping[0])
    failed = _outcome(OutcomeStatus.WRITE_FAILED, message="interrupted")
    assert ["slot.write_failed"] == _said(memory, failed)
    stopping[0] = True
    assert ["slot.write_abandoned"] == _said(memory, dataclasses.replace(failed))
    assert ["slot.write_failed"] == _said(ReportMemory(), dataclasses.replace(failed))
