"""The parity corpus: installed boxes written by the project, deterministic and large.

A box (``Box``) is what differs per process on hal0's side (hal0 reads its manifest once per
process): the manifests, ``hal0.toml``, ``api.env`` and the restore marker. Every box holds the
same slot set (``slot_files``: ~170 files): pinned and unpinned, flat and nested ``[slot]``,
keys split between the top level and ``[slot]``, both tables ``gpu-vulkan``, retired pins and
runner keys the 1.4+ conversion rewrites, padded pins, legacy ``backend``, non-llama runtimes,
and controls that are not ``gpu-vulkan`` at all. The images are this project's test values in
hal0's spellings (``repo:tag@digest``, ``repo:tag``, ``repo@digest``); the manifests follow
hal0's schema (``runners`` for 1.4+, ``toolbox_images`` before), written here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

G = "ghcr.io/hal0ai"
PIN_REPO = f"{G}/hal0-llama"  # the standard runner's repo in this corpus (not a retired one)
PIN_TAGNAME = "b11552-r1a2b3c4"
PIN_DIGEST_VALUE = "sha256:" + "5e" * 32
PIN_FULL = f"{PIN_REPO}:{PIN_TAGNAME}@{PIN_DIGEST_VALUE}"
PIN_TAG = f"{PIN_REPO}:{PIN_TAGNAME}"
PIN_DIGEST = f"{PIN_REPO}@{PIN_DIGEST_VALUE}"
OTHER_TAG = f"{PIN_REPO}:b11000-r0000000"  # the same repo, a tag no manifest gates
USER_IMG = "docker.io/someone/llama-vulkan:latest"  # an operator's own image
C0826 = f"{G}/hal0-combined:0826"  # retired in 1.4+; the 1.0-1.3 Vulkan-fixed image
STRIX = f"{G}/hal0-strix-vulkan:0831"  # retired in 1.4+; capable in 1.2-1.3
C0824 = f"{G}/hal0-combined:0824"  # a 1.0-1.3 stale former default (looked through)
ADE07BA = f"{G}/hal0-rocmfpx:ade07ba"  # stale in 1.0-1.3, a retired repo in 1.4+
TOOLBOX = f"{G}/hal0-toolbox-vulkan:v1"  # a retired repo prefix in 1.4+
LOCALHOST = "localhost/hal0-rocmfpx:vulkan-minicpm5"
STRIX_DIGEST = "sha256:" + "c3" * 32

IMAGES: tuple[str | None, ...] = (
    None, PIN_FULL, PIN_TAG, PIN_DIGEST, f"  {PIN_TAG} ", OTHER_TAG, USER_IMG, C0826, STRIX,
    C0824, ADE07BA, TOOLBOX, f" {C0826}", LOCALHOST,
)  # fmt: skip
BINARIES: tuple[str, ...] = ("rocmfpx", "vulkanfpx", "strix", "standard", "promptforge", "cpu")
SHAPES: tuple[str, ...] = (
    "flat",  # every key at the top level
    "nested",  # every key under [slot]
    "split_device_top",  # device at the top level, image_pin/binary under [slot]
    "split_device_slot",  # device under [slot], image_pin/binary at the top level
    "both_vulkan",  # device = gpu-vulkan in both tables (the rest under [slot])
    "top_vulkan_slot_rocm",  # top-level gpu-vulkan, [slot] gpu-rocm: launches gpu-rocm
    "top_rocm_slot_vulkan",  # top-level gpu-rocm, [slot] gpu-vulkan: launches gpu-vulkan
)
RUNTIMES: tuple[tuple[str, str], ...] = (
    ("type", "tts"),
    ("type", "transcription"),
    ("provider", "comfyui"),
    ("type", "image"),
)


def _value(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is JSON's string syntax for these values


def _slot_text(shape: str, keys: dict[str, str], *, model: bool) -> str:
    """A slot file: ``keys`` (device among them) placed by ``shape``."""
    top: dict[str, str] = {}
    slot: dict[str, str] = {}
    device = keys.pop("device", None)
    if shape == "flat":
        top = {"device": device, **keys} if device else dict(keys)
    elif shape == "nested":
        slot = {"device": device, **keys} if device else dict(keys)
    elif shape == "split_device_top":
        top, slot = ({"device": device} if device else {}), dict(keys)
    elif shape == "split_device_slot":
        top, slot = dict(keys), ({"device": device} if device else {})
    elif shape == "both_vulkan":
        top, slot = {"device": "gpu-vulkan"}, {"device": "gpu-vulkan", **keys}
    elif shape == "top_vulkan_slot_rocm":
        top, slot = {"device": "gpu-vulkan"}, {"device": "gpu-rocm", **keys}
    else:  # top_rocm_slot_vulkan
        top, slot = {"device": "gpu-rocm"}, {"device": "gpu-vulkan", **keys}
    lines = [f"{k} = {_value(v)}" for k, v in top.items()]
    if slot:
        lines += ["", "[slot]"] + [f"{k} = {_value(v)}" for k, v in slot.items()]
    if model:
        lines += ["", "[model]", 'id = "qwen3-8b-q4"']
    return "\n".join(lines) + "\n"


def slot_files() -> dict[str, str]:
    """The slot set every box holds, by file name (deterministic)."""
    cases: list[tuple[str, str]] = []  # (label, text)
    for shape in SHAPES:
        for i, image in enumerate(IMAGES):
            keys = {"device": "gpu-vulkan"} | ({"image_pin": image} if image else {})
            cases.append((f"{shape}-img{i:02d}", _slot_text(shape, keys, model=i % 2 == 0)))
    for binary in BINARIES:
        for shape in ("flat", "nested", "split_device_top"):
            for i, image in enumerate((None, PIN_TAG, C0826, USER_IMG)):
                keys = {"device": "gpu-vulkan", "binary": binary}
                keys |= {"image_pin": image} if image else {}
                cases.append((f"{shape}-bin-{binary}-img{i}", _slot_text(shape, keys, model=True)))
    for key, value in RUNTIMES:
        for shape in ("flat", "nested", "split_device_top"):
            keys = {"device": "gpu-vulkan", key: value}
            cases.append((f"{shape}-{key}-{value}", _slot_text(shape, keys, model=False)))
    for shape in ("flat", "nested"):  # legacy backend= (no device key)
        for i, image in enumerate((None, PIN_TAG, C0826)):
            keys = {"backend": "vulkan"} | ({"image_pin": image} if image else {})
            cases.append((f"{shape}-backend-vulkan-img{i}", _slot_text(shape, keys, model=True)))
        cases.append((f"{shape}-backend-rocm", _slot_text(shape, {"backend": "rocm"}, model=True)))
    for shape in ("flat", "nested"):  # controls: not gpu-vulkan
        for device in ("gpu-rocm", "cpu", "npu"):
            keys = {"device": device, "image_pin": C0826}
            cases.append((f"{shape}-control-{device}", _slot_text(shape, keys, model=True)))
        cases.append((f"{shape}-control-nodevice", _slot_text(shape, {}, model=True)))
    return {f"s{n:03d}-{label}.toml": text for n, (label, text) in enumerate(cases)}


def _manifest(
    *, tag: str | None = PIN_TAGNAME, digest: str | None = PIN_DIGEST_VALUE, gated: bool = True
) -> str:
    def row(image: str, lanes: list[str]) -> dict[str, object]:
        return {"image": image, "tag": "v1", "digest": None, "lanes_gated": lanes}

    runners: dict[str, object] = {
        "standard": {
            "image": PIN_REPO,
            "tag": tag,
            "digest": digest,
            "lanes_gated": ["rocm", "vulkan"] if gated else ["rocm"],
        },
        "cpu": row("ghcr.io/hal0ai/hal0-llama-cpu", ["cpu"]),
        "cuda": row("ghcr.io/ggml-org/llama.cpp", ["cuda"]),
        "flm": row("ghcr.io/hal0ai/hal0-flm", []),
        "kokoro": row("ghcr.io/hal0ai/hal0-kokoro", []),
        "moonshine": row("ghcr.io/hal0ai/hal0-moonshine", []),
        "comfyui": row("ghcr.io/hal0ai/hal0-comfy", ["rocm"]),
        "qwen3tts": row("ghcr.io/hal0ai/hal0-qwen3tts", ["rocm"]),
    }
    toolbox = {
        "rocmfpx": {"tag": C0826, "digest": None},
        "strix": {"tag": STRIX, "digest": STRIX_DIGEST},
    }
    doc = {"_schema": "hal0.manifest.v1", "version": "test", "channel": "stable"}
    return json.dumps({**doc, "runners": runners, "toolbox_images": toolbox}, indent=2) + "\n"


GATED = _manifest()
GATED_NULL_DIGEST = _manifest(digest=None)
UNGATED = _manifest(gated=False)
UNPUBLISHED = _manifest(tag=None, digest=None)
DIGEST_NO_TAG = _manifest(tag=None)  # invalid: a digest needs a tag
BROKEN = '{"runners": {"standard": '  # a half-written file
NOT_OBJECT = "[]\n"
EMPTY_RUNNERS = json.dumps({"runners": {}}) + "\n"


def _default_images(**images: str) -> str:
    table = ", ".join(f"{k} = {_value(v)}" for k, v in images.items())
    return f"[slots]\ndefault_images = {{ {table} }}\n"


INVALID_TELEMETRY = '\n[telemetry]\nenabled = "maybe"\n'  # valid TOML, not a bool for hal0


@dataclass(frozen=True)
class Box:
    """One installed box's hal0 facts besides the code (``None``: the file is absent)."""

    name: str
    release_manifest: str | None = None
    etc_manifest: str | None = None
    hal0_toml: str | None = None
    api_env: str | None = None
    restore_marker: bool = False  # an active one: ``version=`` the installed release
    # hal0.toml's [slots] part when another section of it is invalid for hal0 (decision 5:
    # hal0 then drops every default_images, the reconciler validates only [slots])
    slots_part: str | None = None


