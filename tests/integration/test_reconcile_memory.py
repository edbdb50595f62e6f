"""What the engine remembers between passes (its demotions) and reports once (the profiles
file): the rules an operator feels only later, after several passes."""

from __future__ import annotations

import pytest
import structlog.testing

from hal0_reconciler.reconcile import OutcomeStatus, Reconciler, slot_key
from hal0_reconciler.state import DemotionLedger
from helpers.daemon_host import slot_text
from helpers.hosts import NOT_AMD, ROCM_UNUSABLE, ROCM_USABLE


def test_a_demotion_outlives_ordinary_passes_while_the_lane_stays_down(
    host_dirs, make_settings
) -> None:
    """Demoted to cpu, then any number of passes with the lane still down: the demotion record
    stays, so the slot goes back to gpu-rocm when the lane returns (it does not stay on cpu)."""
    slot = host_dirs["slots_dir"] / "agent.toml"
    slot.write_text(slot_text("agent", "gpu-vulkan"))
    ledger = DemotionLedger.in_state_dir(host_dirs["state_dir"])
    reconciler = Reconciler(make_settings(), ledger=ledger)
    reconciler.reconcile(ROCM_UNUSABLE)
    assert 'device = "cpu"' in slot.read_text(), "setup: the slot is demoted"
    for _ in range(3):
        report = reconciler.reconcile(ROCM_UNUSABLE)
        assert [OutcomeStatus.UNCHANGED] == [o.status for o in report.outcomes]
    assert len(ledger.keys()) == 1, (
        "an ordinary pass with the lane down dropped the demotion record"
    )
    reconciler.reconcile(ROCM_USABLE)
    assert 'device = "gpu-rocm"' in slot.read_text(), "our own demotion was not restored"
    assert frozenset() == ledger.keys(), "a restored demotion is still on record"


def test_an_unreadable_profiles_file_is_logged_once_on_an_amd_host(
    host_dirs, make_settings
) -> None:
    """profiles.toml that is not TOML: one error event naming it on an AMD host (not on every
    pass), none on a host without amdgpu, and again once a different error appears."""
    profiles = host_dirs["profiles_file"]
    profiles.parent.mkdir(parents=True, exist_ok=True)
    profiles.write_text("[profiles\n")
    (host_dirs["slots_dir"] / "agent.toml").write_text(slot_text("agent", "gpu-rocm"))
    with structlog.testing.capture_logs() as quiet:
        Reconciler(make_settings()).reconcile(NOT_AMD)
    assert [] == [e for e in quiet if e["event"] == "profiles.unreadable"], (
        "profiles.unreadable logged on a host without amdgpu"
    )
    reconciler = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        reconciler.reconcile(ROCM_USABLE)
        reconciler.reconcile(ROCM_USABLE)
    events = [e for e in logs if e["event"] == "profiles.unreadable"]
    assert 1 == len(events), f"profiles.unreadable logged {len(events)} times over two passes"
    assert ("error", str(profiles)) == (events[0]["log_level"], events[0]["path"])
    profiles.write_text("profiles = 1 = 2\n")  # another error
    with structlog.testing.capture_logs() as again:
        reconciler.reconcile(ROCM_USABLE)
    assert 1 == sum(e["event"] == "profiles.unreadable" for e in again), (
        "a new profiles error was not logged"
    )


def test_a_hands_off_slot_is_reported_as_such_and_left_alone(host_dirs, make_settings) -> None:
    """A slot the daemon stopped fighting over is listed as hands-off (the status shows it),
    and its file is neither read for a decision nor written."""
    slot = host_dirs["slots_dir"] / "agent.toml"
    slot.write_text(slot_text("agent", "gpu-vulkan"))
    before = slot.read_bytes()
    key = slot_key(slot)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE, hands_off={key})
    assert [(key, OutcomeStatus.HANDS_OFF)] == [(o.key, o.status) for o in report.outcomes], (
        "a hands-off slot is missing from the pass report"
    )
    assert before == slot.read_bytes(), "a hands-off slot was relabelled"


def test_a_problem_of_a_file_that_came_back_is_reported_again(host_dirs, make_settings) -> None:
    """An unreadable slot is reported once; deleted and put back with the same bytes, it is a
    new file and its problem is reported again (the memory left with the old file)."""
    slot = host_dirs["slots_dir"] / "agent.toml"
    slot.write_text("name = [\n")
    reconciler = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        reconciler.reconcile(ROCM_USABLE)
        reconciler.reconcile(ROCM_USABLE)
        slot.unlink()
        reconciler.reconcile(ROCM_USABLE, [slot])
        slot.write_text("name = [\n")
        reconciler.reconcile(ROCM_USABLE)
    reported = [e["path"] for e in logs if e["event"] == "slot.unreadable"]
    assert [str(slot), str(slot)] == reported, f"slot.unreadable logged for: {reported}"


def test_a_file_seen_gone_by_a_quiet_pass_is_forgotten_too(host_dirs, make_settings) -> None:
    """The pass that finds the file gone may report nothing (amdgpu not loaded at that moment):
    the file's memory still goes, so the same problem in a new file is reported again."""
    slot = host_dirs["slots_dir"] / "agent.toml"
    slot.write_text("name = [\n")
    reconciler = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        reconciler.reconcile(ROCM_USABLE)
        slot.unlink()
        reconciler.reconcile(NOT_AMD, [slot])
        slot.write_text("name = [\n")
        reconciler.reconcile(ROCM_USABLE)
    reported = [e["path"] for e in logs if e["event"] == "slot.unreadable"]
    assert [str(slot), str(slot)] == reported, f"slot.unreadable logged for: {reported}"


def test_a_problem_fixed_then_back_is_reported_again(host_dirs, make_settings) -> None:
    """A broken slot fixed (whether the fix is relabelled or already right) and then broken the
    same way again is reported again: a fixed problem is forgotten."""
    slot = host_dirs["slots_dir"] / "agent.toml"
    reconciler = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        for fixed in (slot_text("agent", "gpu-vulkan"), slot_text("agent", "gpu-rocm")):
            slot.write_text("name = [\n")
            reconciler.reconcile(ROCM_USABLE)
            slot.write_text(fixed)
            reconciler.reconcile(ROCM_USABLE)
        slot.write_text("name = [\n")
        reconciler.reconcile(ROCM_USABLE)
    assert 3 == sum(e["event"] == "slot.unreadable" for e in logs), (
        "a problem that was fixed and came back was not reported again"
    )


def test_the_profiles_file_is_read_once_per_change(
    host_dirs, make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passes over an unchanged profiles file do not read it again; a changed one is read."""
    from hal0_reconciler.slots import store

    profiles = host_dirs["profiles_file"]
    profiles.parent.mkdir(parents=True, exist_ok=True)
    profiles.write_text('[profile.exotic]\nruntime_family = "vllm"\n')
    reads: list[object] = []
    real = store.read_catalog
    monkeypatch.setattr(store, "read_catalog", lambda p: reads.append(p) or real(p))
    reconciler = Reconciler(make_settings())
    for _ in range(3):
        reconciler.reconcile(ROCM_USABLE)
    assert 1 == len(reads), f"an unchanged profiles file was read {len(reads)} times"
    profiles.write_text('[profile.exotic]\nruntime_family = "llama.cpp"\n# changed\n')
    reconciler.reconcile(ROCM_USABLE)
    assert 2 == len(reads), "a changed profiles file was not read again"
