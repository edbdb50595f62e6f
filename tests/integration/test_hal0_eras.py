"""The same slot files judged under release-shaped hal0 installs, through `plan --json`: the
installed release decides (hal0-releases.md, "The effective image")."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.hal0_tree import (
    ADE07BA,
    C0822,
    C0824,
    C0826,
    ERAS,
    RUNNERS_100_TEXT,
    RUNNERS_TEXT,
    STANDARD_REF,
    STRIX,
    UPDATER_RELABEL_TEXT,
    Hal0Tree,
    install_texts,
    manifest,
    plan_json,
    pre_rule_schema_text,
    schema_text,
)

REPO = Path(__file__).resolve().parents[2]

SLOTS = {
    "plain": "",
    "pinned-broken": f'image_pin = "{ADE07BA}"\n',
    "pinned-0822": f'image_pin = "{C0822}"\n',
    "pinned-strix": f'image_pin = "{STRIX}"\n',
    "pinned-other": 'image_pin = "example.org/llama:vk"\n',
    "vulkanfpx": 'binary = "vulkanfpx"\n',
    "unknown-binary": 'binary = "nope"\n',
}
KEEP, RELABEL = "keep", "relabel"
EXPECTED = {  # era -> slot -> action (the ROCm lane is usable)
    "ade07ba": {
        "plain": RELABEL,
        "pinned-broken": RELABEL,
        "pinned-0822": KEEP,
        "pinned-strix": RELABEL,
        "pinned-other": RELABEL,
        "vulkanfpx": RELABEL,
        "unknown-binary": RELABEL,
    },
    "0822": {
        "plain": KEEP,
        "pinned-broken": KEEP,  # a stale former default: looked through to :0822
        "pinned-0822": KEEP,
        "pinned-strix": RELABEL,
        "pinned-other": RELABEL,
        "vulkanfpx": KEEP,
        "unknown-binary": KEEP,
    },
    "0824": {
        "plain": KEEP,
        "pinned-broken": KEEP,
        "pinned-0822": KEEP,  # stale now: looked through to :0824
        "pinned-strix": RELABEL,
        "pinned-other": RELABEL,
        "vulkanfpx": KEEP,
        "unknown-binary": KEEP,
    },
    "0826": {
        "plain": KEEP,
        "pinned-broken": KEEP,
        "pinned-0822": KEEP,
        "pinned-strix": KEEP,
        "pinned-other": RELABEL,
        "vulkanfpx": KEEP,
        "unknown-binary": KEEP,
    },
}


def write_slots(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, extra in SLOTS.items():
        (folder / f"{name}.toml").write_text(
            f"# {name}: a chat slot on the Vulkan lane\n"
            f'name = "{name}"\ntype = "llm"\nport = 8081\ndevice = "gpu-vulkan"\n{extra}'
        )


def plan(tree: Hal0Tree, slots: Path) -> dict:
    return plan_json(tree, slots)


def actions(report: dict) -> dict[str, str]:
    return {row["slot"]: row["action"] for row in report["slots"]}


@pytest.mark.parametrize("era", list(EXPECTED))
def test_the_installed_hal0_decides(tmp_path: Path, era: str) -> None:
    """Same files, four hal0 releases: each slot is kept exactly when the image that release
    will launch for it is in that release's Vulkan-capable set."""
    tree = Hal0Tree(tmp_path).install(era)
    write_slots(tmp_path / "slots")
    report = plan(tree, tmp_path / "slots")
    assert EXPECTED[era] == actions(report)
    assert (
        tree.schema.as_posix() + " (VULKAN_CAPABLE_IMAGE_REFS)"
        == report["hal0"]["sources"]["capable"]
    )
    assert report["hal0"]["version"]
    assert report["hal0"]["problems"] is None


