"""The image hal0 will really launch for a slot, decided the way its release decides it.  [pure]

**1.0.0-1.3.0 (allowlist)**, first hit wins:

1. ``image_pin``, a non-empty string, taken verbatim;
2. the runner key: ``binary`` when set and known to the installed hal0 (1.1-1.3 fold the
   alias ``vulkanfpx`` -> ``rocmfpx``), else from the device/backend (cuda -> ``cuda``, cpu ->
   ``cpu``, ``gpu-vulkan`` -> ``vulkanfpx`` on 1.0.0, else ``rocmfpx``). For that runner:
   ``[slots].default_images[<runner>]`` -> ``HAL0_TOOLBOX_IMAGE_<RUNNER>`` in hal0's
   environment (1.1-1.3: for ``rocmfpx`` also its alias variable) -> the release manifest's
   ref, for runners with a manifest key -> the runner's bundled image;
3. a result that is exactly (no strip) one of hal0's stale former defaults is looked through:
   step 2 again for the device's runner, without ``image_pin``, ``binary`` and
   ``[slots].default_images``. A stale value of ``[slots].default_images`` itself is judged as
   it is (the image that would really launch).

**1.4.0+ (manifest pins)**: ``image_pin`` verbatim -> ``[slots].default_images[<runner>]`` ->
``HAL0_RUNNER_IMAGE_<KEY>`` -> the runner's manifest pin (``tag: null`` or no row: no image).
The runner is ``binary`` when it names a runner of the release, else cuda -> ``cuda``, cpu ->
``cpu``, anything else -> ``standard``. No stale look-through, no bundled default. The file is
judged as hal0's runner-system conversion leaves it (a retired pin dropped, a retired
``binary`` mapped) unless a downgrade's restore marker holds.

Vulkan-capable means the result, stripped of surrounding whitespace, is in the release's
capable set. Anything that stops the ladder means "not capable" (fail closed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hal0_reconciler.model import Device, Hal0Facts, Hal0Rule, ImageResolution, Rung

if TYPE_CHECKING:  # only annotated: hal0's facts are read without the slot parser
    from hal0_reconciler.slots.document import SlotDoc


def effective_image(slot: SlotDoc, facts: Hal0Facts) -> ImageResolution:
    """What hal0 will launch for ``slot``, the rung it came from, and whether it is capable."""
    if facts.rule is Hal0Rule.PINS:
        return _pins_image(slot, facts)
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
        error = f"the installed hal0 has no runner {runner!r}"
        return ImageResolution(
            None, Rung.UNRESOLVED, runner, capable=False, stale=stale, error=error
        )
    capable = image.strip() in facts.capable  # only the capable test strips
    return ImageResolution(image, rung, runner, capable, stale=stale, note=note)


STALE_DEFAULT_IMAGES_NOTE = (
    "a stale former default set in [slots].default_images: judged as the image that launches, "
    "not looked through"
)


def _runner_key(slot: SlotDoc, facts: Hal0Facts) -> str:
    """``binary`` when it names a runner the installed hal0 knows, else the device's runner."""
    if slot.binary:
        key = facts.aliases.get(slot.binary, slot.binary)
        if key in facts.bundled:
            return key
    return _device_runner(slot, facts)


def _device_runner(slot: SlotDoc, facts: Hal0Facts) -> str:
    """The runner hal0 picks from the device (or legacy backend) alone."""
    if slot.device == Device.GPU_CUDA or slot.backend == "cuda":
        return "cuda"
    if slot.device == Device.CPU or slot.backend == "cpu":
        return "cpu"
    if slot.device == Device.GPU_VULKAN:
        return facts.vulkan_runner  # 1.0.0: a separate vulkanfpx runner
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


# -- 1.4+: the manifest pins ------------------------------------------------------------------
def _pins_image(slot: SlotDoc, facts: Hal0Facts) -> ImageResolution:
    """1.4+'s chain: image_pin verbatim, default_images, HAL0_RUNNER_IMAGE_<KEY>, the pin."""
    from hal0_reconciler.slots import conversion  # noqa: PLC0415 - 1.4+ only

    pin = slot.image_pin
    note: str | None = None
    if pin and facts.converts and conversion.pin_dropped(pin):
        note, pin = f"{conversion.DROPS_PIN}: {pin} is a retired hal0 image", None
    if pin:
        capable = pin.strip() in facts.capable
        return ImageResolution(pin, Rung.IMAGE_PIN, None, capable, note=note)
    runner = _pins_runner(slot, facts)
    override = facts.environment.get(f"HAL0_RUNNER_IMAGE_{runner.upper()}", "").strip()
    image: str | None
    if facts.default_images.get(runner):
        image, rung = facts.default_images[runner], Rung.DEFAULT_IMAGES
    elif override:
        image, rung = override, Rung.ENVIRONMENT
    else:
        image, rung = facts.manifest.get(runner), Rung.MANIFEST
    if image is None:
        error = f"the manifest pins no published image for runner {runner!r}"
        return ImageResolution(None, Rung.UNRESOLVED, runner, capable=False, error=error, note=note)
    return ImageResolution(image, rung, runner, image.strip() in facts.capable, note=note)


def _pins_runner(slot: SlotDoc, facts: Hal0Facts) -> str:
    """``binary`` when it names a runner of the release (as the conversion leaves it), else
    the device's runner."""
    binary: object = slot.binary
    if facts.converts:
        from hal0_reconciler.slots import conversion  # noqa: PLC0415 - 1.4+ only

        binary = conversion.binary_after(binary, facts.runner_keys)
    if isinstance(binary, str) and binary in facts.runner_keys:
        return binary
    if slot.device == Device.GPU_CUDA or (slot.raw_device is None and slot.backend == "cuda"):
        return "cuda"
    if slot.device == Device.CPU:
        return "cpu"
    return facts.vulkan_runner if slot.device == Device.GPU_VULKAN else "standard"
