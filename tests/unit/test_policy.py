"""The rule the reconciler enforces, as a decision table (hal0-contract.md)."""

from __future__ import annotations

import dataclasses

import pytest

from hal0_reconciler.model import (
    Action,
    HostFacts,
    ImageResolution,
    LaneState,
    Reason,
    Rung,
    Runtime,
    Verdict,
)
from hal0_reconciler.slots import policy
from hal0_reconciler.slots.document import SlotDoc
from helpers.slotdocs import slot_doc

CAPABLE = ImageResolution("ghcr.io/hal0ai/hal0-combined:0826", Rung.BUNDLED, "rocmfpx", True)
NOT_CAPABLE = ImageResolution("ghcr.io/hal0ai/hal0-rocmfpx:ade07ba", Rung.BUNDLED, "rocmfpx", False)
USABLE = HostFacts(amd=True, lane=LaneState.USABLE)
UNUSABLE = HostFacts(amd=True, lane=LaneState.UNUSABLE)
UNSETTLED = HostFacts(amd=True, lane=LaneState.UNSETTLED)
UNKNOWN = HostFacts(amd=True, lane=LaneState.UNKNOWN)
NOT_AMD = HostFacts(amd=False, lane=LaneState.UNUSABLE)


def slot(device: str = "gpu-vulkan") -> SlotDoc:
    return slot_doc(device=device)


def decide(
    device: str,
    runtime: Runtime,
    facts: HostFacts,
    *,
    image: ImageResolution | None = NOT_CAPABLE,
    demoted_by_us: bool = False,
) -> Verdict:
    return policy.decide(
        slot(device),
        runtime=runtime,
        image=image,
        facts=facts,
        demoted_by_us=demoted_by_us,
    )


RELABEL_ROWS = {
    "llama.cpp on vulkan, rocm usable -> gpu-rocm": (
        USABLE,
        "gpu-rocm",
        Reason.NOT_CAPABLE_ROCM_USABLE,
    ),
    "llama.cpp on vulkan, rocm unusable -> cpu": (
        UNUSABLE,
        "cpu",
        Reason.NOT_CAPABLE_ROCM_UNUSABLE,
    ),
}


@pytest.mark.parametrize(
    ("facts", "new", "reason"), list(RELABEL_ROWS.values()), ids=list(RELABEL_ROWS)
)
def test_llama_cpp_vulkan_slots_on_an_image_that_is_not_capable_leave_the_lane(
    facts: HostFacts, new: str, reason: Reason
) -> None:
    """A llama.cpp gpu-vulkan slot whose image is not Vulkan-capable goes to gpu-rocm when the
    lane is usable, else cpu; the verdict carries the image that decided it."""
    expected = Verdict(
        Action.RELABEL, reason, Runtime.LLAMA_SERVER, "gpu-vulkan", new, image=NOT_CAPABLE
    )
    assert expected == decide("gpu-vulkan", Runtime.LLAMA_SERVER, facts)


OTHER_RUNTIMES = [Runtime.FLM, Runtime.QWEN3TTS, Runtime.KOKORO, Runtime.STT, Runtime.COMFYUI]


@pytest.mark.parametrize("facts", [USABLE, UNUSABLE], ids=["rocm-usable", "rocm-unusable"])
@pytest.mark.parametrize("runtime", OTHER_RUNTIMES, ids=[r.value for r in OTHER_RUNTIMES])
def test_other_runtimes_keep_gpu_vulkan(runtime: Runtime, facts: HostFacts) -> None:
    """Kokoro, ComfyUI, STT, Qwen3-TTS and FLM slots keep their label on both probe outcomes."""
    expected = Verdict(Action.KEEP, Reason.NOT_LLAMA_CPP, runtime, "gpu-vulkan")
    assert expected == decide("gpu-vulkan", runtime, facts)


@pytest.mark.parametrize("facts", [USABLE, UNUSABLE], ids=["rocm-usable", "rocm-unusable"])
@pytest.mark.parametrize("device", ["gpu-rocm", "cpu", "npu", "gpu-cuda", "something-else"])
def test_non_vulkan_labels_are_never_touched(device: str, facts: HostFacts) -> None:
    """gpu-rocm, cpu, npu, gpu-cuda (and unknown labels) stay as they are."""
    expected = Verdict(Action.KEEP, Reason.NOT_VULKAN, Runtime.LLAMA_SERVER, device)
    assert expected == decide(device, Runtime.LLAMA_SERVER, facts)


