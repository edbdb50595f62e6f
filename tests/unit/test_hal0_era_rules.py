"""The installed hal0's era and hal0's own checks, as decision tables (hal0-contract.md,
"Exactly as hal0's code does it"; decisions-0.2.md, "Real hal0 eras")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hal0_reconciler.host import hal0_code, hal0_eras
from hal0_reconciler.host.hal0_code import CatalogSupplement
from hal0_reconciler.model import Action, Hal0Rule, HostFacts, LaneState, Reason, Runtime
from hal0_reconciler.slots import image, policy
from helpers.hal0_tree import CATALOG_RUNNERS_TEXT, UPDATER_RETIRED_TEXT, UPDATER_UNRELATED_TEXT
from helpers.slotdocs import slot_doc

CAPABLE, FIXED, DEFAULT = hal0_eras.CAPABLE, hal0_eras.FIXED, hal0_eras.DEFAULT
STALE = "STALE_ROCMFPX_IMAGE_REFS"
RETIRED = "updater.py defines relabel_stale_vulkan_slots, which moves gpu-vulkan slots"

RULES: dict[str, tuple[dict[str, Any], Hal0Rule, str]] = {
    "a capable set: the allowlist": (
        {"assigned": {CAPABLE, DEFAULT, STALE}, "understood": {CAPABLE, DEFAULT, STALE}},
        Hal0Rule.ALLOWLIST,
        f"schema.py defines {CAPABLE}",
    ),
    "a capable set wins over relabel evidence": (
        {
            "assigned": {CAPABLE, DEFAULT},
            "understood": {CAPABLE, DEFAULT},
            "retirement": RETIRED,
        },
        Hal0Rule.ALLOWLIST,
        f"schema.py defines {CAPABLE}",
    ),
    "a capable set not understood: not placed": (
        {"assigned": {CAPABLE, DEFAULT}, "understood": {DEFAULT}},
        Hal0Rule.NOT_UNDERSTOOD,
        f"schema.py: {CAPABLE} not understood",
    ),
    "no capable set, relabel evidence: the lane retired": (
        {"assigned": {DEFAULT, FIXED}, "understood": {DEFAULT, FIXED}, "retirement": RETIRED},
        Hal0Rule.LANE_RETIRED,
        f"schema.py defines no {CAPABLE}; {RETIRED}",
    ),
    "no capable set, no fixed image, no evidence: before the rule": (
        {"assigned": {DEFAULT, STALE}, "understood": {DEFAULT, STALE}},
        Hal0Rule.PRE_RULE,
        (
            f"schema.py defines no {CAPABLE} and no {FIXED}, and hal0 has neither "
            "relabel_stale_vulkan_slots nor require_kfd_for_gpu_slot"
        ),
    ),
    "a fixed image but no capable set and no evidence: not placed": (
        {"assigned": {DEFAULT, FIXED}, "understood": {DEFAULT, FIXED}},
        Hal0Rule.NOT_UNDERSTOOD,
        (
            f"schema.py defines {FIXED} but no {CAPABLE}, and hal0 shows no relabel of the "
            "Vulkan lane: a shape between the known eras"
        ),
    ),
    "no default image either: not placed": (
        {"assigned": set(), "understood": set()},
        Hal0Rule.NOT_UNDERSTOOD,
        f"schema.py defines neither {CAPABLE} nor a readable {DEFAULT}",
    ),
    "the evidence could not be looked for: not placed": (
        {
            "assigned": {DEFAULT},
            "understood": {DEFAULT},
            "retirement_problem": "updater.py was not read (larger than the limit)",
        },
        Hal0Rule.NOT_UNDERSTOOD,
        f"schema.py defines no {CAPABLE}, and updater.py was not read (larger than the limit)",
    ),
    "schema.py itself not read: not placed": (
        {"schema_problem": "not valid Python", "assigned": set(), "understood": set()},
        Hal0Rule.NOT_UNDERSTOOD,
        "schema.py: not valid Python",
    ),
}


@pytest.mark.parametrize(("given", "rule", "evidence"), list(RULES.values()), ids=list(RULES))
def test_the_rule_is_placed_from_what_hal0_contains(
    given: dict[str, Any], rule: Hal0Rule, evidence: str
) -> None:
    """Each era's rule from the installed files, with the evidence that decided it."""
    given = {"schema_problem": None, "retirement": None, **given}
    assert hal0_eras.Placement(rule, evidence) == hal0_eras.place_rule(**given)


