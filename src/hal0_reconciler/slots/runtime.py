"""Which runtime hal0 starts for a slot: hal0's first-match table, with its profile catalog. [pure]

The profile catalog is hal0's built-in profiles overlaid by ``/etc/hal0/profiles.toml``
(``[profile.<name>]`` tables). hal0 never stores a profile's runtime family; it derives it
(``_runtime_family`` in hal0's ``profiles`` package). We do the same, in this order:

1. an explicit ``runtime_family`` key in the profile (our extension: lets an operator pin it);
2. name ``flm`` or ``device_class = "npu"`` (or an FLM image) -> ``flm``;
3. name ``qwen3-tts``/``tts-qwen3`` (or a qwen3tts image) -> ``qwen3tts``;
4. name ``kokoro``/``tts`` (or a kokoro image) -> ``kokoro``;
5. name ``moonshine`` (or a moonshine image) -> ``moonshine``;
6. name ``comfyui`` or ``device_class = "img"`` (or a comfyui image) -> ``comfyui``;
7. otherwise ``llama-server``.

hal0 also maps a profile's ``runner`` through its runner-image table, which is not a
documented contract; an unknown runner falls through to the rules above. A profile name that
is not in the catalog has no family (hal0 catches the lookup error), so the slot is decided by
its device/type/provider and ends in llama.cpp when nothing else matches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hal0_reconciler.model import Catalog, Device, ProfileInfo, Runtime

if TYPE_CHECKING:  # only annotated: the profile catalog is read without the slot parser
    from hal0_reconciler.slots.document import SlotDoc

_TOOLBOX = "ghcr.io/hal0ai/amd-strix-halo-toolboxes"
_ROCM_IMAGE = f"{_TOOLBOX}:rocm-7.2.4-rocmfp4-server"
_VULKAN_IMAGE = f"{_TOOLBOX}:vulkan-radv-server"

# hal0's seed profiles (1.0) carry no image; the pre-1.0 installer profiles that shipped slot
# files still name (vulkan, tts, rocm...) carry the image and device class they were seeded with.
BUILTIN_PROFILES: Mapping[str, ProfileInfo] = {
    p.name: p
    for p in (
        *(
            ProfileInfo(name, None)
            for name in (
                "chat",
                "chat-long-context",
                "dense",
                "moe",
                "embedding",
                "reranking",
                "cpu-chat",
                "brain",
                "chadrock-dense",
                "chadrock-moe",
                "thinking",
                "coding",
                "promptforge",
                "kokoro",
                "moonshine",
                "qwen3-tts",
                "comfyui",
            )
        ),
        ProfileInfo("flm", None, "ghcr.io/hal0ai/hal0-toolbox-flm:0.9.43", None, "npu"),
        ProfileInfo("rocm", None, _ROCM_IMAGE, "rocm", "gpu"),
        ProfileInfo("rocm-dnse", None, _ROCM_IMAGE, "rocm", "gpu"),
        ProfileInfo("rocm-moe", None, _ROCM_IMAGE, "rocm", "gpu"),
        ProfileInfo("vulkan", None, _VULKAN_IMAGE, "vulkan", "gpu"),
        ProfileInfo("cpu-llm", None, _VULKAN_IMAGE, None, "cpu"),
        ProfileInfo("tts", None, "ghcr.io/hal0ai/hal0-toolbox-kokoro:v1", None, "cpu"),
        ProfileInfo("tts-qwen3", None, "ghcr.io/hal0ai/hal0-toolbox-qwen3tts:v1", "rocm", "gpu"),
    )
}


def catalog_from_profiles(data: Mapping[str, Any]) -> Catalog:
    """Build the catalog from a parsed profiles file: built-ins overlaid by its profiles."""
    profiles = dict(BUILTIN_PROFILES)
    tables = data.get("profile", {})
    if not isinstance(tables, Mapping):
        return Catalog(profiles, error="[profile] is not a table")
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            return Catalog(profiles, error=f"[profile.{name}] is not a table")
        base = profiles.get(name, ProfileInfo(name, None))
        profiles[name] = ProfileInfo(
            name=name,
            runtime_family=_text(table.get("runtime_family")) or base.runtime_family,
            image=_text(table.get("image")) or base.image,
            backend=_text(table.get("backend")) or base.backend,
            device_class=_text(table.get("device_class")) or base.device_class,
        )
    return Catalog(profiles)


def profile_family(profile: ProfileInfo) -> str:
    """The runtime family hal0 derives for a profile (see the module docstring)."""
    if profile.runtime_family:
        return profile.runtime_family
    name = profile.name
    image = (profile.image or "").lower()
    if name == "flm" or profile.device_class == "npu" or "flm" in image:
        return "flm"
    if name in {"qwen3-tts", "tts-qwen3"} or "qwen3tts" in image or "qwen3-tts" in image:
        return "qwen3tts"
    if name in {"kokoro", "tts"} or "kokoro" in image:
        return "kokoro"
    if name == "moonshine" or "moonshine" in image:
        return "moonshine"
    if name == "comfyui" or profile.device_class == "img" or "comfyui" in image:
        return "comfyui"
    return "llama-server"


def runtime_of(slot: SlotDoc, catalog: Catalog) -> Runtime:
    """hal0's seven-row runtime table; the first matching row wins."""
    if _profile_lookup_fails(slot):
        return Runtime.UNRESOLVED
    family: str | None = None
    if slot.profile:
        if catalog.error is not None:
            return Runtime.UNRESOLVED  # the profile cannot be read
        profile = catalog.profiles.get(slot.profile)
        family = profile_family(profile) if profile is not None else None
    if family == "flm" or slot.device == Device.NPU:
        return Runtime.FLM
    if family == "qwen3tts":
        return Runtime.QWEN3TTS
    if family == "kokoro" or slot.type == "tts":
        return Runtime.KOKORO
    if family == "moonshine" or slot.type == "transcription":
        return Runtime.STT
    if family == "comfyui" or slot.provider == "comfyui" or slot.type == "image":
        return Runtime.COMFYUI
    if family is not None and family != "llama-server":
        return Runtime.UNRESOLVED
    return Runtime.LLAMA_SERVER


def _profile_lookup_fails(slot: SlotDoc) -> bool:
    """hal0 (every release with the relabel) looks a profile up as ``profile`` else
    ``slot.profile`` of the table holding the device; a ``slot`` key there that is not a table
    makes that lookup raise, and hal0's relabel skips the slot ("runtime unresolved")."""
    holder: Any = slot.data
    if slot.table and isinstance(holder.get("slot"), dict):
        holder = holder["slot"]
    return "slot" in holder and not isinstance(holder["slot"], dict) and not holder.get("profile")


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None
