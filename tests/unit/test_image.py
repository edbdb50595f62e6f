"""The effective image, rung by rung, as hal0 computes it (hal0-contract.md, "The effective image")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hal0_reconciler.model import Hal0Facts, ImageResolution, Rung
from hal0_reconciler.slots import image
from helpers import hal0_facts
from helpers.slotdocs import slot_doc

DEFAULT = "ghcr.io/hal0ai/hal0-combined:0826"
STRIX = "ghcr.io/hal0ai/hal0-strix-vulkan:0831"
OLD = "ghcr.io/hal0ai/hal0-combined:0824"  # a stale former default
BROKEN = "ghcr.io/hal0ai/hal0-rocmfpx:ade07ba"  # stale too
CUDA = "ghcr.io/ggml-org/llama.cpp:server-cuda"
CPU = "ghcr.io/hal0ai/hal0-toolbox-cpu:v1"
DIGEST = "ghcr.io/hal0ai/hal0-toolbox-cpu@sha256:" + "ab" * 32
STRIX_DIGEST = "ghcr.io/hal0ai/hal0-strix-vulkan@sha256:" + "cd" * 32

FACTS = dataclasses.replace(
    hal0_facts.ALLOWLIST_13,
    bundled={"rocmfpx": DEFAULT, "cuda": CUDA, "cpu": CPU, "strix": STRIX},
    manifest_keys={"cpu": "cpu"},
)


def facts(**changes: Any) -> Hal0Facts:
    return dataclasses.replace(FACTS, **changes)


def resolve(f: Hal0Facts = FACTS, **slot: Any) -> ImageResolution:
    return image.effective_image(slot_doc(**slot), f)


LADDER = {
    # rung 1: the pin, verbatim
    "pin, capable": (
        {"image_pin": STRIX},
        FACTS,
        ImageResolution(STRIX, Rung.IMAGE_PIN, None, capable=True),
    ),
    "pin, not capable": (
        {"image_pin": "example.org/llama:vk"},
        FACTS,
        ImageResolution("example.org/llama:vk", Rung.IMAGE_PIN, None, capable=False),
    ),
    "pin with padding is capable after stripping": (
        {"image_pin": f"  {STRIX} "},
        FACTS,
        ImageResolution(f"  {STRIX} ", Rung.IMAGE_PIN, None, capable=True),
    ),
    "pin wins over binary and every setting": (
        {"image_pin": "example.org/x:1", "binary": "strix"},
        facts(default_images={"rocmfpx": STRIX}, environment={"HAL0_TOOLBOX_IMAGE_ROCMFPX": STRIX}),
        ImageResolution("example.org/x:1", Rung.IMAGE_PIN, None, capable=False),
    ),
    "empty pin is no pin": (
        {"image_pin": ""},
        FACTS,
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True),
    ),
    # rung 2: the runner's ladder
    "unpinned: rocmfpx bundled": (
        {},
        FACTS,
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True),
    ),
    "binary names a known runner": (
        {"binary": "strix"},
        FACTS,
        ImageResolution(STRIX, Rung.BUNDLED, "strix", capable=True),
    ),
    "binary alias vulkanfpx folds to rocmfpx": (
        {"binary": "vulkanfpx"},
        facts(bundled={**FACTS.bundled, "rocmfpx": BROKEN.replace("ade07ba", "x")}),
        ImageResolution(BROKEN.replace("ade07ba", "x"), Rung.BUNDLED, "rocmfpx", capable=False),
    ),
    "a legacy alias of another runner folds to it": (
        {"binary": "cudafpx"},
        facts(aliases={"vulkanfpx": "rocmfpx", "cudafpx": "cuda"}),
        ImageResolution(CUDA, Rung.BUNDLED, "cuda", capable=False),
    ),
    "unknown binary falls back to the device's runner": (
        {"binary": "no-such-runner"},
        FACTS,
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True),
    ),
    "binary cuda": (
        {"binary": "cuda"},
        FACTS,
        ImageResolution(CUDA, Rung.BUNDLED, "cuda", capable=False),
    ),
    "default_images wins over environment": (
        {},
        facts(
            default_images={"rocmfpx": "example.org/ops:1"},
            environment={"HAL0_TOOLBOX_IMAGE_ROCMFPX": STRIX},
        ),
        ImageResolution("example.org/ops:1", Rung.DEFAULT_IMAGES, "rocmfpx", capable=False),
    ),
    "default_images under the alias key": (
        {},
        facts(default_images={"vulkanfpx": STRIX}),
        ImageResolution(STRIX, Rung.DEFAULT_IMAGES, "rocmfpx", capable=True),
    ),
    "blank default_images is not set": (
        {},
        facts(default_images={"rocmfpx": "  "}),
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True),
    ),
    "environment": (
        {},
        facts(environment={"HAL0_TOOLBOX_IMAGE_ROCMFPX": " example.org/env:1 "}),
        ImageResolution("example.org/env:1", Rung.ENVIRONMENT, "rocmfpx", capable=False),
    ),
    "environment alias VULKANFPX": (
        {},
        facts(environment={"HAL0_TOOLBOX_IMAGE_VULKANFPX": "example.org/env:2"}),
        ImageResolution("example.org/env:2", Rung.ENVIRONMENT, "rocmfpx", capable=False),
    ),
    "environment canonical name beats the alias": (
        {},
        facts(
            environment={
                "HAL0_TOOLBOX_IMAGE_VULKANFPX": "example.org/env:2",
                "HAL0_TOOLBOX_IMAGE_ROCMFPX": STRIX,
            }
        ),
        ImageResolution(STRIX, Rung.ENVIRONMENT, "rocmfpx", capable=True),
    ),
    "manifest for a runner with a manifest key": (
        {"binary": "cpu"},
        facts(manifest={"cpu": DIGEST}),
        ImageResolution(DIGEST, Rung.MANIFEST, "cpu", capable=False),
    ),
    "manifest never for rocmfpx": (
        {},
        facts(manifest={"rocmfpx": "example.org/m:1", "cpu": DIGEST}),
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True),
    ),
    "device cpu picks the cpu runner (stale look-through)": (
        {"image_pin": OLD, "device": "cpu"},
        FACTS,
        ImageResolution(CPU, Rung.BUNDLED, "cpu", capable=False, stale=OLD),
    ),
    # rung 3: stale former defaults are looked through
    "stale pin looks through to the current default": (
        {"image_pin": OLD},
        FACTS,
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True, stale=OLD),
    ),
    "stale pin looks through ignoring binary": (
        {"image_pin": BROKEN, "binary": "cuda"},
        FACTS,
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True, stale=BROKEN),
    ),
    "stale pin looks through to an operator default": (
        {"image_pin": OLD},
        facts(environment={"HAL0_TOOLBOX_IMAGE_ROCMFPX": "example.org/env:1"}),
        ImageResolution("example.org/env:1", Rung.ENVIRONMENT, "rocmfpx", False, stale=OLD),
    ),
    "a stale default_images value is judged as it launches: not looked through": (
        {},
        facts(default_images={"rocmfpx": BROKEN}),
        ImageResolution(
            BROKEN,
            Rung.DEFAULT_IMAGES,
            "rocmfpx",
            capable=False,
            note=image.STALE_DEFAULT_IMAGES_NOTE,
        ),
    ),
    "a stale pin looks through past default_images (hal0's look-through skips that tier)": (
        {"image_pin": OLD},
        facts(default_images={"rocmfpx": "example.org/ops:1"}),
        ImageResolution(DEFAULT, Rung.BUNDLED, "rocmfpx", capable=True, stale=OLD),
    ),
    "a padded stale pin is not looked through: hal0's stale test does not strip": (
        {"image_pin": f" {BROKEN} "},
        FACTS,
        ImageResolution(f" {BROKEN} ", Rung.IMAGE_PIN, None, capable=False),
    ),
    "a padded capable pin is capable: only the capable test strips": (
        {"image_pin": f" {DEFAULT}\t"},
        FACTS,
        ImageResolution(f" {DEFAULT}\t", Rung.IMAGE_PIN, None, capable=True),
    ),
    "a capable set member with padding is not stripped (hal0 holds it as written)": (
        {"image_pin": DEFAULT},
        facts(capable=frozenset({f" {DEFAULT}"})),
        ImageResolution(DEFAULT, Rung.IMAGE_PIN, None, capable=False),
    ),
    "before the collapse gpu-vulkan picks the vulkanfpx runner and its own variable": (
        {},
        facts(
            bundled={**FACTS.bundled, "vulkanfpx": "example.org/vk:1"},
            aliases={},
            vulkan_runner="vulkanfpx",
            environment={"HAL0_TOOLBOX_IMAGE_ROCMFPX": DEFAULT},
        ),
        ImageResolution("example.org/vk:1", Rung.BUNDLED, "vulkanfpx", capable=False),
    ),
    "before the collapse HAL0_TOOLBOX_IMAGE_VULKANFPX is the vulkanfpx runner's": (
        {},
        facts(
            bundled={**FACTS.bundled, "vulkanfpx": "example.org/vk:1"},
            aliases={},
            vulkan_runner="vulkanfpx",
            environment={"HAL0_TOOLBOX_IMAGE_VULKANFPX": DEFAULT},
        ),
        ImageResolution(DEFAULT, Rung.ENVIRONMENT, "vulkanfpx", capable=True),
    ),
    "a manifest digest ref is compared as it is, as hal0 does (its tag is capable)": (
        {"binary": "strix"},
        facts(
            manifest_keys={"strix": "strix"},
            manifest={"strix": STRIX_DIGEST},
        ),
        ImageResolution(STRIX_DIGEST, Rung.MANIFEST, "strix", capable=False),
    ),
    "an older hal0 whose default is broken": (
        {},
        facts(bundled={**FACTS.bundled, "rocmfpx": BROKEN}, stale=frozenset({OLD})),
        ImageResolution(BROKEN, Rung.BUNDLED, "rocmfpx", capable=False),
    ),
    # failure: fail closed
    "no rocmfpx runner in the installed hal0": (
        {},
        facts(bundled={"cpu": CPU}),
        ImageResolution(
            None,
            Rung.UNRESOLVED,
            "rocmfpx",
            capable=False,
            error="the installed hal0 has no runner 'rocmfpx'",
        ),
    ),
}


@pytest.mark.parametrize(("slot", "f", "expected"), list(LADDER.values()), ids=list(LADDER))
def test_the_ladder(slot: dict[str, Any], f: Hal0Facts, expected: ImageResolution) -> None:
    """Each rung of hal0's image ladder, its aliases, the stale look-through and the failure."""
    assert expected == resolve(f, **slot)


def test_the_legacy_image_string_and_profile_image_no_longer_count() -> None:
    """hal0 no longer reads the legacy `image` string or a profile's image: the ladder decides."""
    doc = slot_doc(profile="vulkan")
    assert DEFAULT == image.effective_image(doc, FACTS).image


@pytest.mark.parametrize(
    ("resolution", "words"),
    [
        (LADDER["stale pin looks through to the current default"][2], "looked through"),
        (LADDER["pin, not capable"][2], "not Vulkan-capable"),
        (LADDER["no rocmfpx runner in the installed hal0"][2], "no image"),
    ],
)
def test_explanations_name_the_image_and_the_rung(resolution: ImageResolution, words: str) -> None:
    """The explanation an operator reads says what will run, from where, and the verdict."""
    assert words in resolution.explain()
