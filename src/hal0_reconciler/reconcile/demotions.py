"""The demotion ledger's rules: a slot this daemon moved to ``cpu`` is recorded, so that it
is ours to restore; the record goes when we restore it, when the operator moves it off
``cpu``, and when its file goes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal0_reconciler.model import Reason, SlotKey, Verdict

if TYPE_CHECKING:
    from hal0_reconciler.state import DemotionLedger


def settle(ledger: DemotionLedger, key: SlotKey, verdict: Verdict) -> None:
    """A slot kept as it is: forget a demotion of ours once the operator moved it off ``cpu``."""
    if key in ledger and verdict.old != "cpu":
        ledger.drop(key)


def note_written(ledger: DemotionLedger, key: SlotKey, verdict: Verdict, *, slot: str) -> None:
    """A relabel just written: a demotion is recorded (with the label it had), a restore of
    ours is not ours to restore any more."""
    if verdict.reason is Reason.NOT_CAPABLE_ROCM_UNUSABLE:
        ledger.record(key, slot=slot, old=verdict.old)
    elif verdict.reason is Reason.RESTORE_OWN_DEMOTION:
        ledger.drop(key)
