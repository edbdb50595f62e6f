"""hal0's own files, as its releases install them, read to exactly the values in them or to
their era's rule. They are read from ``<repo>/../shared`` (never copied into the project); the
tests skip, saying why, where that folder is absent."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host import hal0, hal0_eras
from hal0_reconciler.model import Hal0Facts, Hal0Rule, RunnerShape
from hal0_reconciler.slots import image
from helpers.hal0_tree import RUNNERS_TEXT, Hal0Tree, catalog_json, install_texts
from helpers.hosts import REPO

REAL = REPO.parent / "shared" / "fixtures" / "hal0" / "installed"
pytestmark = pytest.mark.skipif(
    not REAL.is_dir(), reason=f"hal0's real files are not here ({REAL} is absent)"
)
G = "ghcr.io/hal0ai"
OLD_STALE = {
    f"{G}/hal0-rocmfpx:vulkan-minicpm5",
    "localhost/hal0-rocmfpx:vulkan-minicpm5",
    f"{G}/hal0-rocmfpx:server",
    f"{G}/amd-strix-halo-toolboxes:rocmfpx-7aa484a",
    f"{G}/amd-strix-halo-toolboxes:vulkan-radv-server",
    f"{G}/amd-strix-halo-toolboxes:rocm-7.2.4-rocmfp4-server",
}
RADV = f"{G}/amd-strix-halo-toolboxes:vulkan-radv-server"
KYUZ0 = "docker.io/kyuz0/amd-strix-halo-comfyui:latest"
TOOLS = {
    "flm": f"{G}/hal0-toolbox-flm:0.9.44",
    "kokoro": f"{G}/hal0-toolbox-kokoro:v1",
    "qwen3tts": f"{G}/hal0-toolbox-qwen3tts:v1",
}


def real(name: str) -> str:
    return (REAL / name).read_text(encoding="utf-8")


def read(tree: Hal0Tree) -> hal0.Hal0Read:
    return hal0.read_facts(settings_mod.load(None, tree.settings()))


def test_before_the_rule(tmp_path: Path) -> None:
    """The c077206-era schema: its default and stale set, no capable set, rule pre-rule."""
    tree = install_texts(
        Hal0Tree(tmp_path), schema=real("schema-df9969ff/schema.py"), runners=RUNNERS_TEXT
    )
    got = read(tree)
    f = got.facts
    assert () == got.problems
    assert (Hal0Rule.PRE_RULE, f"{G}/hal0-rocmfpx:c077206") == (f.rule, f.default_image)
    assert (frozenset(), frozenset(OLD_STALE)) == (f.capable, f.stale)
    assert "no VULKAN_CAPABLE_IMAGE_REFS and no VULKAN_FIXED_IMAGE" in f.rule_evidence


def test_the_lane_retired_era_is_told_apart_by_its_updater(tmp_path: Path) -> None:
    """Same schema, plus the updater's relabel of every gpu-vulkan slot: the lane is retired,
    and the evidence names that function."""
    tree = install_texts(
        Hal0Tree(tmp_path),
        schema=real("schema-df9969ff/schema.py"),
        runners=RUNNERS_TEXT,
        extra={"updater/updater.py": real("code-excerpts/updater-relabel_6ef1c22a.py")},
    )
    f = read(tree).facts
    assert Hal0Rule.LANE_RETIRED == f.rule
    assert "updater.py defines relabel_stale_vulkan_slots" in f.rule_evidence


def test_the_allowlist_gate_module_alone_is_no_retirement(tmp_path: Path) -> None:
    """hal0's `_gpu.py` of the allowlist era defines no `require_kfd_for_gpu_slot` at module
    level (its guard is elsewhere): beside a pre-rule schema it proves nothing."""
    tree = install_texts(
        Hal0Tree(tmp_path),
        schema=real("schema-df9969ff/schema.py"),
        runners=RUNNERS_TEXT,
        extra={"providers/_gpu.py": real("code-excerpts/gpu-lane-gates_idx61454137332.py")},
    )
    assert Hal0Rule.PRE_RULE == read(tree).facts.rule


CATALOG_ERA = {
    "rocmfpx": f"{G}/hal0-combined:0824",
    "vulkanfpx": f"{G}/hal0-combined:0824",
    "cuda": "ghcr.io/ggml-org/llama.cpp:server-cuda",
    "cpu": RADV,
    "comfyui": KYUZ0,
    **TOOLS,
}


def test_catalog_runners_with_their_catalog(tmp_path: Path) -> None:
    """`:0824`: `RUNNER_IMAGES = _build_runners_from_catalog()`; images from `_SUPPLEMENTS`,
    the stock `vulkan` runner's from its catalog package; gpu-vulkan goes to `vulkanfpx`."""
    tree = install_texts(
        Hal0Tree(tmp_path),
        schema=real("schema-beb807f8/schema.py"),
        runners=real("runners-54a11e2a/__init__.py"),
        extra={"lifecycle/data/catalog.json": catalog_json()},
    )
    got = read(tree)
    f = got.facts
    assert () == got.problems
    assert (Hal0Rule.ALLOWLIST, RunnerShape.CATALOG, "vulkanfpx") == (
        f.rule,
        f.runners_shape,
        f.vulkan_runner,
    )
    assert {**CATALOG_ERA, "vulkan": f"{G}/amd-strix-halo-toolboxes@sha256:" + "5e" * 32} == dict(
        f.bundled
    )
    assert {k: k for k in ("flm", "kokoro", "qwen3tts", "comfyui")} == dict(f.manifest_keys)
    assert ({}, frozenset({f"{G}/hal0-combined:0824"})) == (dict(f.aliases), f.capable)


