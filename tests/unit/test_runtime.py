"""hal0's seven-row runtime table and its profile catalog."""

from __future__ import annotations

import pytest

from hal0_reconciler.model import Catalog, ProfileInfo, Runtime
from hal0_reconciler.slots import runtime
from hal0_reconciler.slots.document import SlotDoc
from helpers.slotdocs import slot_doc

CATALOG = runtime.catalog_from_profiles(
    {
        "profile": {
            "my-vllm": {"runtime_family": "vllm"},
            "pinned-llama": {"runtime_family": "llama-server", "image": "example.org/llama:1"},
            "npu-thing": {"device_class": "npu"},
            "studio": {"device_class": "img"},
            "speech": {"image": "ghcr.io/hal0ai/hal0-toolbox-kokoro:v2"},
            "vulkan": {"image": "example.org/vulkan:override"},
        }
    }
)


slot = slot_doc


ROWS = {
    "1 family flm": (slot(profile="flm"), Runtime.FLM),
    "1 device npu": (slot(device="npu"), Runtime.FLM),
    "1 device_class npu": (slot(profile="npu-thing"), Runtime.FLM),
    "2 family qwen3tts": (slot(profile="qwen3-tts"), Runtime.QWEN3TTS),
    "2 legacy tts-qwen3": (slot(profile="tts-qwen3"), Runtime.QWEN3TTS),
    "3 family kokoro": (slot(profile="kokoro"), Runtime.KOKORO),
    "3 legacy tts profile": (slot(profile="tts"), Runtime.KOKORO),
    "3 kokoro image": (slot(profile="speech"), Runtime.KOKORO),
    "3 type tts": (slot(kind="tts"), Runtime.KOKORO),
    "4 family moonshine": (slot(profile="moonshine"), Runtime.STT),
    "4 type transcription": (slot(kind="transcription"), Runtime.STT),
    "5 family comfyui": (slot(profile="comfyui"), Runtime.COMFYUI),
    "5 device_class img": (slot(profile="studio"), Runtime.COMFYUI),
    "5 provider comfyui": (slot(provider="comfyui"), Runtime.COMFYUI),
    "5 type image": (slot(kind="image"), Runtime.COMFYUI),
    "6 unknown family": (slot(profile="my-vllm"), Runtime.UNRESOLVED),
    "7 llm": (slot(), Runtime.LLAMA_SERVER),
    "7 embedding": (slot(kind="embedding", profile="embedding"), Runtime.LLAMA_SERVER),
    "7 reranking": (slot(kind="reranking", profile="vulkan"), Runtime.LLAMA_SERVER),
    "7 chadrock-moe": (slot(profile="chadrock-moe"), Runtime.LLAMA_SERVER),
    "7 explicit llama-server": (slot(profile="pinned-llama"), Runtime.LLAMA_SERVER),
    "7 profile not in catalog": (slot(profile="nobody-knows"), Runtime.LLAMA_SERVER),
    "7 no type": (slot(kind=None), Runtime.LLAMA_SERVER),
}


@pytest.mark.parametrize(("doc", "expected"), list(ROWS.values()), ids=list(ROWS))
def test_runtime_table(doc: SlotDoc, expected: Runtime) -> None:
    """The first matching row of hal0's table decides the runtime."""
    assert expected == runtime.runtime_of(doc, CATALOG)


def test_first_row_wins_over_later_rows() -> None:
    """An npu device beats a tts type (row 1 before row 3)."""
    assert Runtime.FLM == runtime.runtime_of(slot(kind="tts", device="npu"), CATALOG)


def test_unreadable_catalog_leaves_profiled_slots_unresolved() -> None:
    """When the profiles file cannot be read, a slot with a profile cannot be resolved."""
    broken = Catalog(dict(runtime.BUILTIN_PROFILES), error="profiles.toml: bad")
    assert Runtime.UNRESOLVED == runtime.runtime_of(slot(profile="coding"), broken)
    assert Runtime.LLAMA_SERVER == runtime.runtime_of(slot(), broken)


def test_profiles_file_overlays_builtins() -> None:
    """A profile in the file replaces a built-in's fields it sets and keeps the rest."""
    assert (
        ProfileInfo("vulkan", None, "example.org/vulkan:override", "vulkan", "gpu")
        == CATALOG.profiles["vulkan"]
    )


@pytest.mark.parametrize("data", [{"profile": "nope"}, {"profile": {"x": 3}}])
def test_malformed_profiles_are_an_error(data: dict[str, object]) -> None:
    """A [profile] that is not a table of tables makes the catalog unreadable."""
    assert runtime.catalog_from_profiles(data).error is not None


def test_a_profile_overlay_keeps_the_builtin_image_it_does_not_set() -> None:
    """[profile.rocm] with only a backend still has the built-in ROCm image."""
    catalog = runtime.catalog_from_profiles({"profile": {"rocm": {"backend": "rocm"}}})
    assert runtime.BUILTIN_PROFILES["rocm"].image == catalog.profiles["rocm"].image
    assert catalog.profiles["rocm"].image is not None
