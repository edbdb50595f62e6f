"""The image hal0 will really launch for a slot, decided the way hal0 decides it.  [pure]

hal0's ladder, first hit wins:

1. ``image_pin``, a non-empty string, taken verbatim;
2. the runner key: ``binary`` when set and known to the installed hal0 (legacy aliases folded,
   ``vulkanfpx`` -> ``rocmfpx``), else from the device/backend (cuda -> ``cuda``, cpu -> ``cpu``,
   anything else -> ``rocmfpx``; ``gpu-vulkan`` -> ``rocmfpx``, or the separate ``vulkanfpx``
   runner of a hal0 from before the collapse). For that runner:
   ``[slots].default_images[<runner>]`` in hal0.toml -> ``HAL0_TOOLBOX_IMAGE_<RUNNER>`` in hal0's
   environment (for ``rocmfpx`` also its alias ``HAL0_TOOLBOX_IMAGE_VULKANFPX``) -> the release
   manifest's ref, for runners with a manifest key -> the runner's bundled image;
3. a result that is exactly (no strip) one of hal0's stale former defaults is looked through:
   hal0's update retags it to the current default for the slot's backend (step 2 without
   ``image_pin``, ``binary`` and ``[slots].default_images``: environment, manifest, bundled).
   A stale value of ``[slots].default_images`` itself is judged as it is (the image that would
   really launch; hal0's own relabel looks through it, its load check refuses it).

Vulkan-capable means the result, stripped of surrounding whitespace, is in hal0's capable set
(a manifest digest ref is compared as it is, as hal0 compares it). Under a hal0 that retired the
lane nothing is capable. Anything that stops the ladder (no such runner in the installed hal0)
means "not capable".
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from hal0_reconciler.model import Device, Hal0Facts, Hal0Rule, ImageResolution, Rung

if TYPE_CHECKING:  # only annotated: hal0's facts are read without the slot parser
    from hal0_reconciler.slots.document import SlotDoc

_GHCR = "ghcr.io/hal0ai"
_NEWEST_DEFAULT = f"{_GHCR}/hal0-combined:0826"
_NEWEST_STRIX = f"{_GHCR}/hal0-strix-vulkan:0831"

NEWEST_KNOWN = Hal0Facts(
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
            "newest known to hal0-reconciler (hal0 release of 2026-08-31)",
        )
    ),
)
"""The newest values known (hal0 release of 2026-08-31): the fallback for a missing source."""


def effective_image(slot: SlotDoc, facts: Hal0Facts) -> ImageResolution:
    """What hal0 will launch for ``slot``, the rung it came from, and whether it is capable."""
    runner: str | None = None
    pin = slot.image_pin
    if pin:
        image: str | None = pin
        rung = Rung.IMAGE_PIN
    else:
        runner = _runner_key(slot, facts)
        image, rung = _runner_image(runner, facts)
    stale: str | None = None
    note: str | None = None
    if image is not None and image in facts.stale:  # exact, as hal0's stale test: no strip
        if rung is Rung.DEFAULT_IMAGES:
            note = STALE_DEFAULT_IMAGES_NOTE
        else:  # hal0's look-through (and its retag) skip [slots].default_images
            stale = image
            runner = _device_runner(slot, facts)
            image, rung = _runner_image(runner, facts, operator_defaults=False)
    if image is None:
        error = _missing_runner(runner, facts)
        return ImageResolution(
            None, Rung.UNRESOLVED, runner, capable=False, stale=stale, error=error
        )
    capable = image.strip() in facts.capable  # only the capable test strips
    if facts.rule is Hal0Rule.LANE_RETIRED:
        capable, note = False, LANE_RETIRED_NOTE
    elif not capable and rung is Rung.MANIFEST and runner is not None:
        note = _digest_note(runner, facts) or note
    return ImageResolution(image, rung, runner, capable, stale=stale, note=note)


STALE_DEFAULT_IMAGES_NOTE = (
    "a stale former default set in [slots].default_images: judged as the image that launches, "
    "not looked through"
)
LANE_RETIRED_NOTE = "this hal0 retired the llama.cpp Vulkan lane: no image serves it"


def _digest_note(runner: str, facts: Hal0Facts) -> str | None:
    """A manifest digest ref whose tag form is capable: hal0 compares exact strings."""
    tag = facts.manifest_tags.get(facts.manifest_keys.get(runner, ""))
    if tag is None or tag.strip() not in facts.capable:
        return None
    return (
        f"the release manifest pins {runner} by digest; hal0 tests the capable set by exact "
        f"string and does not map a digest to its tag {tag}, so it judges this not capable too"
    )


def _missing_runner(runner: str | None, facts: Hal0Facts) -> str:
    if runner in facts.unknown_runners:
        return f"the image of runner {runner!r} is in hal0's runner catalog, which was not read"
    return f"the installed hal0 has no runner {runner!r}"


def _runner_key(slot: SlotDoc, facts: Hal0Facts) -> str:
    """``binary`` when it names a runner the installed hal0 knows, else the device's runner."""
    if slot.binary:
        key = facts.aliases.get(slot.binary, slot.binary)
        if key in facts.bundled or key in facts.unknown_runners:
            return key
    return _device_runner(slot, facts)


def _device_runner(slot: SlotDoc, facts: Hal0Facts) -> str:
    """The runner hal0 picks from the device (or legacy backend) alone."""
    if slot.device == Device.GPU_CUDA or slot.backend == "cuda":
        return "cuda"
    if slot.device == Device.CPU or slot.backend == "cpu":
        return "cpu"
    if slot.device == Device.GPU_VULKAN:
        return facts.vulkan_runner  # a separate vulkanfpx runner before the collapse
    return "rocmfpx"


def _runner_image(
    runner: str, facts: Hal0Facts, *, operator_defaults: bool = True
) -> tuple[str | None, Rung]:
    """One runner's ladder: hal0.toml override (not for a look-through), environment,
    manifest, bundled image."""
    if runner not in facts.bundled:
        return None, Rung.UNRESOLVED
    names = [runner, *sorted(a for a, canon in facts.aliases.items() if canon == runner)]
    configured = _first(facts.default_images, names) if operator_defaults else None
    if configured:
        return configured, Rung.DEFAULT_IMAGES
    environment = _first(facts.environment, [f"HAL0_TOOLBOX_IMAGE_{n.upper()}" for n in names])
    if environment:
        return environment, Rung.ENVIRONMENT
    manifest_key = facts.manifest_keys.get(runner)
    if manifest_key is not None and facts.manifest.get(manifest_key):
        return facts.manifest[manifest_key], Rung.MANIFEST
    return facts.bundled[runner], Rung.BUNDLED


def _first(values: Mapping[str, str], names: list[str]) -> str | None:
    """The first of ``names`` with a value that is not blank, stripped as hal0 strips it."""
    for name in names:
        value = values.get(name, "").strip()
        if value:
            return value
    return None
