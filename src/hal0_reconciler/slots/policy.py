"""The rule the reconciler enforces, as a pure decision.  [pure]

On an AMD host only, a llama.cpp slot labelled ``gpu-vulkan`` (matched exactly, as hal0 matches
it) whose effective image is not Vulkan-capable moves to ``gpu-rocm`` when the ROCm lane is
usable, else to ``cpu`` (a loud behaviour change). A candidate whose image is capable is right
as it is, whatever the lane says. Nothing is ever relabelled back to ``gpu-vulkan``; other labels
are left alone, except that a slot the reconciler itself demoted to ``cpu`` goes to ``gpu-rocm``
once the lane is usable again.

The installed hal0's era decides which rule applies (``rule``): under the allowlist the image
decides as above; a hal0 that retired the lane gives no capable image (every candidate moves);
a hal0 from before the rule, or one whose era could not be placed, has every slot kept.
"""

from __future__ import annotations

from hal0_reconciler.model import (
    Action,
    Device,
    Hal0Rule,
    HostFacts,
    ImageResolution,
    LaneState,
    Reason,
    Runtime,
    Verdict,
)
from hal0_reconciler.slots.document import SlotDoc


def decide(
    slot: SlotDoc,
    *,
    runtime: Runtime,
    image: ImageResolution | None,
    facts: HostFacts,
    demoted_by_us: bool = False,
    rule: Hal0Rule = Hal0Rule.ALLOWLIST,
) -> Verdict:
    """Keep or relabel one slot, with the reason. ``image`` is the candidate's effective image
    (None, or unresolved, counts as not capable: fail closed)."""
    old = slot.device

    def keep(reason: Reason, shown: ImageResolution | None = None) -> Verdict:
        return Verdict(Action.KEEP, reason, runtime, old, image=shown)

    def relabel(new: Device, reason: Reason, shown: ImageResolution | None = None) -> Verdict:
        return Verdict(Action.RELABEL, reason, runtime, old, new.value, image=shown)

    if not facts.amd:
        return keep(Reason.NOT_AMD_HOST)
    if runtime is Runtime.UNRESOLVED:
        return Verdict(Action.SKIP, Reason.RUNTIME_UNRESOLVED, runtime, old)
    if runtime is not Runtime.LLAMA_SERVER:
        return keep(Reason.NOT_LLAMA_CPP)
    held = _NOTHING_MOVES.get(rule)
    if held is not None:  # hal0 runs gpu-vulkan as its normal lane, or its era is not placed
        return keep(held if slot.vulkan_candidate else Reason.NOT_VULKAN, image)
    if slot.raw_device == Device.CPU and demoted_by_us and facts.lane is LaneState.USABLE:
        return relabel(Device.GPU_ROCM, Reason.RESTORE_OWN_DEMOTION)
    if not slot.vulkan_candidate:
        return keep(Reason.NOT_VULKAN)
    if image is not None and image.capable:
        return keep(Reason.VULKAN_CAPABLE_IMAGE, image)
    if facts.lane is LaneState.USABLE:
        return relabel(Device.GPU_ROCM, Reason.NOT_CAPABLE_ROCM_USABLE, image)
    if facts.lane is LaneState.UNSETTLED:
        return keep(Reason.DEMOTION_GRACE, image)
    if facts.lane is LaneState.UNKNOWN:  # a probe that could not run proves nothing: no demotion
        return keep(Reason.LANE_UNKNOWN, image)
    return relabel(Device.CPU, Reason.NOT_CAPABLE_ROCM_UNUSABLE, image)


_NOTHING_MOVES = {
    Hal0Rule.PRE_RULE: Reason.PRE_RULE,
    Hal0Rule.NOT_UNDERSTOOD: Reason.HAL0_NOT_UNDERSTOOD,
}
