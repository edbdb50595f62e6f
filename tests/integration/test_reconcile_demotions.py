"""The demotion ledger's rules (``reconcile.demotions``), on a ledger kept in a real file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hal0_reconciler.model import Action, Reason, Runtime, SlotKey, Verdict
from hal0_reconciler.reconcile import demotions
from hal0_reconciler.state import DemotionLedger

KEY = SlotKey("/etc/hal0/slots/agent.toml")


def _verdict(reason: Reason, old: str, new: str | None = None) -> Verdict:
    action = Action.KEEP if new is None else Action.RELABEL
    return Verdict(action, reason, Runtime.LLAMA_SERVER, old, new)


def _saved(path: Path) -> dict[str, dict[str, object]]:
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_demotion_written_is_recorded_with_the_label_it_had(tmp_path: Path) -> None:
    """Ours to restore: the slot's name and its former label go to the ledger's file."""
    ledger = DemotionLedger.in_state_dir(tmp_path)
    verdict = _verdict(Reason.NOT_CAPABLE_ROCM_UNUSABLE, "gpu-vulkan", "cpu")
    demotions.note_written(ledger, KEY, verdict, slot="agent")
    assert KEY in ledger
    saved = _saved(tmp_path / "demotions.json")[KEY]
    assert ("agent", "gpu-vulkan") == (saved["slot"], saved["old"])


def test_a_restore_written_ends_the_record(tmp_path: Path) -> None:
    """Restored to ROCm by us: no longer ours to restore."""
    ledger = DemotionLedger.in_state_dir(tmp_path)
    ledger.record(KEY, slot="agent", old="gpu-vulkan")
    demotions.note_written(
        ledger, KEY, _verdict(Reason.RESTORE_OWN_DEMOTION, "cpu", "gpu-rocm"), slot="agent"
    )
    assert KEY not in ledger
    assert {} == _saved(tmp_path / "demotions.json")


def test_another_relabel_written_leaves_the_ledger_as_it_is(tmp_path: Path) -> None:
    """A Vulkan slot moved to ROCm is no demotion of ours."""
    ledger = DemotionLedger.in_state_dir(tmp_path)
    verdict = _verdict(Reason.NOT_CAPABLE_ROCM_USABLE, "gpu-vulkan", "gpu-rocm")
    demotions.note_written(ledger, KEY, verdict, slot="agent")
    assert KEY not in ledger


@pytest.mark.parametrize(
    ("old", "kept"),
    [
        pytest.param("cpu", True, id="still on cpu: still ours"),
        pytest.param("gpu-rocm", False, id="moved off cpu by the operator"),
    ],
)
def test_a_kept_slot_settles_our_record_once_the_operator_moved_it(
    tmp_path: Path, old: str, kept: bool
) -> None:
    """A slot we demoted, now on another label by someone else's hand, is theirs."""
    ledger = DemotionLedger.in_state_dir(tmp_path)
    ledger.record(KEY, slot="agent", old="gpu-vulkan")
    demotions.settle(ledger, KEY, _verdict(Reason.NOT_VULKAN, old))
    assert kept == (KEY in ledger)


def test_settling_a_slot_we_never_demoted_writes_nothing(tmp_path: Path) -> None:
    """No record, nothing to settle: the ledger's file is not written."""
    ledger = DemotionLedger.in_state_dir(tmp_path)
    demotions.settle(ledger, KEY, _verdict(Reason.NOT_VULKAN, "gpu-rocm"))
    assert not (tmp_path / "demotions.json").exists()