RUNNERS = {"rocmfpx", "cpu", "cuda", "strix"}
ALIASES = {"vulkanfpx": "rocmfpx"}
DEFAULT_IMAGES: dict[str, tuple[object, dict[str, str], str | None]] = {
    "values are stripped": ({"rocmfpx": " a:1 \t"}, {"rocmfpx": "a:1"}, None),
    "an alias key is folded to its runner": ({"vulkanfpx": "a:1"}, {"rocmfpx": "a:1"}, None),
    "the canonical key wins when it comes first": (
        {"rocmfpx": "a:1", "vulkanfpx": "b:2"},
        {"rocmfpx": "a:1"},
        None,
    ),
    "the canonical key wins when it comes last": (
        {"vulkanfpx": "b:2", "rocmfpx": "a:1"},
        {"rocmfpx": "a:1"},
        None,
    ),
    "an alias after its canonical key is skipped before it is checked": (
        {"rocmfpx": "a:1", "vulkanfpx": ""},
        {"rocmfpx": "a:1"},
        None,
    ),
    "an unknown runner drops the whole map": (
        {"rocmfpx": "a:1", "bogus": "b:2"},
        {},
        "[slots].default_images key 'bogus' is not a runner (valid: cpu, cuda, rocmfpx, strix)",
    ),
    "a blank value drops the whole map": (
        {"cpu": "c:1", "rocmfpx": "  "},
        {},
        "[slots].default_images['rocmfpx'] is blank, not an image ref",
    ),
    "a non-string value drops the whole map": (
        {"rocmfpx": 3},
        {},
        "[slots].default_images['rocmfpx'] is an integer, not an image ref",
    ),
    "a value that is not a table": ("a:1", {}, "[slots].default_images is a str, not a table"),
}


@pytest.mark.parametrize(
    ("raw", "expected", "problem"), list(DEFAULT_IMAGES.values()), ids=list(DEFAULT_IMAGES)
)
def test_default_images_are_validated_as_hal0_validates_them(
    raw: object, expected: dict[str, str], problem: str | None
) -> None:
    """hal0's SlotsConfig validator: all of the map, or none of it and the entry to blame."""
    assert (expected, problem) == hal0_eras.validate_default_images(raw, RUNNERS, ALIASES)


SUPPLEMENTS = {
    "rocmfpx": CatalogSupplement("r:1", None),
    "vulkan": CatalogSupplement(None, None),
    "flm": CatalogSupplement("f:1", "flm"),
}
CATALOG = {
    "runners": [
        {"id": "rocmfpx", "package": "p1"},
        {"id": "vulkan", "package": "p2"},
        {"id": "flm", "package": "p3"},
    ],
    "packages": [
        {"id": "p1", "repository": "x/rocm", "digest": "sha256:1"},
        {"id": "p2", "repository": "x/vk", "digest": "sha256:2"},
    ],
}


def test_the_catalog_gives_the_images_its_supplements_do_not() -> None:
    """A runner's image: its `_SUPPLEMENTS` override, else `<repository>@<digest>` of its
    package in the catalog."""
    table, fallback = hal0_eras.catalog_table(CATALOG, SUPPLEMENTS)
    assert None is fallback
    assert {"rocmfpx": "r:1", "vulkan": "x/vk@sha256:2", "flm": "f:1"} == table.images
    assert ({"flm": "flm"}, frozenset()) == (table.manifest_keys, table.unknown)


