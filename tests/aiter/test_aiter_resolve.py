"""Which CSV files a boot loads: aiter's two-branch rule on the real shipped tables."""

from __future__ import annotations

from pathlib import Path, PurePath

from aiter_support import BPS, route_of

from hal0_reconciler.aiter import resolve, routing


def _resolve(
    rules: routing.Routing, stem: str, env: dict[str, str], configs: Path
) -> resolve.Resolution:
    return resolve.resolve(
        route_of(rules, stem),
        env,
        configs_dir=configs,
        overlay_names=[p.name for p in (configs / "model_configs").iterdir()],
        exists=lambda p: Path(p).is_file(),
    )


def test_unset_variable_pulls_the_default_and_seven_overlays_for_blockscale_bpreshuffle(
    real_configs, rules
):
    """Unset: the shipped default plus every non-untuned model_configs/*<stem>*.csv (7 of them)."""
    res = _resolve(rules, BPS, {}, real_configs)
    assert [f.origin for f in res.files] == [resolve.Origin.DEFAULT] + [resolve.Origin.OVERLAY] * 7
    assert real_configs / f"{BPS}.csv" == res.files[0].path
    assert {
        "a8w8_blockscale_bpreshuffle_tuned_gemm_dsv3.csv",
        "a8w8_blockscale_bpreshuffle_tuned_gemm_glm5.2.csv",
        "a8w8_blockscale_bpreshuffle_tuned_gemm_mm2.5.csv",
        "a8w8_blockscale_bpreshuffle_tuned_gemm_qwen3.5_397b.csv",
        "a8w8_blockscale_bpreshuffle_tuned_gemm_qwen3_235b.csv",
        "dsv4_a8w8_blockscale_bpreshuffle_tuned_gemm.csv",
        "glm5_a8w8_blockscale_bpreshuffle_tuned_gemm.csv",
    } == {f.path.name for f in res.files[1:]}
    assert res.problems == ()


def test_empty_variable_is_the_unset_branch(real_configs, rules):
    """An empty value is unset in aiter: default plus overlays."""
    assert (
        len(
            _resolve(
                rules, BPS, {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE": ""}, real_configs
            ).files
        )
        == 8
    )


def test_a8w8_has_no_overlays(real_configs, rules):
    """a8w8_tuned_gemm has no model_configs overlay: only the default is loaded."""
    res = _resolve(rules, "a8w8_tuned_gemm", {}, real_configs)
    assert [real_configs / "a8w8_tuned_gemm.csv"] == [f.path for f in res.files]


def test_untuned_overlays_are_excluded(real_configs, rules):
    """A file whose name contains 'untuned' is never an overlay (e.g. glm5_untuned_gemm_bf16.csv)."""
    for route in rules.tables:
        res = _resolve(rules, route.stem, {}, real_configs)
        assert [f.path.name for f in res.files if "untuned" in f.path.name] == []
    bf16 = _resolve(rules, "bf16_tuned_gemm", {}, real_configs)
    assert "glm5_untuned_gemm_bf16.csv" not in {f.path.name for f in bf16.files}


def test_colon_joined_value_is_two_pinned_files(real_configs, rules, tmp_path):
    """A set value is split on ':' and taken verbatim: no default, no overlays."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x\n")
    b.write_text("x\n")
    res = _resolve(
        rules, BPS, {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE": f"{a}:{b}"}, real_configs
    )
    assert [(PurePath(a), resolve.Origin.PINNED), (PurePath(b), resolve.Origin.PINNED)] == [
        (f.path, f.origin) for f in res.files
    ]
    assert res.problems == ()


def test_whitespace_only_value_is_set_and_flagged(real_configs, rules):
    """Whitespace only counts as set in aiter (no real file): an operator error, not 'unset'."""
    res = _resolve(
        rules, BPS, {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE": "  "}, real_configs
    )
    assert res.files == ()
    assert len(res.problems) == 1
    assert "whitespace only" in res.problems[0]


def test_missing_pinned_files_are_flagged(real_configs, rules, tmp_path):
    """One missing pinned path fails the load; among several, missing ones are skipped."""
    single = _resolve(
        rules, BPS, {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE": "/nope.csv"}, real_configs
    )
    assert [p.split("(")[-1].split()[-1].rstrip(")") for p in single.problems] == ["fails"]
    real = tmp_path / "real.csv"
    real.write_text("x\n")
    several = _resolve(
        rules,
        BPS,
        {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE": f"/nope.csv:{real}"},
        real_configs,
    )
    assert [PurePath(real)] == [f.path for f in several.loaded]
    assert len(several.problems) == 1
    assert "skipped" in several.problems[0]
