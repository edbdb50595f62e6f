"""Under hal0's lock the engine reads the slot again and decides again: whatever another writer
did while we waited for the lock wins, and is reported as it is now."""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog.testing

from hal0_reconciler import fsio
from hal0_reconciler.reconcile import OutcomeStatus, Reconciler
from hal0_reconciler.slots import seen, store
from helpers.daemon_host import slot_text
from helpers.hosts import ROCM_USABLE


@pytest.fixture
def writer_before_us(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], None]], None]:
    """Makes another writer's edit happen just before we get the lock (it held it till then)."""

    def install(edit: Callable[[], None]) -> None:
        real = store.slot_write_lock

        @contextlib.contextmanager
        def lock_after_their_edit(*args, **kwargs) -> Iterator[None]:  # type: ignore[no-untyped-def]
            edit()
            with real(*args, **kwargs):
                yield

        monkeypatch.setattr(store, "slot_write_lock", lock_after_their_edit)

    return install


@pytest.fixture
def agent(host_dirs) -> Path:
    slot = host_dirs["slots_dir"] / "agent.toml"
    slot.write_text(slot_text("agent", "gpu-vulkan"))
    return slot


def test_a_slot_deleted_while_we_waited_stays_deleted(agent, make_settings, writer_before_us):
    """Gone under the lock: reported gone, nothing written back."""
    writer_before_us(agent.unlink)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert [OutcomeStatus.GONE] == [o.status for o in report.outcomes]
    assert not agent.exists(), "a slot deleted by another writer was written back"


def test_a_slot_broken_while_we_waited_is_unreadable_and_untouched(
    agent, make_settings, writer_before_us
):
    """Not UTF-8 any more under the lock: unreadable, its bytes left as they are."""
    broken = b'name = "agent"\ndevice = "gpu-vulkan"\n# \xff\n'
    writer_before_us(lambda: agent.write_bytes(broken))
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert [OutcomeStatus.UNREADABLE] == [o.status for o in report.outcomes]
    assert broken == agent.read_bytes()


def test_a_slot_relabelled_by_another_writer_meanwhile_is_unchanged(
    agent, make_settings, writer_before_us
):
    """Another writer already set gpu-rocm: nothing to do, reported unchanged, their file kept."""
    theirs = slot_text("agent", "gpu-rocm", port=9999)
    writer_before_us(lambda: agent.write_text(theirs))
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert [(OutcomeStatus.UNCHANGED, "gpu-rocm")] == [
        (o.status, o.verdict.old if o.verdict else None) for o in report.outcomes
    ]
    assert theirs == agent.read_text()


def test_a_slot_made_unresolvable_meanwhile_is_skipped(
    agent, make_settings, writer_before_us, host_dirs
):
    """Another writer pointed the slot at a profile of an unknown runtime: skipped, untouched."""
    host_dirs["profiles_file"].write_text('[profile.exotic]\nruntime_family = "vllm"\n')
    theirs = 'name = "agent"\ndevice = "gpu-vulkan"\nprofile = "exotic"\n'
    writer_before_us(lambda: agent.write_text(theirs))
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert [OutcomeStatus.SKIPPED] == [o.status for o in report.outcomes]
    assert theirs == agent.read_text()


def test_a_write_that_fails_is_a_write_failure_and_loses_nothing(
    agent, make_settings, monkeypatch: pytest.MonkeyPatch
):
    """The atomic write fails (disk full): the pass says write-failed with the reason, logs it,
    the file keeps its bytes, and no demotion is recorded."""
    before = agent.read_bytes()

    def disk_full(*_args, **_kwargs) -> None:  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsio, "begin_write", disk_full)
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    (outcome,) = report.outcomes
    assert OutcomeStatus.WRITE_FAILED == outcome.status, f"a failed write reported {outcome}"
    assert "No space left on device" in (outcome.message or "")
    assert before == agent.read_bytes()
    assert ["slot.write_failed"] == [e["event"] for e in logs]


def test_a_slot_found_done_under_the_lock_keeps_its_outcome_for_the_next_pass(
    agent, make_settings, writer_before_us, monkeypatch: pytest.MonkeyPatch
):
    """Another writer set gpu-rocm while we waited: the next pass gives back that very outcome
    (nothing to re-report, no status entry to render again), as for any unchanged file."""
    monkeypatch.setattr(seen, "SETTLED_NS", 0)  # a read is settled at once (no second's wait)
    writer_before_us(lambda: agent.write_text(slot_text("agent", "gpu-rocm", port=9999)))
    engine = Reconciler(make_settings())
    (first,) = engine.reconcile(ROCM_USABLE).outcomes
    time.sleep(0.01)  # the next look is later than the file's last change
    (again,) = engine.reconcile(ROCM_USABLE).outcomes
    assert OutcomeStatus.UNCHANGED is first.status
    assert first is again, "the outcome of a file found done under the lock was not kept"