def test_catalog_runners_without_their_catalog_fall_back_per_fact(tmp_path: Path) -> None:
    """No catalog file: every `_SUPPLEMENTS` image still counts; the stock `vulkan` runner's
    image is unknown (not capable), said once."""
    tree = install_texts(
        Hal0Tree(tmp_path),
        schema=real("schema-beb807f8/schema.py"),
        runners=real("runners-54a11e2a/__init__.py"),
    )
    got = read(tree)
    assert CATALOG_ERA == dict(got.facts.bundled)
    assert frozenset({"vulkan"}) == got.facts.unknown_runners
    assert ["catalog"] == [p.source for p in got.problems]
    assert Hal0Rule.ALLOWLIST == got.facts.rule


def test_the_collapsed_table_with_promptforge(tmp_path: Path) -> None:
    """2026-08-30: a literal table, vulkanfpx an alias of rocmfpx, promptforge with its key."""
    tree = install_texts(
        Hal0Tree(tmp_path),
        schema=real("schema-bea59a80/schema.py"),
        runners=real("runners-idx61495860796/__init__.py"),
    )
    got = read(tree)
    f = got.facts
    assert () == got.problems
    assert (Hal0Rule.ALLOWLIST, RunnerShape.LITERAL, "rocmfpx") == (
        f.rule,
        f.runners_shape,
        f.vulkan_runner,
    )
    assert {
        "rocmfpx": f"{G}/hal0-combined:0826",
        "promptforge": f"{G}/hal0-promptforge:v2.3-qwen38",
        "cuda": "ghcr.io/ggml-org/llama.cpp:server-cuda",
        "cpu": RADV,
        "moonshine": f"{G}/hal0-toolbox-moonshine:v1",
        "comfyui": KYUZ0,
        **TOOLS,
    } == dict(f.bundled)
    assert "promptforge" == f.manifest_keys["promptforge"]
    assert ({"vulkanfpx": "rocmfpx"}, frozenset({f"{G}/hal0-combined:0826"})) == (
        dict(f.aliases),
        f.capable,
    )


def test_the_strix_release_is_the_newest_known(tmp_path: Path) -> None:
    """2026-08-31: every fact read from the strix release equals the built-in newest fallback
    (its runner table with promptforge and strix, their manifest keys, both image sets)."""
    tree = install_texts(
        Hal0Tree(tmp_path),
        schema=real("schema-cfcc8969/schema.py"),
        runners=real("runners-cfcc8969/__init__.py"),
    )
    got = read(tree)
    f, newest = got.facts, image.NEWEST_KNOWN
    assert () == got.problems

    def facts_of(x: Hal0Facts) -> tuple[Any, ...]:
        return (
            x.default_image,
            x.capable,
            x.stale,
            dict(x.bundled),
            dict(x.manifest_keys),
            dict(x.aliases),
        )

    assert facts_of(newest) == facts_of(f)
    assert Hal0Rule.ALLOWLIST == f.rule