@pytest.mark.parametrize("catalog", [None, [], {"runners": "x"}, {"runners": [3], "packages": []}])
def test_without_a_readable_catalog_each_fact_falls_back(catalog: object) -> None:
    """No catalog, or one of another shape: the runners and images `_SUPPLEMENTS` sets; a
    runner only the catalog has an image for is unknown (judged not capable)."""
    table, fallback = hal0_eras.catalog_table(catalog, SUPPLEMENTS)
    assert fallback is not None
    assert {"rocmfpx": "r:1", "flm": "f:1"} == table.images
    assert frozenset({"vulkan"}) == table.unknown


def test_the_catalog_builder_is_read_from_its_supplements() -> None:
    """`_build_runners_from_catalog`'s `_SUPPLEMENTS`: images through the names it imports."""
    got = hal0_code.catalog_supplements(
        CATALOG_RUNNERS_TEXT,
        imported={
            "DEFAULT_ROCMFPX_IMAGE": "d:1",
            "FALLBACK_CUDA_IMAGE": "c:1",
            "FALLBACK_VULKAN_IMAGE": "v:1",
        },
    )
    assert CatalogSupplement("d:1", None) == got["vulkanfpx"]
    assert CatalogSupplement(None, None) == got["vulkan"]
    assert CatalogSupplement("ghcr.io/hal0ai/hal0-toolbox-flm:0.9.44", "flm") == got["flm"]
    assert "catalog" == hal0_code.runner_table_shape(CATALOG_RUNNERS_TEXT)
    assert hal0_code.separate_vulkan_runner(CATALOG_RUNNERS_TEXT)


def test_relabel_evidence_must_touch_the_vulkan_lane() -> None:
    """The updater's relabel counts only when it moves gpu-vulkan slots."""
    found = hal0_code.top_level_functions(UPDATER_RETIRED_TEXT, mentioning="gpu-vulkan")
    assert frozenset({"relabel_stale_vulkan_slots"}) == found
    assert frozenset() == hal0_code.top_level_functions(
        UPDATER_UNRELATED_TEXT, mentioning="gpu-vulkan"
    )


def test_a_module_with_more_structure_than_any_hal0_module_is_refused_unparsed() -> None:
    """700k statements in 4 MiB are refused by a linear count, before any tree is built."""
    with pytest.raises(hal0_code.Hal0CodeError, match="refused unparsed"):
        hal0_code.module_values("a=1\n" * 700_000)


AMD = HostFacts(amd=True, lane=LaneState.USABLE)
ERA_VERDICTS = {  # rule -> (action, reason) for an unpinned gpu-vulkan slot on a capable image
    Hal0Rule.ALLOWLIST: (Action.KEEP, Reason.VULKAN_CAPABLE_IMAGE),
    Hal0Rule.LANE_RETIRED: (Action.RELABEL, Reason.NOT_CAPABLE_ROCM_USABLE),
    Hal0Rule.PRE_RULE: (Action.KEEP, Reason.PRE_RULE),
    Hal0Rule.NOT_UNDERSTOOD: (Action.KEEP, Reason.HAL0_NOT_UNDERSTOOD),
}


@pytest.mark.parametrize("rule", list(ERA_VERDICTS))
def test_each_era_gives_its_own_verdict(rule: Hal0Rule) -> None:
    """The same slot on the same image: kept under the allowlist, moved when the lane is
    retired, kept before the rule and when the era is not placed."""
    facts = dataclasses.replace(image.NEWEST_KNOWN, rule=rule)
    slot = slot_doc(device="gpu-vulkan")
    verdict = policy.decide(
        slot,
        runtime=Runtime.LLAMA_SERVER,
        image=image.effective_image(slot, facts),
        facts=AMD,
        rule=rule,
    )
    assert ERA_VERDICTS[rule] == (verdict.action, verdict.reason)


def test_no_era_that_keeps_everything_restores_a_demotion() -> None:
    """Before the rule, or unplaced, nothing moves at all: not even our own cpu demotion."""
    verdict = policy.decide(
        slot_doc(device="cpu"),
        runtime=Runtime.LLAMA_SERVER,
        image=None,
        facts=AMD,
        demoted_by_us=True,
        rule=Hal0Rule.NOT_UNDERSTOOD,
    )
    assert (Action.KEEP, Reason.NOT_VULKAN) == (verdict.action, verdict.reason)