BOXES: tuple[Box, ...] = (
    Box("gated", release_manifest=GATED),
    Box("gated-null-digest", GATED_NULL_DIGEST, hal0_toml=_default_images(standard=PIN_TAG)),
    Box("ungated-env-pin", UNGATED, api_env=f"HAL0_RUNNER_IMAGE_STANDARD={PIN_FULL}\n"),
    Box(
        "no-manifest-rocmfpx-default",
        hal0_toml=_default_images(rocmfpx=C0826),
        api_env=f"HAL0_TOOLBOX_IMAGE_ROCMFPX={USER_IMG}\n",
    ),
    Box("broken-manifest", BROKEN),
    Box("invalid-manifest-alias-key", DIGEST_NO_TAG, hal0_toml=_default_images(vulkanfpx=STRIX)),
    Box("etc-manifest-only", etc_manifest=GATED, api_env=f"HAL0_TOOLBOX_IMAGE_VULKANFPX={STRIX}\n"),
    Box(
        "two-manifests-invalid-key",
        GATED,
        etc_manifest=UNGATED,
        hal0_toml=_default_images(nosuch=USER_IMG),
    ),
    Box(
        "restore-marker",
        GATED,
        hal0_toml=_default_images(rocmfpx=USER_IMG),
        restore_marker=True,
    ),
    Box("broken-hal0-toml", GATED, hal0_toml="[slots\ndefault_images = 1\n"),
    Box("unpublished-env-tag", UNPUBLISHED, api_env=f"HAL0_RUNNER_IMAGE_STANDARD= {PIN_TAG} \n"),
    Box("not-object-manifest", NOT_OBJECT, etc_manifest=EMPTY_RUNNERS),
    Box(
        "invalid-other-section",
        GATED,
        hal0_toml=_default_images(rocmfpx=USER_IMG) + INVALID_TELEMETRY,
        slots_part=_default_images(rocmfpx=USER_IMG),
    ),
)