def _ignore(*_args: object) -> None:
    return None


def _canonical(key: str) -> str:
    return {"vulkanfpx": "rocmfpx"}.get(key, key)


@pytest.fixture
def hal0_validator(monkeypatch: pytest.MonkeyPatch) -> Callable[[object], dict[str, str] | None]:
    """hal0's own `SlotsConfig` default_images validator, run from its file in ../shared with
    the strix release's runner keys and alias (None: hal0 refuses the map)."""
    runners = types.ModuleType("hal0.runners")
    runners.RUNNER_IMAGES = dict.fromkeys(image.NEWEST_KNOWN.bundled)  # type: ignore[attr-defined]
    runners.canonical_runner_key = _canonical  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hal0", types.ModuleType("hal0"))
    monkeypatch.setitem(sys.modules, "hal0.runners", runners)
    scope: dict[str, Any] = {"_warn_once": _ignore}
    code = compile(real("schema-cfcc8969/slots_config_excerpt.py"), "slots_config_excerpt", "exec")
    exec(code, scope)  # noqa: S102 - hal0's own validator, to compare verdicts with it
    validator = scope["_default_images_known_families"]

    def run(value: object) -> dict[str, str] | None:
        try:
            return dict(validator(None, value))
        except ValueError:
            return None

    return run


MAPS = [
    {"rocmfpx": " a:1 "},
    {"vulkanfpx": "a:1"},
    {"vulkanfpx": "b:2", "rocmfpx": "a:1"},
    {"rocmfpx": "a:1", "vulkanfpx": "b:2"},
    {"rocmfpx": "a:1", "vulkanfpx": ""},
    {"vulkanfpx": "", "rocmfpx": "a:1"},
    {"rocmfpx": "a:1", "bogus": "b:2"},
    {"cpu": "c:1", "strix": "  "},
    {"rocmfpx": 3},
    {"rocmfpx": ["a:1"]},
    {},
]


@pytest.mark.parametrize("value", MAPS, ids=[repr(m) for m in MAPS])
def test_default_images_agree_with_hal0s_own_validator(
    value: dict[str, object], hal0_validator: Callable[[object], dict[str, str] | None]
) -> None:
    """The reconciler's reading of `[slots].default_images` is hal0's: the same map, or none
    where hal0 refuses its hal0.toml."""
    theirs = hal0_validator(value)
    ours, problem = hal0_eras.validate_default_images(
        value, set(image.NEWEST_KNOWN.bundled), {"vulkanfpx": "rocmfpx"}
    )
    assert theirs == (ours if problem is None else None)


def test_a_strix_runner_pinned_by_digest_is_judged_as_hal0_judges_it(tmp_path: Path) -> None:
    """With a release manifest that pins strix by digest, hal0's newest code compares that
    digest ref with its tag-form capable set as it is (no normalisation is in its source):
    not capable, so the slot is relabelled, and `plan` says why."""
    import json

    from helpers.hal0_tree import plan_json, write_file

    tree = install_texts(
        Hal0Tree(tmp_path),
        schema=real("schema-cfcc8969/schema.py"),
        runners=real("runners-cfcc8969/__init__.py"),
    )
    digest = "sha256:" + "b5" * 32
    manifest = {
        "toolbox_images": {"strix": {"tag": f"{G}/hal0-strix-vulkan:0831", "digest": digest}}
    }
    write_file(tree.release / "manifest.json", json.dumps(manifest))
    write_file(
        tmp_path / "slots" / "vk.toml",
        'name = "vk"\ntype = "llm"\nport = 8081\ndevice = "gpu-vulkan"\nbinary = "strix"\n',
    )
    (row,) = plan_json(tree, tmp_path / "slots")["slots"]
    effective = row["effective_image"]
    assert ("relabel", f"{G}/hal0-strix-vulkan@{digest}", "manifest") == (
        row["action"],
        effective["image"],
        effective["rung"],
    )
    assert "does not map a digest to its tag" in effective["note"]