def test_every_candidate_is_explained(tmp_path: Path) -> None:
    """Per candidate: the effective image, the rung it came from, whether it is capable, and
    the stale former default it looked through."""
    tree = Hal0Tree(tmp_path).install("0826")
    write_slots(tmp_path / "slots")
    rows = {r["slot"]: r for r in plan(tree, tmp_path / "slots")["slots"]}
    broken = rows["pinned-broken"]["effective_image"]
    assert (C0826, "bundled", "rocmfpx", True, ADE07BA) == (
        broken["image"],
        broken["rung"],
        broken["runner"],
        broken["capable"],
        broken["stale_looked_through"],
    )
    other = rows["pinned-other"]["effective_image"]
    assert ("example.org/llama:vk", "image_pin", False) == (
        other["image"],
        other["rung"],
        other["capable"],
    )
    assert "image-not-vulkan-capable-rocm-usable" == rows["pinned-other"]["reason"]


@pytest.mark.parametrize(
    ("where", "text", "stale_pin"),
    [
        ("env", "HAL0_TOOLBOX_IMAGE_ROCMFPX=example.org/llama:vk\n", RELABEL),
        ("env", "HAL0_TOOLBOX_IMAGE_VULKANFPX=example.org/llama:vk\n", RELABEL),
        ("config", '[slots.default_images]\nrocmfpx = "example.org/llama:vk"\n', KEEP),
    ],
)
def test_operator_overrides_flip_the_verdict_as_hal0_would(
    tmp_path: Path, where: str, text: str, stale_pin: str
) -> None:
    """An environment or hal0.toml override of the runner image moves unpinned slots off a
    capable image: they are relabelled; a pin to a stale former default looks through to the
    environment's image, but past hal0.toml's (hal0's look-through skips default_images); a
    pin to a capable image is still kept."""
    tree = Hal0Tree(tmp_path).install("0826")
    target = tree.env_file if where == "env" else tree.config
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    write_slots(tmp_path / "slots")
    got = actions(plan(tree, tmp_path / "slots"))
    assert (RELABEL, stale_pin, KEEP) == (got["plain"], got["pinned-0822"], got["pinned-strix"])


def test_the_overrides_can_make_a_slot_capable(tmp_path: Path) -> None:
    """Under the broken ade07ba default, HAL0_TOOLBOX_IMAGE_ROCMFPX naming a capable image keeps
    the unpinned slot on Vulkan."""
    tree = Hal0Tree(tmp_path).install("ade07ba")
    tree.env_file.parent.mkdir(parents=True, exist_ok=True)
    tree.env_file.write_text(f"HAL0_TOOLBOX_IMAGE_ROCMFPX={C0822}\n")
    write_slots(tmp_path / "slots")
    assert KEEP == actions(plan(tree, tmp_path / "slots"))["plain"]


ALL_KEEP = dict.fromkeys(SLOTS, KEEP)
PINS_GATED = {  # 1.7.0, standard pinned and gated for Vulkan; retired pins judged dropped
    "plain": KEEP,
    "pinned-broken": KEEP,  # a retired hal0 image: hal0 drops the pin, the standard pin serves
    "pinned-0822": KEEP,
    "pinned-strix": KEEP,
    "pinned-other": RELABEL,  # an operator image not in the gated spellings
    "vulkanfpx": KEEP,  # a retired default key: standard
    "unknown-binary": KEEP,  # cleared: the device picks standard
}
PINS_UNGATED = {**dict.fromkeys(SLOTS, RELABEL)}


def install_era(tree: Hal0Tree, era: str) -> Hal0Tree:
    """Release-shaped trees: before the rule, 1.0.0, one of no release's shape, and 1.7.0."""
    if era == "pre-rule":
        return install_texts(
            tree, schema=pre_rule_schema_text(), runners=RUNNERS_TEXT, version="0.9.8"
        )
    if era == "not-placeable":
        return install_texts(
            tree,
            schema=pre_rule_schema_text(fixed=True),
            runners=RUNNERS_TEXT,
            version="1.0.0",
            extra={"updater/updater.py": UPDATER_RELABEL_TEXT},
        )
    if era == "1.0.0":
        return install_texts(
            tree, schema=schema_text(ERAS["0824"]), runners=RUNNERS_100_TEXT, version="1.0.0"
        )
    if era == "pins-gated":
        return tree.install_pins("1.7.0", manifest(gated=True))
    assert era == "pins-ungated"
    return tree.install_pins("1.7.0", manifest(gated=False))


