"""The README's first command shows what the tool is for: on the project's example slots
(tests/data/readme/), judged as hal0 1.7.0 with the project's example manifest, ``plan`` names
hal0 1.7.0 in its header, relabels one slot (an image hal0 1.7.0 does not launch on Vulkan) and
keeps another (hal0's own Vulkan-gated image), and says why for each. The example manifest
follows hal0 1.7.0's schema: hal0 1.7.0's own parser reads it, and its own capable set is what
the plan says (checked with the real release when its venv is in the test cache)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hosts import REPO

README = REPO / "README.md"
EXAMPLE = REPO / "tests/data/readme"
MANIFEST = EXAMPLE / "manifest-1.7.0.json"
HAL0_CACHE = Path(
    os.environ.get("HAL0_TEST_CACHE", "/var/cache/hal0-reconciler-tests"), "hal0ai/venv-1.7.0"
)
STANDARD = "registry.example.org/hal0-example/standard"
OWN_BUILD = "registry.example.org/ops/llama-rocm:b4321"


def first_command() -> list[str]:
    """The arguments the README's first command gives ``hal0-reconciler``."""
    block = re.search(r"```sh\n(.*?)\n```", README.read_text(), re.DOTALL)
    assert block is not None
    last = block[1].split("&&")[-1].strip()
    program, *args = shlex.split(last)
    assert program.endswith("/hal0-reconciler"), last
    return args


def plan(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The command as a new user runs it from a clone, on a host with no hal0 and no settings
    file (``HAL0_HOME`` an empty folder: nothing of this machine's /etc/hal0 is read)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL0_", "NO_COLOR"))}
    env |= {"HAL0_HOME": str(tmp_path), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "hal0_reconciler", *first_command(), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_the_first_command_plans_the_example_as_hal0_1_7_0_with_the_example_manifest() -> None:
    args = first_command()
    assert args[0] == "plan"
    assert "tests/data/readme/slots" == args[args.index("--slots-dir") + 1]
    assert "1.7.0" == args[args.index("--assume-hal0") + 1]
    assert MANIFEST.relative_to(REPO).as_posix() == args[args.index("--manifest") + 1]
    assert (REPO / args[args.index("--slots-dir") + 1]).is_dir()


def test_its_header_names_hal0_1_7_0_and_one_slot_is_relabelled(tmp_path: Path) -> None:
    """Exit 2 (a change pending); before the table, the header names the release judged."""
    done = plan(tmp_path)
    assert 2 == done.returncode, done.stdout + done.stderr
    header = done.stdout.split("\nSLOT ")[0]
    assert re.search(r"\b1\.7\.0\b", header), header
    assert "1 change(s) pending" in done.stdout


def test_it_relabels_the_own_build_and_keeps_hal0s_vulkan_image_saying_why(
    tmp_path: Path,
) -> None:
    done = plan(tmp_path, "--json")
    assert 2 == done.returncode, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    slots = {s["slot"]: s for s in doc["slots"]}
    coder, chat, tts = slots["coder"], slots["chat"], slots["tts"]
    assert ("relabel", "gpu-rocm") == (coder["action"], coder["new"])
    assert coder["image"] == OWN_BUILD
    assert "not-vulkan-capable" in coder["reason"]
    assert ("keep", None) == (chat["action"], chat["new"])
    assert chat["reason"] == "image-vulkan-capable"
    assert chat["image"].startswith(f"{STANDARD}:example-1"), chat["image"]
    assert ("keep", "runtime-not-llama-cpp") == (tts["action"], tts["reason"])
    assert "1.7.0" in json.dumps(doc["hal0"])


def _hal0_1_7_0(script: str, home: Path) -> str:
    python = HAL0_CACHE / "bin/python"
    if not (HAL0_CACHE / ".done").exists():
        pytest.skip(f"hal0 1.7.0 is not in the test cache ({HAL0_CACHE})")
    done = subprocess.run(
        [str(python), "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HAL0_HOME": str(home)},
    )
    assert 0 == done.returncode, done.stderr
    return done.stdout


def test_hal0_1_7_0_reads_the_example_manifest_and_gates_vulkan_as_the_plan_says(
    tmp_path: Path,
) -> None:
    """hal0 1.7.0's own ``parse_runner_pins`` takes the file; its ``vulkan_capable_refs``
    (the manifest as its installed release tree, under HAL0_HOME) holds the ``standard`` pin
    and not the own build the plan relabels."""
    release = tmp_path / "usr-lib/hal0/current"  # hal0's paths.usr_lib() under HAL0_HOME
    release.mkdir(parents=True)
    (release / "manifest.json").write_bytes(MANIFEST.read_bytes())
    script = (
        "import json\n"
        "from hal0.runners import pins\n"
        f"parsed = pins.parse_runner_pins(json.load(open({str(MANIFEST)!r})))\n"
        "print(json.dumps({'keys': sorted(parsed), 'capable': sorted(pins.vulkan_capable_refs()),"
        " 'standard': pins.pin_for('standard').ref}))\n"
    )
    said = json.loads(_hal0_1_7_0(script, tmp_path))
    assert {"standard", "cpu", "kokoro"} <= set(said["keys"])
    assert said["standard"] in said["capable"]
    assert said["standard"].startswith(f"{STANDARD}:example-1")
    assert OWN_BUILD not in said["capable"]
