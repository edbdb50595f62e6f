"""The same slot files judged under hal0 installs of four eras, through `plan --json`: the
installed hal0 decides (hal0-contract.md, "The effective image")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hal0_tree import ADE07BA, C0822, C0826, STRIX, Hal0Tree

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
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("HAL0_HOME", None)
    s = tree.settings()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hal0_reconciler",
            "plan",
            "--json",
            "--assume-amd",
            "--assume-rocm=usable",
            "--slots-dir",
            str(slots),
            "--state-dir",
            str(tree.root / "state"),
            "--hal0-venv",
            s["hal0_venv"],
            "--hal0-release-dir",
            s["hal0_release_dir"],
            "--hal0-config-file",
            s["hal0_config_file"],
            "--set",
            f"api_env_file={s['api_env_file']}",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode in (0, 2), result.stderr
    return json.loads(result.stdout)


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
