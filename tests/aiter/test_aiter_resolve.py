"""Which CSV files a boot loads: aiter's two-branch rule on the real shipped tables."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePath

import pytest
from aiter_support import AT_E4048607, BPS, DATA_CONFIGS, OLDER, route_of, ruleset
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.rules import sets as aiter_rules
from hal0_reconciler.aiter.tables import resolve

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
            resources.files("hal0_reconciler.aiter.rules").joinpath("rules.toml").read_text()
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
    shipped default and merges only the overlays (7 shipped, 3 written); said as a problem."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    unset = _resolve(rules, BPS, {}, where)
    empty = _resolve(rules, BPS, {VAR: ""}, where)
    assert [f for f in unset.files if f.origin is resolve.Origin.OVERLAY] == list(empty.files)
    assert where / f"{BPS}.csv" not in {f.path for f in empty.files}
    assert (True, 1) == (empty.merged, len(empty.problems))
    assert "drops the shipped default" in empty.problems[0]


def test_set_but_empty_without_overlays_is_a_boot_that_dies(real_configs, rules):
    """a8w8_tuned_gemm has no overlay: an empty value leaves aiter with the path '', which
    read_csv refuses at the first lookup: a fatal verdict naming the variable."""
    res = _resolve(rules, "a8w8_tuned_gemm", {"AITER_CONFIG_GEMM_A8W8": ""}, real_configs)
    assert ((), False) == (res.files, res.merged)
    assert res.fatal is not None
    assert "AITER_CONFIG_GEMM_A8W8" in res.fatal
    assert "boot dies" in res.fatal


@pytest.mark.parametrize("configs", ["shipped", "committed"])
def test_set_but_empty_fails_the_load_in_older_aiter(real_configs, rules, book, configs):
    """aiter 0.1.7-0.1.11 read '' first (before the overlays, or alone): the boot dies."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    older = ruleset(book, OLDER)
    res = _resolve(rules, BPS, {VAR: ""}, where, older)
    assert res.files == ()
    assert "boot dies" in (res.fatal or "")
    alone = _resolve(
        rules, "a8w8_tuned_batched_gemm", {"AITER_CONFIG_A8W8_BATCHED_GEMM": ""}, where, older
    )
    assert (alone.files, "boot dies" in (alone.fatal or "")) == ((), True)


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


@pytest.mark.parametrize("name", ["v0.1.6", OLDER, "v0.1.12", "v0.1.13-v0.1.14", AT_E4048607])
@pytest.mark.parametrize("value", ["  ", " \t ", "\n"])
def test_whitespace_only_value_is_a_boot_that_dies_in_every_aiter(rules, book, name, value):
    """No aiter revision strips the value: whitespace only is a set path naming no file, and the
    boot dies at the first lookup (read_csv(' ') raises): fatal, naming the variable."""
    res = _resolve(rules, BPS, {VAR: value}, DATA_CONFIGS, ruleset(book, name))
    assert res.files == ()
    assert res.fatal is not None
    assert VAR in res.fatal
    assert "whitespace only" in res.fatal