@pytest.mark.parametrize(
    "facts", [USABLE, UNUSABLE, UNSETTLED, UNKNOWN], ids=lambda f: f.lane.value
)
def test_a_capable_image_keeps_gpu_vulkan_whatever_the_lane(facts: HostFacts) -> None:
    """A candidate whose effective image is Vulkan-capable is right as it is, whatever the lane
    says (hal0 seeds such slots on boxes without /dev/kfd)."""
    expected = Verdict(
        Action.KEEP, Reason.VULKAN_CAPABLE_IMAGE, Runtime.LLAMA_SERVER, "gpu-vulkan", image=CAPABLE
    )
    assert expected == decide("gpu-vulkan", Runtime.LLAMA_SERVER, facts, image=CAPABLE)


UNRESOLVED = ImageResolution(None, Rung.UNRESOLVED, "nope", False, error="no runner")


@pytest.mark.parametrize("image", [None, UNRESOLVED, NOT_CAPABLE], ids=["none", "unresolved", "no"])
def test_unknown_or_other_image_fails_closed(image: ImageResolution | None) -> None:
    """When the image is unknown, unresolved or not capable, the slot is relabelled."""
    assert Action.RELABEL == decide("gpu-vulkan", Runtime.LLAMA_SERVER, USABLE, image=image).action


CANDIDATES = {
    "device gpu-vulkan": {"device": "gpu-vulkan"},
    "legacy backend vulkan, no device": {
        "device": "gpu-vulkan",
        "raw_device": None,
        "backend": "vulkan",
    },
    "legacy backend vulkan, empty device": {
        "device": "gpu-vulkan",
        "raw_device": "",
        "backend": "vulkan",
    },
}
NOT_CANDIDATES = {
    "device Vulkan": {"device": "Vulkan"},
    "device padded": {"device": "gpu-vulkan", "raw_device": " gpu-vulkan "},
    "device upper": {"device": "gpu-vulkan", "raw_device": "GPU-VULKAN"},
    "backend Vulkan": {"device": "gpu-vulkan", "raw_device": None, "backend": "Vulkan"},
    "backend padded": {"device": "gpu-vulkan", "raw_device": None, "backend": " vulkan "},
    "device rocm over backend vulkan": {"device": "gpu-rocm", "backend": "vulkan"},
}


def _with(fields: dict[str, str | None]) -> SlotDoc:
    doc = slot_doc(**{k: v for k, v in fields.items() if k != "raw_device"})  # type: ignore[arg-type]
    if "raw_device" in fields:
        doc = dataclasses.replace(doc, raw_device=fields["raw_device"])
    return doc


@pytest.mark.parametrize("fields", list(CANDIDATES.values()), ids=list(CANDIDATES))
def test_exact_candidates_are_judged(fields: dict[str, str | None]) -> None:
    """A literal "gpu-vulkan" device, or no/empty device with a legacy backend exactly "vulkan",
    is a candidate: with an image that is not capable it is relabelled."""
    verdict = policy.decide(
        _with(fields), runtime=Runtime.LLAMA_SERVER, image=NOT_CAPABLE, facts=USABLE
    )
    assert Action.RELABEL == verdict.action


@pytest.mark.parametrize("fields", list(NOT_CANDIDATES.values()), ids=list(NOT_CANDIDATES))
def test_near_misses_are_not_candidates(fields: dict[str, str | None]) -> None:
    """Matching is exact, as in hal0: "Vulkan", " vulkan ", " gpu-vulkan " are not candidates
    (hal0 runs such a slot on the CPU or cannot load it); moving them would put it on the GPU."""
    verdict = policy.decide(
        _with(fields), runtime=Runtime.LLAMA_SERVER, image=NOT_CAPABLE, facts=USABLE
    )
    assert (Action.KEEP, Reason.NOT_VULKAN) == (verdict.action, verdict.reason)


