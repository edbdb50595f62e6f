"""Each hal0 release's rules as decision tables: placing a release, 1.4+'s pins, its
conversion's effect and its image chain (project-written values in hal0's shapes)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from hal0_reconciler.host.hal0 import pins, release
from hal0_reconciler.model import Hal0Facts, Hal0Rule, ImageResolution, Rung
from hal0_reconciler.slots import conversion, document, image, policy

S = release.Structure
D = "sha256:" + "ab" * 32
REPO = "registry.example/runner-standard"
REF = f"{REPO}:b1@{D}"

PLACE = {
    "1.7.0 with pins code": ("1.7.0", S.PINS, Hal0Rule.PINS, "1.7.0", False),
    "1.4.0 with pins code": ("1.4.0", S.PINS, Hal0Rule.PINS, "1.4.0", False),
    "a nightly is its base release": (
        "v1.6.5-nightly.20261001",
        S.PINS,
        Hal0Rule.PINS,
        "1.6.5",
        False,
    ),
    "1.3.0 allowlist": ("1.3.0", S.ALLOWLIST, Hal0Rule.ALLOWLIST, "1.3.0", False),
    "1.0.0 allowlist": ("1.0.0", S.ALLOWLIST, Hal0Rule.ALLOWLIST, "1.0.0", False),
    "0.9.8 pre-rule": ("0.9.8", S.PRE_RULE, Hal0Rule.PRE_RULE, "0.9.8", False),
    "1.0.0a2 pre-rule": ("1.0.0a2", S.PRE_RULE, Hal0Rule.PRE_RULE, "1.0.0a2", False),
    "newer release, newest era: newest rules": ("1.9.0", S.PINS, Hal0Rule.PINS, "1.7.0", False),
    "newer release, older era: not placeable": (
        "1.9.0",
        S.ALLOWLIST,
        Hal0Rule.NOT_PLACEABLE,
        None,
        True,
    ),
    "1.7.0 named, allowlist code: not placeable": (
        "1.7.0",
        S.ALLOWLIST,
        Hal0Rule.NOT_PLACEABLE,
        None,
        True,
    ),
    "1.3.0 named, pins code: not placeable": ("1.3.0", S.PINS, Hal0Rule.NOT_PLACEABLE, None, True),
    "unknown structure: not placeable": ("1.7.0", S.UNKNOWN, Hal0Rule.NOT_PLACEABLE, None, True),
    "between releases: the one before of that era": (
        "1.2.5",
        S.ALLOWLIST,
        Hal0Rule.ALLOWLIST,
        "1.2.0",
        False,
    ),
    "unnamed: newest of the era": (None, S.ALLOWLIST, Hal0Rule.ALLOWLIST, "1.3.0", False),
    "older than any of its era": ("0.9.0", S.PINS, Hal0Rule.NOT_PLACEABLE, None, True),
}


@pytest.mark.parametrize("case", PLACE.values(), ids=PLACE.keys())
def test_place(case: tuple[str | None, release.Structure, Hal0Rule, str | None, bool]) -> None:
    named, structure, rule, version, loud = case
    got = release.place(named, structure, "evidence")
    assert (rule, version, loud) == (
        got.rule,
        got.release.version if got.release else None,
        got.loud,
    )


def test_release_facts_per_sub_era() -> None:
    r = release.BY_VERSION
    assert (r["1.0.0"].vulkan_runner, r["1.0.0"].folds_aliases) == ("vulkanfpx", False)
    assert (r["1.1.0"].vulkan_runner, r["1.1.0"].folds_aliases) == ("rocmfpx", True)
    assert r["1.4.0"].vulkan_runner == "standard"
    assert (r["1.4.0"].device_marker, r["1.5.0"].device_marker) == (False, True)
    assert [r[v].restart_budget for v in ("0.9.8", "1.2.0", "1.3.0", "1.7.0")] == [
        None,
        2415.0,
        3243.0,
        3243.0,
    ]
    assert release.first_of(Hal0Rule.PINS).version == "1.4.0"
    assert release.assumed("2.0.0").rule is Hal0Rule.NOT_PLACEABLE


def row(**changes: object) -> dict[str, object]:
    return {"image": REPO, "tag": "b1", "digest": D, "lanes_gated": ["vulkan"], **changes}


BAD = {
    "not an object": [],
    "no runners": {},
    "empty runners": {"runners": {}},
    "row not an object": {"runners": {"standard": "x"}},
    "no image": {"runners": {"standard": row(image=None)}},
    "blank image": {"runners": {"standard": row(image="  ")}},
    "image with a tag": {"runners": {"standard": row(image=f"{REPO}:b1")}},
    "image with a digest": {"runners": {"standard": row(image=f"{REPO}@{D}")}},
    "blank tag": {"runners": {"standard": row(tag="")}},
    "tag not a string": {"runners": {"standard": row(tag=7)}},
    "digest not sha256": {"runners": {"standard": row(digest="sha256:" + "AB" * 32)}},
    "digest short": {"runners": {"standard": row(digest="sha256:abc")}},
    "digest without tag": {"runners": {"standard": row(tag=None)}},
    "lanes not a list": {"runners": {"standard": row(lanes_gated="vulkan")}},
    "lanes not strings": {"runners": {"standard": row(lanes_gated=[1])}},
    "lanes null": {"runners": {"standard": row(lanes_gated=None)}},
}


@pytest.mark.parametrize("doc", BAD.values(), ids=BAD.keys())
def test_invalid_manifest_is_refused_whole(doc: object) -> None:
    with pytest.raises(pins.PinsError):
        pins.parse(doc)


def test_capable_is_every_spelling_of_a_gated_vulkan_runner_pin() -> None:
    table = pins.parse(
        {
            "runners": {
                "standard": row(image=f" {REPO} ", tag=" b1 "),
                "cpu": row(image="registry.example/cpu"),
                "other": {"image": "registry.example/o", "tag": "t", "lanes_gated": ["rocm"]},
            }
        }
    )
    assert table["standard"].ref == REF
    assert pins.capable(table, ["standard"]) == {REF, f"{REPO}:b1", f"{REPO}@{D}"}
    assert pins.capable(table, ["other"]) == frozenset()
    assert pins.capable(table, []) == frozenset()
    untagged = pins.parse({"runners": {"standard": {"image": REPO, "tag": None}}})
    assert untagged["standard"].ref is None
    assert pins.capable(untagged, ["standard"]) == frozenset()
    no_digest = pins.parse({"runners": {"standard": row(digest=None)}})
    assert pins.capable(no_digest, ["standard"]) == {f"{REPO}:b1"}


CONVERT = {
    "retired combined pin dropped": ("ghcr.io/hal0ai/hal0-combined:0826", True),
    "retired toolbox prefix dropped": ("ghcr.io/hal0ai/hal0-toolbox-cpu:v1", True),
    "kyuz0 short form is docker.io": ("kyuz0/amd-strix-halo-toolboxes:vulkan", True),
    "floating cuda tag dropped": ("ghcr.io/ggml-org/llama.cpp:server-cuda", True),
    "pinned cuda kept": (f"ghcr.io/ggml-org/llama.cpp:server-cuda@{D}", False),
    "an operator image kept": ("registry.example/mine:1", False),
    "another owner's same name kept": ("ghcr.io/someone/hal0-combined:0826", False),
    "blank kept": ("  ", False),
}


@pytest.mark.parametrize("case", CONVERT.values(), ids=CONVERT.keys())
def test_conversion_drops_retired_pins(case: tuple[str, bool]) -> None:
    ref, dropped = case
    assert dropped == conversion.pin_dropped(ref)


def test_conversion_binary_default_images_and_environment() -> None:
    known = {"standard", "cpu", "cuda"}
    assert [
        conversion.binary_after(b, known) for b in ("rocmfpx", "vulkan", " cpu ", "strix", "x")
    ] == [
        "standard",
        "standard",
        "cpu",
        None,
        None,
    ]
    images = {"vulkanfpx": "r/v:1", "rocmfpx": "r/r:1", "cpu": "ghcr.io/hal0ai/hal0-toolbox-cpu:v1"}
    assert conversion.default_images_after(images, known) == {"standard": "r/r:1"}
    assert conversion.default_images_after({"standard": "r/s:1", "rocmfpx": "r/r:1"}, known) == {
        "standard": "r/s:1"
    }
    env = {"HAL0_TOOLBOX_IMAGE_VULKANFPX": "r/v:1", "HAL0_TOOLBOX_IMAGE_ROCMFPX": "r/r:1"}
    assert conversion.environment_after(env, known) == {"HAL0_RUNNER_IMAGE_STANDARD": "r/r:1"}
    env["HAL0_RUNNER_IMAGE_STANDARD"] = "r/new:1"
    assert conversion.environment_after(env, known) == {"HAL0_RUNNER_IMAGE_STANDARD": "r/new:1"}


PINS_FACTS = Hal0Facts(
    version="1.7.0",
    default_image=REF,
    capable=frozenset({REF, f"{REPO}:b1", f"{REPO}@{D}"}),
    stale=frozenset(),
    bundled=MappingProxyType({}),
    manifest_keys=MappingProxyType({}),
    aliases=MappingProxyType({}),
    manifest=MappingProxyType({"standard": REF, "cpu": "registry.example/cpu:b1"}),
    rule=Hal0Rule.PINS,
    release="1.7.0",
    vulkan_runner="standard",
    runner_keys=frozenset({"standard", "cpu", "cuda"}),
    converts=True,
)


def pf(**changes: object) -> Hal0Facts:
    return dataclasses.replace(PINS_FACTS, **changes)  # type: ignore[arg-type]


CHAIN = {
    "no pin: the standard pin, capable": (
        {},
        PINS_FACTS,
        ImageResolution(REF, Rung.MANIFEST, "standard", True),
    ),
    "pin verbatim, padded, capable after strip": (
        {"image_pin": f" {REPO}:b1 "},
        PINS_FACTS,
        ImageResolution(f" {REPO}:b1 ", Rung.IMAGE_PIN, None, True),
    ),
    "a digest spelling is capable": (
        {"image_pin": f"{REPO}@{D}"},
        PINS_FACTS,
        ImageResolution(f"{REPO}@{D}", Rung.IMAGE_PIN, None, True),
    ),
    "an operator pin is not capable": (
        {"image_pin": "registry.example/mine:1"},
        PINS_FACTS,
        ImageResolution("registry.example/mine:1", Rung.IMAGE_PIN, None, False),
    ),
    "a retired pin is judged dropped": (
        {"image_pin": "ghcr.io/hal0ai/hal0-combined:0826"},
        PINS_FACTS,
        ImageResolution(
            REF,
            Rung.MANIFEST,
            "standard",
            True,
            note=f"{conversion.DROPS_PIN}: ghcr.io/hal0ai/hal0-combined:0826 is a retired hal0 image",
        ),
    ),
    "a retired pin under the restore marker is judged raw": (
        {"image_pin": "ghcr.io/hal0ai/hal0-combined:0826"},
        pf(converts=False),
        ImageResolution("ghcr.io/hal0ai/hal0-combined:0826", Rung.IMAGE_PIN, None, False),
    ),
    "default_images beats the environment": (
        {},
        pf(
            default_images={"standard": "r/d:1"},
            environment={"HAL0_RUNNER_IMAGE_STANDARD": "r/e:1"},
        ),
        ImageResolution("r/d:1", Rung.DEFAULT_IMAGES, "standard", False),
    ),
    "the environment beats the pin": (
        {},
        pf(environment={"HAL0_RUNNER_IMAGE_STANDARD": f" {REF} "}),
        ImageResolution(REF, Rung.ENVIRONMENT, "standard", True),
    ),
    "binary cpu: the cpu pin, not capable": (
        {"binary": "cpu"},
        PINS_FACTS,
        ImageResolution("registry.example/cpu:b1", Rung.MANIFEST, "cpu", False),
    ),
    "retired binary rocmfpx: standard": (
        {"binary": "rocmfpx"},
        PINS_FACTS,
        ImageResolution(REF, Rung.MANIFEST, "standard", True),
    ),
    "a legacy backend under a device of its own: the device's runner": (
        {"device": "gpu-rocm", "backend": "cuda"},
        PINS_FACTS,
        ImageResolution(REF, Rung.MANIFEST, "standard", True),
    ),
    "unpublished pin: unresolved": (
        {"binary": "cuda"},
        PINS_FACTS,
        ImageResolution(
            None,
            Rung.UNRESOLVED,
            "cuda",
            False,
            error="the manifest pins no published image for runner 'cuda'",
        ),
    ),
}


@pytest.mark.parametrize("case", CHAIN.values(), ids=CHAIN.keys())
def test_pins_chain(case: tuple[dict[str, object], Hal0Facts, ImageResolution]) -> None:
    fields, facts, expected = case
    doc = document.from_data({"device": "gpu-vulkan", **fields}, stem="s")
    assert expected == image.effective_image(doc, facts)


@pytest.mark.parametrize(
    ("version", "seconds"),
    [
        ("1.0.0", 2415.0),
        ("1.2.0", 2415.0),
        ("1.3.0", 3243.0),
        ("v1.7.0-nightly.20261001", 3243.0),
        ("2.0.0", 3243.0),
        ("1.2.7", 2415.0),
        ("0.9.8", 1200.0),
        (None, 1200.0),
        ("garbage", 1200.0),
    ],
)
def test_the_restart_budget_is_the_installed_releases(version: str | None, seconds: float) -> None:
    from hal0_reconciler.host.hal0 import budget

    assert seconds == budget.budget_of(version)


def test_pin_refs_and_spellings_of_each_row_shape() -> None:
    assert pins.Pin("k", REPO, "b1", None, ()).ref == f"{REPO}:b1"
    assert pins.Pin("k", REPO, "b1", D, ()).ref == REF
    assert pins.Pin("k", REPO, None, None, ("vulkan",)).ref is None
    assert pins.capable({"k": pins.Pin("k", REPO, None, None, ("vulkan",))}, ["k"]) == frozenset()
    assert pins.Pin("k", REPO, None, None, ()).spellings() == frozenset()


@pytest.mark.parametrize(
    ("ref", "retired"),
    [
        (f"ghcr.io/ggml-org/llama.cpp@{D}", False),  # a digest, no tag: pinned
        ("ghcr.io/ggml-org/llama.cpp", True),  # no tag, no digest: floating
        ("index.docker.io/kyuz0/amd-strix-halo-toolboxes:x", True),
        ("registry-1.docker.io/kyuz0/amd-strix-halo-comfyui:x", True),
        ("/", False),
        ("", False),
        ("LOCALHOST/hal0-rocmfpx:vk", True),
    ],
)
def test_retired_image_spellings(ref: str, retired: bool) -> None:
    assert retired == conversion.image_is_retired(ref)


def test_binary_after_leaves_blank_and_non_strings_alone() -> None:
    assert conversion.binary_after("  ", {"standard"}) == "  "
    assert conversion.binary_after(7, {"standard"}) == 7
    assert conversion.binary_after(None, {"standard"}) is None


def test_default_images_after_precedence_and_untouched_shapes() -> None:
    known = {"standard", "cpu"}
    both = {"rocmfpx": "r/r:1", "standard": "r/s:1"}
    assert conversion.default_images_after(both, known) == {"standard": "r/s:1"}
    aliases = {"vulkanfpx": "r/v:1", "rocmfpx": "r/r:1"}
    assert conversion.default_images_after(aliases, known) == {"standard": "r/r:1"}
    assert conversion.default_images_after(["x"], known) == ["x"]
    assert conversion.default_images_after("x", known) == "x"
    assert conversion.default_images_after({}, known) == {}


def test_every_release_row() -> None:
    """The whole table: era, gpu-vulkan runner, alias folding, --device marker, budget."""
    rows = [
        (
            r.version,
            r.rule.value,
            r.vulkan_runner,
            r.folds_aliases,
            r.device_marker,
            r.restart_budget,
        )
        for r in release.RELEASES
    ]
    assert rows == [
        ("0.9.8", "pre-rule", None, False, False, None),
        ("1.0.0a2", "pre-rule", None, False, False, None),
        ("1.0.0", "allowlist", "vulkanfpx", False, False, 2415.0),
        ("1.1.0", "allowlist", "rocmfpx", True, False, 2415.0),
        ("1.2.0", "allowlist", "rocmfpx", True, False, 2415.0),
        ("1.3.0", "allowlist", "rocmfpx", True, False, 3243.0),
        ("1.4.0", "pins", "standard", False, False, 3243.0),
        ("1.5.0", "pins", "standard", False, True, 3243.0),
        ("1.6.0", "pins", "standard", False, True, 3243.0),
        ("1.6.5", "pins", "standard", False, True, 3243.0),
        ("1.7.0", "pins", "standard", False, True, 3243.0),
    ]


@pytest.mark.parametrize(
    ("text", "base"),
    [
        ("1.7.0", "1.7.0"),
        ("v1.7.0", "1.7.0"),
        ("1.7.0-nightly.20261001", "1.7.0"),
        ("1.0.0a2", "1.0.0a2"),
        ("1.7.0+local", "1.7.0"),
        (" 1.6.5\n", "1.6.5"),
        ("nightly", None),
        ("", None),
    ],
)
def test_base_release(text: str, base: str | None) -> None:
    assert base == release.base_release(text)


def test_version_order() -> None:
    order = [
        "0.9.8",
        "1.0.0a2",
        "1.0.0",
        "1.0.1",
        "1.6.5",
        "1.7",
        "1.7.0b1",
        "1.7.0rc1",
        "1.7.0",
        "1.10.0",
    ]
    keys = [release.version_key(v) for v in order]
    assert keys[:6] == sorted(keys[:6])
    assert release.version_key("1.7") == release.version_key("1.7.0")
    assert (
        release.version_key("1.7.0b1")
        < release.version_key("1.7.0rc1")
        < release.version_key("1.7.0")
    )
    assert release.version_key("1.10.0") > release.version_key("1.7.0")


def test_what_holds_every_slot_per_era() -> None:
    from hal0_reconciler.model import Reason
    from hal0_reconciler.slots import policy

    assert policy.hold_of(PINS_FACTS) is None
    assert policy.hold_of(pf(pins_problem="no manifest")) is Reason.MANIFEST_UNUSABLE
    assert policy.hold_of(pf(rule=Hal0Rule.PRE_RULE)) is Reason.PRE_RULE
    assert policy.hold_of(pf(rule=Hal0Rule.NOT_PLACEABLE)) is Reason.HAL0_NOT_PLACEABLE
    assert policy.hold_of(pf(rule=Hal0Rule.NO_HAL0)) is Reason.NO_HAL0
    assert policy.hold_of(pf(rule=Hal0Rule.ALLOWLIST, pins_problem="x")) is None
    assert policy.backend_counts(PINS_FACTS)
    assert policy.backend_counts(pf(converts=False))
    assert not policy.backend_counts(pf(rule=Hal0Rule.ALLOWLIST))
    legacy = document.from_data({"backend": "vulkan"}, stem="s")
    labelled = document.from_data({"device": "gpu-vulkan", "backend": "rocm"}, stem="s")
    assert policy.is_candidate(legacy, legacy_backend=True)
    assert not policy.is_candidate(legacy, legacy_backend=False)
    assert policy.is_candidate(labelled, legacy_backend=False)


def test_assumed_and_unnamed_placements_say_why() -> None:
    got = release.assumed("1.7.0")
    assert (Hal0Rule.PINS, "1.7.0", False) == (
        got.rule,
        got.release.version if got.release else None,
        got.loud,
    )
    assert "--assume-hal0" in got.evidence
    assert release.assumed("9.9.9").loud
    unnamed = release.place("nightly", S.PINS, "e")
    assert "VERSION says 'nightly'" in unnamed.evidence
    assert unnamed.note is not None
    silent = release.place(None, S.PINS, "e")
    assert "VERSION says" not in silent.evidence
    assert release.place("1.7.0", S.PINS, "e").note is None
    assert "newer than every release" in (release.place("1.8.0", S.PINS, "e").note or "")
    assert release.version_key("1.7.0a1") < release.version_key("1.7.0b1")
    assert release.version_key("1.7.0rc2") > release.version_key("1.7.0rc1")
    assert release.version_key("1.7") < release.version_key("1.7.1")
    assert release.version_key("1.7.0") == ((1, 7, 0), 3, 0)


def test_environment_after_drops_retired_and_blank_old_lines() -> None:
    known = {"standard", "cpu"}
    retired = {"HAL0_TOOLBOX_IMAGE_ROCMFPX": "ghcr.io/hal0ai/hal0-combined:0826"}
    assert conversion.environment_after(retired, known) == {}
    assert conversion.environment_after({"HAL0_TOOLBOX_IMAGE_CPU": " "}, known) == {}
    assert conversion.environment_after({"HAL0_TOOLBOX_IMAGE_STRIX": "r/s:1"}, known) == {}
    assert release.BY_VERSION["1.7.0"].era_words == "manifest pins"
    assert release.BY_VERSION["1.0.0"].era_words == "schema allowlist"


@pytest.mark.parametrize("text", ["1.1.0\x1b]8;;http://evil\x1b\\link", "1.7.0.1", "1.1.0 extra"])
def test_a_version_with_anything_after_the_number_is_not_cut_to_a_shorter_one(text: str) -> None:
    """Never backtracked into a shorter release ("1.1.0\\x1b…" is not "1.1")."""
    assert release.base_release(text) in {None, "1.7.0.1"}


def test_a_legacy_backend_labels_a_candidate_only_where_hal0_converts_it() -> None:
    """1.4+ turns ``backend`` into ``device`` before its relabel, unless the profile-centric
    conversion's own restore marker holds; 1.0-1.3's relabel reads ``device`` alone."""
    assert (True, False, False) == (
        policy.backend_counts(PINS_FACTS),
        policy.backend_counts(pf(backend_stood_down=True)),
        policy.backend_counts(pf(rule=Hal0Rule.ALLOWLIST)),
    )
