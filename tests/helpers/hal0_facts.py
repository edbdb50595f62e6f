"""Facts of a 1.3.0-shaped hal0 (allowlist era), as tests use them: project-written values in
the shape the reader gives (the image names are hal0's published ones, the sets small)."""

from __future__ import annotations

from types import MappingProxyType

from hal0_reconciler.model import Hal0Facts, Hal0Rule

_GHCR = "ghcr.io/hal0ai"
_NEWEST_DEFAULT = f"{_GHCR}/hal0-combined:0826"
_NEWEST_STRIX = f"{_GHCR}/hal0-strix-vulkan:0831"

ALLOWLIST_13 = Hal0Facts(
    version=None,
    default_image=_NEWEST_DEFAULT,
    capable=frozenset({_NEWEST_DEFAULT, _NEWEST_STRIX}),
    stale=frozenset(
        {
            f"{_GHCR}/hal0-combined:0824",
            f"{_GHCR}/hal0-combined:0822",
            f"{_GHCR}/hal0-rocmfpx:ade07ba",
            f"{_GHCR}/hal0-rocmfpx:c077206",
            f"{_GHCR}/hal0-rocmfpx:vulkan-minicpm5",
            f"{_GHCR}/hal0-rocmfpx:server",
            f"{_GHCR}/amd-strix-halo-toolboxes:rocmfpx-7aa484a",
            f"{_GHCR}/amd-strix-halo-toolboxes:vulkan-radv-server",
            f"{_GHCR}/amd-strix-halo-toolboxes:rocm-7.2.4-rocmfp4-server",
            "localhost/hal0-rocmfpx:vulkan-minicpm5",
        }
    ),
    bundled=MappingProxyType(
        {
            "rocmfpx": _NEWEST_DEFAULT,
            "promptforge": f"{_GHCR}/hal0-promptforge:v2.3-qwen38",
            "strix": _NEWEST_STRIX,
            "cuda": "ghcr.io/ggml-org/llama.cpp:server-cuda",
            "cpu": f"{_GHCR}/hal0-toolbox-cpu:v1",
            "flm": f"{_GHCR}/hal0-toolbox-flm:0.9.44",
            "kokoro": f"{_GHCR}/hal0-toolbox-kokoro:v1",
            "moonshine": f"{_GHCR}/hal0-toolbox-moonshine:v1",
            "qwen3tts": f"{_GHCR}/hal0-toolbox-qwen3tts:v1",
            "comfyui": f"{_GHCR}/hal0-comfyui:latest",
        }
    ),
    manifest_keys=MappingProxyType(
        {
            k: k
            for k in (
                "promptforge",
                "strix",
                "cpu",
                "flm",
                "kokoro",
                "moonshine",
                "qwen3tts",
                "comfyui",
            )
        }
    ),
    aliases=MappingProxyType({"vulkanfpx": "rocmfpx"}),
    sources=MappingProxyType(
        dict.fromkeys(
            ("default_image", "capable", "stale", "bundled"),
            "tests: a 1.3.0-shaped hal0",
        )
    ),
    rule=Hal0Rule.ALLOWLIST,
    release="1.3.0",
)