@pytest.mark.parametrize("device", ["gpu-vulkan", "cpu", "gpu-rocm"])
def test_non_amd_host_is_a_no_op(device: str) -> None:
    """On a host without amdgpu nothing is relabelled, whatever the slot says."""
    expected = Verdict(Action.KEEP, Reason.NOT_AMD_HOST, Runtime.LLAMA_SERVER, device)
    assert expected == decide(device, Runtime.LLAMA_SERVER, NOT_AMD, demoted_by_us=True)


def test_unresolved_runtime_is_skipped() -> None:
    """A slot whose runtime cannot be resolved is skipped, not relabelled."""
    expected = Verdict(Action.SKIP, Reason.RUNTIME_UNRESOLVED, Runtime.UNRESOLVED, "gpu-vulkan")
    assert expected == decide("gpu-vulkan", Runtime.UNRESOLVED, UNUSABLE)


def test_demotion_waits_for_the_grace() -> None:
    """While the lane is unsettled (unusable, within the grace) a vulkan slot is not demoted."""
    expected = Verdict(
        Action.KEEP, Reason.DEMOTION_GRACE, Runtime.LLAMA_SERVER, "gpu-vulkan", image=NOT_CAPABLE
    )
    assert expected == decide("gpu-vulkan", Runtime.LLAMA_SERVER, UNSETTLED)


def test_a_probe_that_could_not_run_demotes_nothing() -> None:
    """When the probe itself failed (e.g. no such service user), vulkan slots are kept."""
    expected = Verdict(
        Action.KEEP, Reason.LANE_UNKNOWN, Runtime.LLAMA_SERVER, "gpu-vulkan", image=NOT_CAPABLE
    )
    assert expected == decide("gpu-vulkan", Runtime.LLAMA_SERVER, UNKNOWN)


def test_own_demotion_is_restored_when_the_lane_is_usable() -> None:
    """A slot the reconciler demoted to cpu goes to gpu-rocm once the lane is usable again."""
    expected = Verdict(
        Action.RELABEL, Reason.RESTORE_OWN_DEMOTION, Runtime.LLAMA_SERVER, "cpu", "gpu-rocm"
    )
    assert expected == decide("cpu", Runtime.LLAMA_SERVER, USABLE, demoted_by_us=True)


@pytest.mark.parametrize(
    "facts", [UNUSABLE, UNSETTLED, UNKNOWN], ids=["unusable", "unsettled", "unknown"]
)
def test_own_demotion_stays_while_the_lane_is_not_usable(facts: HostFacts) -> None:
    """A demoted slot stays on cpu while the lane is not usable."""
    assert Action.KEEP == decide("cpu", Runtime.LLAMA_SERVER, facts, demoted_by_us=True).action


def test_operator_cpu_slot_is_not_promoted() -> None:
    """A slot an operator put on cpu (not demoted by us) stays on cpu."""
    assert Action.KEEP == decide("cpu", Runtime.LLAMA_SERVER, USABLE).action


@pytest.mark.parametrize("facts", [USABLE, UNUSABLE, UNSETTLED, UNKNOWN, NOT_AMD])
@pytest.mark.parametrize("device", ["gpu-rocm", "cpu", "npu", "gpu-cuda", "gpu-vulkan"])
@pytest.mark.parametrize("runtime", list(Runtime))
@pytest.mark.parametrize("demoted", [True, False])
def test_never_relabels_to_gpu_vulkan(
    runtime: Runtime, device: str, facts: HostFacts, demoted: bool
) -> None:
    """Whatever the inputs, the decision never produces gpu-vulkan."""
    verdict = decide(device, runtime, facts, demoted_by_us=demoted)
    assert verdict.new != "gpu-vulkan"
    assert (verdict.new is None) == (verdict.action is not Action.RELABEL)


def test_the_decision_is_pure() -> None:
    """Deciding twice on the same inputs gives the same verdict and leaves the slot alone."""
    doc = slot()
    before = dataclasses.replace(doc)
    first = policy.decide(doc, runtime=Runtime.LLAMA_SERVER, image=None, facts=USABLE)
    second = policy.decide(doc, runtime=Runtime.LLAMA_SERVER, image=None, facts=USABLE)
    assert first == second
    assert before == doc