ERA_EXPECTED = {  # era -> (rule, release, slot -> action)
    "pre-rule": ("pre-rule", "0.9.8", ALL_KEEP),
    "not-placeable": ("not-placeable", None, ALL_KEEP),
    "1.0.0": ("allowlist", "1.0.0", {**EXPECTED["0824"]}),
    "pins-gated": ("pins", "1.7.0", PINS_GATED),
    "pins-ungated": ("pins", "1.7.0", PINS_UNGATED),
}


@pytest.mark.parametrize("era", list(ERA_EXPECTED))
def test_each_release_gives_its_own_verdict_through_plan(tmp_path: Path, era: str) -> None:
    """The same slot files: kept before the rule and when the release cannot be placed,
    judged by image under 1.0.0's allowlist and 1.7.0's manifest pins; `plan --json` names the
    rule and the release, with its evidence."""
    tree = install_era(Hal0Tree(tmp_path), era)
    write_slots(tmp_path / "slots")
    report = plan(tree, tmp_path / "slots")
    rule, release, expected = ERA_EXPECTED[era]
    assert expected == actions(report)
    assert (rule, release) == (report["hal0"]["rule"]["value"], report["hal0"]["release"])
    assert report["hal0"]["rule"]["evidence"]


def test_an_unplaced_hal0_is_loud_and_says_why(tmp_path: Path) -> None:
    """A hal0 of no known release's shape keeps every slot, and says why in its problems."""
    tree = install_era(Hal0Tree(tmp_path), "not-placeable")
    write_slots(tmp_path / "slots")
    report = plan(tree, tmp_path / "slots")
    (line,) = [p for p in report["hal0"]["problems"] if "every slot is kept" in p]
    assert "relabel_stale_vulkan_slots but neither" in line
    assert {"hal0-not-placeable-nothing-moved"} == {
        r["reason"] for r in report["slots"] if r["action"] == KEEP
    }


def test_1_0_0_sends_gpu_vulkan_to_its_own_vulkanfpx_runner(tmp_path: Path) -> None:
    """On 1.0.0 `gpu-vulkan` runs the vulkanfpx runner, which reads only
    HAL0_TOOLBOX_IMAGE_VULKANFPX: an override of ROCMFPX leaves it alone; one of VULKANFPX
    moves it."""
    tree = install_era(Hal0Tree(tmp_path), "1.0.0")
    tree.env_file.parent.mkdir(parents=True, exist_ok=True)
    tree.env_file.write_text("HAL0_TOOLBOX_IMAGE_ROCMFPX=example.org/llama:vk\n")
    write_slots(tmp_path / "slots")
    rows = {r["slot"]: r for r in plan(tree, tmp_path / "slots")["slots"]}
    assert (KEEP, "vulkanfpx", C0824) == (
        rows["plain"]["action"],
        rows["plain"]["effective_image"]["runner"],
        rows["plain"]["effective_image"]["image"],
    )
    tree.env_file.write_text("HAL0_TOOLBOX_IMAGE_VULKANFPX=example.org/llama:vk\n")
    assert RELABEL == actions(plan(tree, tmp_path / "slots"))["plain"]


@pytest.mark.parametrize(
    "broken",
    [None, "{not json", '{"runners": {}}', '{"runners": {"standard": {"image": "a:b"}}}'],
    ids=["missing", "not-json", "empty-table", "tagged-image"],
)
def test_a_1_7_0_manifest_that_gives_no_pins_keeps_every_slot_loudly(
    tmp_path: Path, broken: str | None
) -> None:
    """hal0 fails closed on a missing or invalid manifest (every gpu-vulkan slot not capable);
    the reconciler keeps every slot and says why (a half-replaced manifest never moves slots)."""
    tree = Hal0Tree(tmp_path).install_pins("1.7.0", broken)
    write_slots(tmp_path / "slots")
    report = plan(tree, tmp_path / "slots")
    assert ALL_KEEP == actions(report)
    assert {"hal0-manifest-unusable-nothing-moved"} == {r["reason"] for r in report["slots"]}
    assert any(
        "every slot is kept until the manifest is valid" in p for p in report["hal0"]["problems"]
    )