def test_a_set_value_is_never_stripped_before_the_split(rules, tmp_path):
    """' a.csv:b.csv ' keeps its outer spaces: ' a.csv' and 'b.csv\n' name no file."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x\n")
    b.write_text("x\n")
    verbatim = _resolve(rules, BPS, {VAR: f"  {a}:{b}\n"}, DATA_CONFIGS)
    assert [] == [f.path for f in verbatim.loaded]
    assert len(verbatim.problems) == 3  # two skipped, then none left: the boot dies
    assert "names no file that exists" in (verbatim.fatal or "")


_VALUE = st.text(alphabet=" \t\n:/abc.", max_size=16)


@settings(max_examples=300, deadline=None)
@given(value=_VALUE)
def test_verbatim_rule_splits_the_raw_value(rules, book, value):
    """e4048607: a non-empty value is split on ':' as it is; pinned files only, never the default."""
    res = _resolve(rules, BPS, {VAR: value}, DATA_CONFIGS)
    if value == "":
        assert all(f.origin is resolve.Origin.OVERLAY for f in res.files)
    elif not value.strip():
        assert (res.files, "whitespace only" in (res.fatal or "")) == ((), True)
    else:
        assert [PurePath(p) for p in value.split(":")] == [f.path for f in res.files]
        assert res.merged == (":" in value)
        assert res.fatal is not None  # none of these names a file


@pytest.mark.parametrize(
    ("name", "first_missing_dies"),
    [("v0.1.6", True), (OLDER, True), ("v0.1.12", False), (AT_E4048607, False)],
)
def test_a_missing_first_path_in_a_list_dies_only_where_it_is_read_unchecked(
    rules, book, tmp_path, name, first_missing_dies
):
    """v0.1.6-v0.1.11 read a ':'-list's first path unchecked (a missing one kills the boot);
    from v0.1.12 missing paths are skipped; a missing later path is skipped everywhere."""
    real = tmp_path / "real.csv"
    real.write_text("x\n")
    rule = ruleset(book, name)
    first = _resolve(rules, BPS, {VAR: f"/nope.csv:{real}"}, DATA_CONFIGS, rule)
    later = _resolve(rules, BPS, {VAR: f"{real}:/nope.csv"}, DATA_CONFIGS, rule)
    assert (first_missing_dies, False) == (first.fatal is not None, later.fatal is not None)
    assert [PurePath(real)] == [f.path for f in later.loaded]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("v0.1.6", set()),
        (OLDER, {"x_BPS_y", "x_BPS_y.csv.bak", "x_BPS_y.csv"}),
        ("v0.1.12", {"x_BPS_y", "x_BPS_y.csv.bak", "x_BPS_y.csv"}),
        ("v0.1.13-v0.1.14", {"x_BPS_y.csv"}),
        (AT_E4048607, {"x_BPS_y.csv"}),
    ],
)
def test_overlays_follow_each_version_s_glob(rules, book, tmp_path, name, expected):
    """Up to v0.1.12 `*<stem>*` (any file; "untuned" anywhere in the path drops it); from
    v0.1.13 `*<stem>*.csv` ("untuned" in the name drops it); v0.1.6 merges no overlay."""
    configs = tmp_path / "configs"
    (configs / "model_configs").mkdir(parents=True)
    for n in ("x_BPS_y", "x_BPS_y.csv.bak", "x_BPS_y.csv", "untuned_BPS.csv"):
        (configs / "model_configs" / n.replace("BPS", BPS)).write_text("x\n")
    res = _resolve(rules, BPS, {}, configs, ruleset(book, name))
    got = {f.path.name.replace(BPS, "BPS") for f in res.files if f.origin is resolve.Origin.OVERLAY}
    assert expected == got
    under = tmp_path / "untuned-site" / "configs"
    shutil.copytree(configs, under)
    inside = _resolve(rules, BPS, {}, under, ruleset(book, name))
    overlays = [f for f in inside.files if f.origin is resolve.Origin.OVERLAY]
    # the older glob tests the whole path for "untuned": a site under such a folder has none
    want = 0 if rule_overlays_any_path(ruleset(book, name)) else len(expected)
    assert want == len(overlays)


def rule_overlays_any_path(rule: aiter_rules.RuleSet) -> bool:
    return rule.overlays is aiter_rules.Overlays.STEM_ANYWHERE


def test_missing_pinned_files_are_flagged(real_configs, rules, tmp_path):
    """One missing pinned path kills the boot; among several, missing ones are skipped."""
    single = _resolve(
        rules, BPS, {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE": "/nope.csv"}, real_configs
    )
    assert "'/nope.csv', which does not exist" in (single.fatal or "")
    assert [single.fatal] == list(single.problems)
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
