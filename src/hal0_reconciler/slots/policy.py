"""The rule the reconciler enforces, as a pure decision.  [pure]

On an AMD host only, a llama.cpp slot labelled ``gpu-vulkan`` moves to ``gpu-rocm`` when the
ROCm lane is usable, else to ``cpu`` (a loud behaviour change), unless its effective image is
Vulkan-validated. Nothing is ever relabelled back to ``gpu-vulkan``; other labels are left
alone, except that a slot the reconciler itself demoted to ``cpu`` goes to ``gpu-rocm`` once
the lane is usable again.
"""

from __future__ import annotations

from collections.abc import Collection

from hal0_reconciler.model import Action, Device, HostFacts, LaneState, Reason, Runtime, Verdict
from hal0_reconciler.slots.document import SlotDoc


def decide(
    slot: SlotDoc,
    *,
    runtime: Runtime,
    image: str | None,
    facts: HostFacts,
    validated_images: Collection[str],
    demoted_by_us: bool = False,
) -> Verdict:
    """Keep or relabel one slot, with the reason."""
    old = slot.device

    def keep(reason: Reason) -> Verdict:
        return Verdict(Action.KEEP, reason, runtime, old)

    def relabel(new: Device, reason: Reason) -> Verdict:
        return Verdict(Action.RELABEL, reason, runtime, old, new.value)

    if not facts.amd:
        return keep(Reason.NOT_AMD_HOST)
    if runtime is Runtime.UNRESOLVED:
        return Verdict(Action.SKIP, Reason.RUNTIME_UNRESOLVED, runtime, old)
    if runtime is not Runtime.LLAMA_SERVER:
        return keep(Reason.NOT_LLAMA_CPP)
    if old == Device.CPU and demoted_by_us and facts.lane is LaneState.USABLE:
        return relabel(Device.GPU_ROCM, Reason.RESTORE_OWN_DEMOTION)
    if old != Device.GPU_VULKAN:
        return keep(Reason.NOT_VULKAN)
    if image is not None and image.strip() in validated_images:
        return keep(Reason.VULKAN_VALIDATED_IMAGE)
    if facts.lane is LaneState.USABLE:
        return relabel(Device.GPU_ROCM, Reason.VULKAN_RETIRED_ROCM_USABLE)
    if facts.lane is LaneState.UNSETTLED:
        return keep(Reason.DEMOTION_GRACE)
    if facts.lane is LaneState.UNKNOWN:  # a probe that could not run proves nothing: no demotion
        return keep(Reason.LANE_UNKNOWN)
    return relabel(Device.CPU, Reason.VULKAN_RETIRED_ROCM_UNUSABLE)