def test_1_7_0_operator_overrides_and_the_restore_marker(tmp_path: Path) -> None:
    """HAL0_RUNNER_IMAGE_STANDARD moves the unpinned slots off the gated pin; an old
    HAL0_TOOLBOX_IMAGE_ROCMFPX line is judged as the conversion renames it; while a restore
    marker holds, the raw retired pin is judged (and relabelled)."""
    tree = install_era(Hal0Tree(tmp_path), "pins-gated")
    write_slots(tmp_path / "slots")
    tree.env_file.parent.mkdir(parents=True, exist_ok=True)
    tree.env_file.write_text("HAL0_RUNNER_IMAGE_STANDARD=example.org/llama:vk\n")
    assert RELABEL == actions(plan(tree, tmp_path / "slots"))["plain"]
    tree.env_file.write_text(f"HAL0_TOOLBOX_IMAGE_ROCMFPX={STANDARD_REF}\n")
    assert KEEP == actions(plan(tree, tmp_path / "slots"))["plain"]
    tree.env_file.write_text("HAL0_TOOLBOX_IMAGE_ROCMFPX=example.org/llama:vk\n")
    assert RELABEL == actions(plan(tree, tmp_path / "slots"))["plain"]
    tree.env_file.write_text("")
    tree.restore_marker.parent.mkdir(parents=True)
    tree.restore_marker.write_text("version=1.7.0\n")
    got = actions(plan(tree, tmp_path / "slots"))
    assert (KEEP, RELABEL) == (got["plain"], got["pinned-broken"])
    tree.restore_marker.write_text("version=1.6.5\n")  # another release's marker: stale
    assert KEEP == actions(plan(tree, tmp_path / "slots"))["pinned-broken"]


def test_no_hal0_installed_keeps_every_slot_without_a_loud_problem(tmp_path: Path) -> None:
    write_slots(tmp_path / "slots")
    report = plan(Hal0Tree(tmp_path), tmp_path / "slots")
    assert ALL_KEEP == actions(report)
    assert "no-hal0" == report["hal0"]["rule"]["value"]
    assert {"no-hal0-installed-nothing-moved"} == {r["reason"] for r in report["slots"]}


def test_what_if_judging_names_a_release_and_its_manifest(tmp_path: Path) -> None:
    """`plan --assume-hal0 1.7.0 --manifest FILE` on a host with no hal0: judged by 1.7.0's
    rules and that manifest's pins; an unknown release is a usage error."""
    import json

    write_slots(tmp_path / "slots")
    pinned = tmp_path / "manifest.json"
    pinned.write_text(json.dumps(manifest(gated=True)))
    tree = Hal0Tree(tmp_path)
    report = plan_json(
        tree, tmp_path / "slots", "--assume-hal0", "1.7.0", "--manifest", str(pinned)
    )
    assert PINS_GATED == actions(report)
    assert ("pins", "1.7.0") == (report["hal0"]["rule"]["value"], report["hal0"]["release"])
    report = plan_json(tree, tmp_path / "slots", "--assume-hal0", "1.3.0")
    assert "not-placeable" == report["hal0"]["rule"]["value"]  # no 1.0-1.3 code to read


@pytest.mark.parametrize(
    ("era", "expected"), [("0826", KEEP), ("pins-ungated", RELABEL)], ids=["1.3.0", "1.7.0"]
)
def test_a_legacy_backend_slot_is_a_candidate_only_from_1_4(
    tmp_path: Path, era: str, expected: str
) -> None:
    """1.0-1.3's relabel reads `device` alone: a `backend = "vulkan"` slot is left as it is;
    1.4+'s conversion turns the backend into a device before its relabel."""
    tree = Hal0Tree(tmp_path).install(era) if era in ERAS else install_era(Hal0Tree(tmp_path), era)
    slots = tmp_path / "slots"
    slots.mkdir()
    (slots / "old.toml").write_text(
        'name = "old"\ntype = "llm"\nbackend = "vulkan"\nimage_pin = "example.org/llama:vk"\n'
    )
    assert {"old": expected} == actions(plan(tree, slots))
    if era == "pins-ungated":  # the runner-system marker leaves the profile-centric conversion
        tree.restore_marker.parent.mkdir(parents=True)
        tree.restore_marker.write_text("version=1.7.0\n")
        assert {"old": RELABEL} == actions(plan(tree, slots))
