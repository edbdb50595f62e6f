"""Which CSV files a boot loads: aiter's two-branch rule on the real shipped tables."""

from __future__ import annotations

from pathlib import Path, PurePath

import pytest
from aiter_support import AT_E4048607, BPS, DATA_CONFIGS, LATER, OLDER, route_of, ruleset
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.aiter import resolve, routing
from hal0_reconciler.aiter import rules as aiter_rules

VAR = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE"


def _resolve(
    rules: routing.Routing,
    stem: str,
    env: dict[str, str],
    configs: Path,
    ruleset: aiter_rules.RuleSet | None = None,
) -> resolve.Resolution:
    if ruleset is None:
        from importlib import resources

        book = aiter_rules.parse_rules(
            resources.files("hal0_reconciler.aiter").joinpath("rules.toml").read_text()
        )
        ruleset = next(s for s in book.sets if s.name == AT_E4048607)
    return resolve.resolve(
        route_of(rules, stem),
        env,
        configs_dir=configs,
        overlay_names=[p.name for p in (configs / "model_configs").iterdir()],
        exists=lambda p: Path(p).is_file(),
        rules=ruleset,
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


@pytest.mark.parametrize("configs", ["shipped", "committed"])
def test_set_but_empty_variable_drops_the_default_and_loads_only_the_overlays(
    real_configs, rules, configs
):
    """`AITER_CONFIG_X=` is not unset: os.getenv(VAR, default) is "", so aiter drops the
    shipped default and merges only the overlays (7 shipped, 3 committed); said as a problem."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    unset = _resolve(rules, BPS, {}, where)
    empty = _resolve(rules, BPS, {VAR: ""}, where)
    assert [f for f in unset.files if f.origin is resolve.Origin.OVERLAY] == list(empty.files)
    assert where / f"{BPS}.csv" not in {f.path for f in empty.files}
    assert (True, 1) == (empty.merged, len(empty.problems))
    assert "drops the shipped default" in empty.problems[0]


def test_set_but_empty_without_overlays_loads_nothing(real_configs, rules):
    """a8w8_tuned_gemm has no overlay: an empty value leaves aiter with the path ''."""
    res = _resolve(rules, "a8w8_tuned_gemm", {"AITER_CONFIG_GEMM_A8W8": ""}, real_configs)
    assert ((), False) == (res.files, res.merged)
    assert "loads no table" in res.problems[0]


@pytest.mark.parametrize("configs", ["shipped", "committed"])
def test_set_but_empty_fails_the_load_in_older_aiter(real_configs, rules, book, configs):
    """aiter 0.1.7-0.1.11 merge '' with the overlays and read the first path ('') unchecked:
    the load fails. Without overlays there is no merge: no table, as in later aiter."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    older = ruleset(book, OLDER)
    res = _resolve(rules, BPS, {VAR: ""}, where, older)
    assert res.files == ()
    assert "the load fails" in res.problems[0]
    alone = _resolve(
        rules, "a8w8_tuned_batched_gemm", {"AITER_CONFIG_A8W8_BATCHED_GEMM": ""}, where, older
    )
    assert (alone.files, "loads no table" in alone.problems[0]) == ((), True)


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


@pytest.mark.parametrize("configs", ["shipped", "committed"])
def test_whitespace_only_value_is_set_and_flagged_at_e4048607(real_configs, rules, configs):
    """At e4048607 whitespace only counts as set (used verbatim, no real file): flagged."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    res = _resolve(rules, BPS, {VAR: "  "}, where)
    assert res.files == ()
    assert len(res.problems) == 1
    assert "whitespace only" in res.problems[0]
    assert "verbatim" in res.problems[0]


@pytest.mark.parametrize("configs", ["shipped", "committed"])
def test_whitespace_only_value_is_empty_in_later_aiter_and_still_flagged(
    real_configs, rules, book, configs
):
    """Later aiter strips the value: whitespace only is empty (overlays only), and said."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    later = ruleset(book, LATER)
    spaced = _resolve(rules, BPS, {VAR: " \t "}, where, later)
    empty = _resolve(rules, BPS, {VAR: ""}, where, later)
    assert empty.files == spaced.files
    assert spaced.files
    assert all(f.origin is resolve.Origin.OVERLAY for f in spaced.files)
    assert "whitespace only" in spaced.problems[0]
    assert "strips it to empty" in spaced.problems[0]


def test_later_aiter_strips_a_set_value_before_the_split(rules, book, tmp_path):
    """' a.csv:b.csv ' is two files in later aiter; at e4048607 both ends keep their space."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x\n")
    b.write_text("x\n")
    value = f"  {a}:{b}\n"
    later = _resolve(rules, BPS, {VAR: value}, DATA_CONFIGS, ruleset(book, LATER))
    verbatim = _resolve(rules, BPS, {VAR: value}, DATA_CONFIGS)
    assert [PurePath(a), PurePath(b)] == [f.path for f in later.loaded]
    assert later.problems == ()
    assert [] == [f.path for f in verbatim.loaded]
    assert len(verbatim.problems) == 2


_VALUE = st.text(alphabet=" \t\n:/abc.", max_size=16)


@settings(max_examples=300, deadline=None)
@given(value=_VALUE)
def test_stripping_rule_equals_resolving_the_stripped_value(rules, book, value):
    """Later aiter: any value resolves like its stripped self; whitespace-only is empty."""
    later = ruleset(book, LATER)
    got = _resolve(rules, BPS, {VAR: value}, DATA_CONFIGS, later)
    want = _resolve(rules, BPS, {VAR: value.strip()}, DATA_CONFIGS, later)
    assert want.files == got.files
    if value and not value.strip():
        assert "whitespace only" in got.problems[0]


@settings(max_examples=300, deadline=None)
@given(value=_VALUE)
def test_verbatim_rule_splits_the_raw_value(rules, book, value):
    """e4048607: a non-empty value is split on ':' as it is; pinned files only, never the default."""
    res = _resolve(rules, BPS, {VAR: value}, DATA_CONFIGS)
    if value == "":
        assert all(f.origin is resolve.Origin.OVERLAY for f in res.files)
    elif not value.strip():
        assert (res.files, "whitespace only" in res.problems[0]) == ((), True)
    else:
        assert [PurePath(p) for p in value.split(":")] == [f.path for f in res.files]
        assert res.merged == (":" in value)


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
