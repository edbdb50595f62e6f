"""The rule the reconciler enforces, as a pure decision.  [pure]

On an AMD host only, a llama.cpp slot labelled ``gpu-vulkan`` (matched exactly, as hal0 matches
it) whose effective image is not Vulkan-capable moves to ``gpu-rocm`` when the ROCm lane is
usable, else to ``cpu`` (a loud behaviour change). A candidate whose image is capable is right
as it is, whatever the lane says. Nothing is ever relabelled back to ``gpu-vulkan``; other labels
are left alone, except that a slot the reconciler itself demoted to ``cpu`` goes to ``gpu-rocm``
once the lane is usable again.

The installed hal0 release decides which rule applies (``hold``, :func:`hold_of`): under the
allowlist (1.0-1.3) and the manifest pins (1.4+) the image decides as above; a hal0 from before
the rule, a hal0 of no known release's shape, no hal0 at all, and a 1.4+ hal0 whose manifest
gives no valid pins have every slot kept.
"""

from __future__ import annotations

from hal0_reconciler.model import (
    Action,
    Device,
    Hal0Facts,
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
    hold: Reason | None = None,
    legacy_backend: bool = True,
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
    candidate = is_candidate(slot, legacy_backend=legacy_backend)
    if hold is not None:  # hal0 runs gpu-vulkan as normal, or nothing to judge against
        return keep(hold if candidate else Reason.NOT_VULKAN, image)
    if slot.raw_device == Device.CPU and demoted_by_us and facts.lane is LaneState.USABLE:
        return relabel(Device.GPU_ROCM, Reason.RESTORE_OWN_DEMOTION)
    if not candidate:
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


def is_candidate(slot: SlotDoc, *, legacy_backend: bool) -> bool:
    """A Vulkan-lane candidate; a slot labelled only by a legacy ``backend = "vulkan"`` only
    when ``legacy_backend`` (1.4+: hal0's conversion turns it into ``device`` before its relabel;
    1.0-1.3's relabel reads ``device`` alone)."""
    if not slot.vulkan_candidate:
        return False
    return legacy_backend or bool(slot.raw_device)


def backend_counts(facts: Hal0Facts) -> bool:
    """Whether a legacy ``backend`` labels a candidate under this hal0: 1.4+ (its
    profile-centric conversion sets ``device`` from it before the relabel), unless that
    conversion's own restore marker holds (the runner-system marker does not stand it down)."""
    return facts.rule is not Hal0Rule.ALLOWLIST and not facts.backend_stood_down


def hold_of(facts: Hal0Facts) -> Reason | None:
    """Why the installed hal0 has every slot kept (None: its rule judges each image)."""
    if facts.rule is Hal0Rule.PINS:
        return Reason.MANIFEST_UNUSABLE if facts.pins_problem is not None else None
    return _NOTHING_MOVES.get(facts.rule)


_NOTHING_MOVES = {
    Hal0Rule.PRE_RULE: Reason.PRE_RULE,
    Hal0Rule.NOT_PLACEABLE: Reason.HAL0_NOT_PLACEABLE,
    Hal0Rule.NO_HAL0: Reason.NO_HAL0,
}
