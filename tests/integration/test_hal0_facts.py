"""What the installed hal0 believes, read from its files on disk; fallbacks and their reasons."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.hal0 import reader as hal0
from hal0_reconciler.model import Hal0Rule
from helpers.hal0_tree import C0822, C0826, ERAS, STRIX, Hal0Tree

CPU_DIGEST = "sha256:" + "cd" * 32


def load(tree: Hal0Tree, **extra: object) -> settings_mod.Settings:
    return settings_mod.load(None, {**tree.settings(), **extra})


@pytest.mark.parametrize("era", list(ERAS))
def test_every_era_is_read_from_its_own_files(tmp_path: Path, era: str) -> None:
    """Version, default image, capable and stale sets, runner table: each from the tree."""
    tree = Hal0Tree(tmp_path).install(era)
    read = hal0.read_facts(load(tree))
    spec = ERAS[era]
    assert () == read.problems
    f = read.facts
    assert (spec.version, spec.default) == (f.version, f.default_image)
    assert frozenset({spec.fixed, *spec.extra_capable}) == f.capable
    assert frozenset(spec.stale) == f.stale
    assert spec.default == f.bundled["rocmfpx"]
    assert {"cpu": "cpu", "flm": "flm"} == dict(f.manifest_keys)
    assert str(tree.schema) + " (VULKAN_CAPABLE_IMAGE_REFS)" == f.sources["capable"]


def test_a_missing_hal0_is_nothing_to_judge_against_said_once_not_loud(tmp_path: Path) -> None:
    """No venv, no release: nothing to judge against (every slot kept), said, not degraded."""
    read = hal0.read_facts(load(Hal0Tree(tmp_path)))
    assert Hal0Rule.NO_HAL0 == read.facts.rule
    assert frozenset() == read.facts.capable
    (problem,) = read.problems
    assert "no hal0 installed" in problem.why
    assert not problem.not_understood


def test_a_schema_shape_not_understood_is_loud_and_specific(tmp_path: Path) -> None:
    """A capable set built by a call is not guessed, nor replaced by the newest one: the era
    cannot be placed, loudly, by line, and every slot is kept."""
    tree = Hal0Tree(tmp_path).install("0824")
    text = tree.schema.read_text().replace(
        "VULKAN_CAPABLE_IMAGE_REFS: frozenset[str] = frozenset(",
        "VULKAN_CAPABLE_IMAGE_REFS: frozenset[str] = _load_refs(",
    )
    tree.schema.write_text(text)
    read = hal0.read_facts(load(tree))
    problem, era = read.problems
    assert (True, True) == (problem.not_understood, era.not_understood)
    assert "VULKAN_CAPABLE_IMAGE_REFS" in problem.why
    assert "call `_load_refs(" in problem.why
    assert Hal0Rule.NOT_PLACEABLE == read.facts.rule
    assert "every slot is kept" in era.why
    assert frozenset() == read.facts.capable  # never another release's set spliced in


def test_settings_override_each_set_outright(tmp_path: Path) -> None:
    """A setting wins over the installed hal0 for the capable set, the stale set, the default."""
    tree = Hal0Tree(tmp_path).install("0826")
    s = load(
        tree,
        vulkan_validated_images=["x:1"],
        stale_images=[],
        default_runner_image="y:2",
    )
    f = hal0.read_facts(s).facts
    assert (frozenset({"x:1"}), frozenset(), "y:2") == (f.capable, f.stale, f.default_image)
    assert "y:2" == f.bundled["rocmfpx"]
    assert "setting vulkan_validated_images" == f.sources["capable"]


def test_operator_files_default_images_environment_and_manifest(tmp_path: Path) -> None:
    """hal0.toml's default_images, HAL0_TOOLBOX_IMAGE_* in api.env, the manifest's digest refs."""
    tree = Hal0Tree(tmp_path).install("0826")
    tree.config.parent.mkdir(parents=True, exist_ok=True)
    tree.config.write_text('[slots.default_images]\nrocmfpx = " ops:1 "\n')
    tree.env_file.write_text(
        "# hal0-api environment\nHAL0_ADMIN_KEY=secret\nHAL0_TOOLBOX_IMAGE_ROCMFPX='env:2'\n"
    )
    manifest = {
        "toolbox_images": {
            "cpu": {"tag": "ghcr.io/hal0ai/hal0-toolbox-cpu:v1", "digest": CPU_DIGEST},
            "flm": {"tag": "ghcr.io/hal0ai/hal0-toolbox-flm:0.9.44", "digest": None},
            "odd": "not a table",
        }
    }
    (tree.release / "manifest.json").write_text(json.dumps(manifest))
    read = hal0.read_facts(load(tree))
    assert () == read.problems
    f = read.facts
    assert {"rocmfpx": "ops:1"} == dict(f.default_images)
    assert {"HAL0_TOOLBOX_IMAGE_ROCMFPX": "env:2"} == dict(f.environment)  # no secrets kept
    assert {
        "cpu": f"ghcr.io/hal0ai/hal0-toolbox-cpu@{CPU_DIGEST}",
        "flm": "ghcr.io/hal0ai/hal0-toolbox-flm:0.9.44",
    } == dict(f.manifest)


def test_the_etc_manifest_wins_over_the_release_one(tmp_path: Path) -> None:
    tree = Hal0Tree(tmp_path).install("0826")
    tree.config.parent.mkdir(parents=True, exist_ok=True)
    (tree.config.parent / "manifest.json").write_text('{"toolbox_images": {"cpu": {"tag": "a:1"}}}')
    (tree.release / "manifest.json").write_text('{"toolbox_images": {"cpu": {"tag": "b:2"}}}')
    assert {"cpu": "a:1"} == dict(hal0.read_facts(load(tree)).facts.manifest)


@pytest.mark.parametrize(
    ("where", "content", "source"),
    [
        ("config", b"[slots\n", ["hal0.toml"]),
        ("manifest", b"{not json", ["manifest"]),
        ("schema", b"\xff\xfe", ["schema.py", "hal0"]),
        ("runners", b"RUNNER_IMAGES = (", ["runners", "hal0"]),
        ("schema", b"x" * (5 * 1024 * 1024), ["schema.py", "hal0"]),
    ],
)
def test_broken_sources_are_problems_never_crashes(
    tmp_path: Path, where: str, content: bytes, source: list[str]
) -> None:
    """Invalid TOML/JSON, undecodable or oversized files: a problem naming the source (and,
    for hal0's own code, one saying its era could not be placed)."""
    tree = Hal0Tree(tmp_path).install("0826")
    path = {
        "config": tree.config,
        "manifest": tree.release / "manifest.json",
        "schema": tree.schema,
        "runners": tree.runners,
    }[where]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    read = hal0.read_facts(load(tree))
    assert source == [p.source for p in read.problems]


def test_a_fifo_in_place_of_a_source_does_not_block(tmp_path: Path) -> None:
    """A FIFO named schema.py is refused without opening it for a blocking read."""
    tree = Hal0Tree(tmp_path).install("0826")
    tree.schema.unlink()
    os.mkfifo(tree.schema)
    read = hal0.read_facts(load(tree))
    assert ["schema.py", "hal0"] == [p.source for p in read.problems]
    assert "not a regular file" in read.problems[0].why


def test_the_newest_python_folder_in_the_venv_is_read(tmp_path: Path) -> None:
    """After a Python upgrade a venv may hold python3.11 and python3.12: the newer one counts."""
    tree = Hal0Tree(tmp_path).install("0822")
    newer = tree.venv / "lib/python3.12/site-packages/hal0"
    newer.parent.mkdir(parents=True)
    Hal0Tree(tmp_path / "other").install("0826").package.rename(newer)
    assert C0826 == hal0.read_facts(load(tree)).facts.default_image


def test_the_reader_rereads_only_what_changed(tmp_path: Path) -> None:
    """An unchanged tree is the same facts object (stat calls only); an update is seen."""
    tree = Hal0Tree(tmp_path).install("0822")
    reader = hal0.Hal0Reader(load(tree))
    first = reader.read()
    assert first is reader.read()
    tree.install("0826")
    second = reader.read()
    assert (C0822, C0826) == (first.facts.default_image, second.facts.default_image)
    assert STRIX in second.facts.capable


def test_anything_a_source_raises_falls_back_with_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever reading hal0's files raises, the reader gives one loud problem and a hal0 whose
    era is not placed (every slot kept): a pass never stops on hal0's files."""
    tree = Hal0Tree(tmp_path).install("0826")

    def explode(*args: object, **kwargs: object) -> None:
        raise RecursionError

    monkeypatch.setattr(hal0, "read_facts", explode)
    read = hal0.Hal0Reader(load(tree)).read()
    assert Hal0Rule.NOT_PLACEABLE == read.facts.rule
    assert frozenset() == read.facts.capable
    (problem,) = read.problems
    assert "nested too deeply" in problem.why


@pytest.mark.parametrize(
    ("where", "content", "source", "why"),
    [
        ("schema", "aa=1\n" * 700_000, "schema.py", "refused unparsed"),
        ("runners", "x = [" + "1," * 1_000_000 + "]\n", "runners", "refused unparsed"),
        ("config", "# pad\n" * 200_000, "hal0.toml", "larger than the 1048576-byte limit"),
        ("manifest", " " * (1024 * 1024 + 1), "manifest", "larger than the 1048576-byte limit"),
    ],
    ids=["700k statements", "a 1M-element list", "a 1.2 MB hal0.toml", "a 1 MiB manifest"],
)
def test_hostile_sizes_are_refused_with_a_reason(
    tmp_path: Path, where: str, content: str, source: str, why: str
) -> None:
    """hal0's Python sources are parsed only below a structure cap (a 4 MiB module of 700k
    statements costs one linear count, not gigabytes of syntax tree); hal0.toml and the
    manifests are read up to 1 MiB. Each refusal names the source and why."""
    tree = Hal0Tree(tmp_path).install("0826")
    path = {
        "config": tree.config,
        "manifest": tree.release / "manifest.json",
        "schema": tree.schema,
        "runners": tree.runners,
    }[where]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    read = hal0.read_facts(load(tree))
    (problem,) = [p for p in read.problems if p.source == source]
    assert why in problem.why


def test_the_rule_and_the_release_are_described_with_evidence(tmp_path: Path) -> None:
    """`plan --json` and `probe` show the release and its era, with what decided it."""
    tree = Hal0Tree(tmp_path).install("0826")
    described = hal0.describe(hal0.read_facts(load(tree)).facts)
    assert {
        "value": "allowlist",
        "evidence": "1.3.0: schema.py defines VULKAN_CAPABLE_IMAGE_REFS",
    } == described["rule"]
    assert ("1.3.0", "1.3.0") == (described["release"], described["version"])
    assert described["summary"].startswith("hal0 1.3.0: schema allowlist, capable: ")


def test_an_updater_that_relabels_without_a_capable_set_is_no_release(tmp_path: Path) -> None:
    """No capable set and no pins: pre-rule only when the updater has no relabel pass; with
    one, the shape is no published release's (not placeable)."""
    from helpers.hal0_tree import (
        RUNNERS_TEXT,
        UPDATER_RELABEL_TEXT,
        install_texts,
        pre_rule_schema_text,
    )

    tree = Hal0Tree(tmp_path)
    for updater, rule in (
        ('"""no relabel here"""\n', "pre-rule"),
        (UPDATER_RELABEL_TEXT, "not-placeable"),
    ):
        install_texts(
            tree,
            schema=pre_rule_schema_text(),
            runners=RUNNERS_TEXT,
            version="0.9.8",
            extra={"updater/updater.py": updater},
        )
        assert rule == hal0.read_facts(load(tree)).facts.rule.value


def test_a_manifest_changed_after_hal0_api_started_is_judged_by_the_file_and_said(
    tmp_path: Path,
) -> None:
    """1.4+ reads its manifest once per process: a newer file is judged, and the note says
    that the running hal0-api still uses the one it read (a real `hal0 serve` process)."""
    import subprocess
    import sys
    import time

    from helpers.hal0_tree import manifest

    tree = Hal0Tree(tmp_path).install_pins("1.7.0", manifest(gated=True))
    fake = tree.venv / "bin/hal0"
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    fake.chmod(0o755)
    older = time.time() - 60
    os.utime(tree.release / "manifest.json", (older, older))
    serve = subprocess.Popen([str(fake), "serve"])
    try:
        time.sleep(0.3)
        assert [] == [p for p in hal0.read_facts(load(tree)).problems if "hal0-api" in p.why]
        (tree.release / "manifest.json").write_text(json.dumps(manifest(gated=False)))
        read = hal0.read_facts(load(tree))
        (note,) = [p for p in read.problems if "hal0-api" in p.why]
        assert not note.not_understood
        assert frozenset() == read.facts.capable  # the file's (ungated) pins
    finally:
        serve.kill()
        serve.wait(timeout=10)


def test_an_invalid_hal0_toml_on_1_3_says_hal0s_own_boot_pass_stops_there(tmp_path: Path) -> None:
    """1.0-1.3: hal0's config migration fails on it before its relabel; the reconciler still
    judges (decision: a broken settings file must not leave slots stale) and says why."""
    tree = Hal0Tree(tmp_path).install("0826")
    tree.config.parent.mkdir(parents=True, exist_ok=True)
    tree.config.write_text('[slots.default_images]\nnosuch = "x/y:1"\n')
    (problem,) = [p for p in hal0.read_facts(load(tree)).problems if p.source == "hal0.toml"]
    assert "own boot pass stops at this file" in problem.why
    assert not problem.not_understood
