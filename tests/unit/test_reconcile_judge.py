"""What every verdict of a pass depends on besides the file (``reconcile.judge``): pure."""

from __future__ import annotations

import dataclasses

import pytest

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.model import (
    Action,
    Catalog,
    Hal0Facts,
    Hal0Rule,
    HostFacts,
    LaneState,
    Reason,
    Runtime,
    Verdict,
)
from hal0_reconciler.reconcile.judge import Judge
from helpers.slotdocs import slot_doc

IMAGE = "ghcr.io/hal0ai/hal0-rocmfpx:ade07ba"
HAL0 = Hal0Facts(
    version="0.9",
    default_image=IMAGE,
    capable=frozenset(),
    stale=frozenset(),
    bundled={"rocmfpx": IMAGE},
    manifest_keys={},
    aliases={},
)
USABLE = HostFacts(amd=True, lane=LaneState.USABLE)
JUDGE = Judge(USABLE, hal0=HAL0, catalog=Catalog(), vulkan_paused=False, hands_off=frozenset())


def test_a_vulkan_slot_on_an_image_hal0_does_not_hold_capable_is_moved_to_rocm() -> None:
    """The policy is asked with the image hal0 would launch: not capable, ROCm usable."""
    verdict = JUDGE.decide(slot_doc(), demoted=False)
    assert (Action.RELABEL, Reason.NOT_CAPABLE_ROCM_USABLE, "gpu-rocm") == (
        verdict.action,
        verdict.reason,
        verdict.new,
    )
    assert verdict.image is not None
    assert IMAGE == verdict.image.image


def test_the_image_hal0_holds_capable_keeps_the_slot_on_vulkan() -> None:
    """hal0's own list of capable images is the one the verdict is made with."""
    judge = dataclasses.replace(JUDGE, hal0=dataclasses.replace(HAL0, capable=frozenset({IMAGE})))
    assert Reason.VULKAN_CAPABLE_IMAGE == judge.decide(slot_doc(), demoted=False).reason


def test_only_our_own_demotion_is_restored() -> None:
    """A slot on cpu goes back to ROCm when we demoted it, and is the operator's otherwise."""
    ours = JUDGE.decide(slot_doc(device="cpu"), demoted=True)
    theirs = JUDGE.decide(slot_doc(device="cpu"), demoted=False)
    assert (Reason.RESTORE_OWN_DEMOTION, "gpu-rocm") == (ours.reason, ours.new)
    assert Action.KEEP == theirs.action


def test_the_rule_of_the_installed_hal0_is_the_one_applied() -> None:
    """A hal0 era without the Vulkan rule runs gpu-vulkan as it is: nothing moves."""
    judge = dataclasses.replace(JUDGE, hal0=dataclasses.replace(HAL0, rule=Hal0Rule.PRE_RULE))
    assert Reason.PRE_RULE == judge.decide(slot_doc(), demoted=False).reason


def test_a_profile_the_catalog_cannot_give_leaves_the_runtime_unresolved() -> None:
    """The catalog read for the pass resolves a profiled slot's runtime; unreadable: skipped."""
    judge = dataclasses.replace(JUDGE, catalog=Catalog(error="profiles.toml: not TOML"))
    assert Action.SKIP == judge.decide(slot_doc(profile="big"), demoted=False).action


LLAMA = Runtime.LLAMA_SERVER
RELABEL = Verdict(Action.RELABEL, Reason.NOT_CAPABLE_ROCM_USABLE, LLAMA, "gpu-vulkan", "gpu-rocm")
KEEP = Verdict(Action.KEEP, Reason.NOT_VULKAN, LLAMA, "gpu-rocm")


@pytest.mark.parametrize(
    ("hands_off", "paused", "verdict", "expected"),
    [
        pytest.param(("s",), False, KEEP, "operator", id="hands_off by name, even a keep"),
        pytest.param(("s-id",), False, RELABEL, "operator", id="hands_off by id"),
        pytest.param((" s ",), False, RELABEL, "operator", id="hands_off name with blanks"),
        pytest.param(("other",), False, RELABEL, None, id="another slot listed"),
        pytest.param((), True, RELABEL, "paused", id="vulkan opt-in, a vulkan relabel"),
        pytest.param((), True, KEEP, None, id="vulkan opt-in, a keep"),
        pytest.param((), False, RELABEL, None, id="nothing held"),
    ],
)
def test_a_deliberate_choice_holds_a_slot_back(
    hands_off: tuple[str, ...], paused: bool, verdict: Verdict, expected: str | None
) -> None:
    """The operator's hands_off (as the settings read it), or hal0's Vulkan opt-in while a
    gpu-vulkan relabel is due, keep the slot as it is, and say which of the two."""
    listed = settings_mod.load(None, {"hands_off": list(hands_off)}).hands_off
    judge = dataclasses.replace(JUDGE, hands_off=listed, vulkan_paused=paused)
    held = judge.held_back(slot_doc(name="s", slot_id="s-id"), verdict)
    assert expected == (None if held is None else held[0].value)
    assert held is None or held[1].startswith(f"{held[0].value}: ")


def test_the_vulkan_opt_in_holds_back_only_a_slot_leaving_gpu_vulkan() -> None:
    """A relabel from another label (our cpu demotion restored) goes on under the opt-in."""
    judge = dataclasses.replace(JUDGE, vulkan_paused=True)
    restore = dataclasses.replace(RELABEL, reason=Reason.RESTORE_OWN_DEMOTION, old="cpu")
    assert None is judge.held_back(slot_doc(name="s", device="cpu"), restore)
    skip = dataclasses.replace(RELABEL, action=Action.SKIP)
    assert None is judge.held_back(slot_doc(name="s"), skip)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"facts": HostFacts(amd=True, lane=LaneState.UNUSABLE)}, id="lane"),
        pytest.param({"facts": HostFacts(amd=False, lane=LaneState.USABLE)}, id="amd"),
        pytest.param({"hal0": dataclasses.replace(HAL0, version="1.0")}, id="hal0's facts"),
        pytest.param({"catalog": Catalog()}, id="a catalog read again"),
        pytest.param({"vulkan_paused": True}, id="vulkan opt-in"),
        pytest.param({"hands_off": frozenset({"s"})}, id="hands_off"),
    ],
)
def test_every_input_of_a_verdict_changes_the_memory_key(change: dict[str, object]) -> None:
    """A remembered verdict is valid for exactly this context: any of its parts changed, every
    slot is judged again."""
    assert JUDGE.memory_key() == dataclasses.replace(JUDGE).memory_key()
    assert JUDGE.memory_key() != dataclasses.replace(JUDGE, **change).memory_key()  # type: ignore[arg-type]
