"""Which rows of a tuned table belong to the live target, whatever columns the table has."""

from __future__ import annotations

from aiter_support import BPS, GFX942, GFX950, csv_text, route_of

from hal0_reconciler.aiter.tables import rows as tables

BOTH = frozenset({GFX950, GFX942})


def _names(rules, header: list[str], rows: list[list[str]], targets) -> tuple[list[str], int]:
    data = csv_text(header, rows).encode()
    table = tables.parse_table(data, route=route_of(rules, BPS), targets=targets)
    return [r.name for r in table.rows], table.other_target_rows


def test_a_table_without_gfx_keeps_the_rows_of_the_targets_cu_count(rules):
    """cu_num but no gfx column: rows for the target's CU count are kept, the others are
    dropped as another target's (not all rows dropped, not all kept)."""
    header = ["cu_num", "M", "libtype", "kernelName"]
    rows = [["256", "1", "ck", "k256"], ["80", "1", "ck", "k80"], ["x", "1", "ck", "kbad"]]
    names, other = _names(rules, header, rows, frozenset({GFX950}))
    assert (["k256"], 2) == (names, other), f"cu_num-only table read wrongly: {names}, {other}"
    names, other = _names(rules, header, rows, BOTH)
    assert (["k256", "k80"], 1) == (names, other), "a second target's CU count was not kept"


def test_rows_must_match_gfx_and_cu_count_of_one_target(rules):
    """With both columns, a row is kept only when one target has that gfx *and* that CU count
    (gfx950 rows tuned for 80 CUs are not for a gfx950 with 256)."""
    header = ["gfx", "cu_num", "M", "libtype", "kernelName"]
    rows = [
        ["gfx950", "256", "1", "ck", "a"],
        ["gfx942", "80", "1", "ck", "b"],
        ["gfx950", "80", "1", "ck", "c"],
        ["gfx942", "256", "1", "ck", "d"],
        ["GFX950", "256", "1", "ck", "e"],
    ]
    names, other = _names(rules, header, rows, BOTH)
    assert (["a", "b", "e"], 2) == (names, other), f"wrong gfx/CU rows kept: {names}"


def test_a_table_without_cu_count_filters_on_gfx_alone(rules):
    """gfx but no cu_num column: every row of the target's gfx is kept."""
    header = ["gfx", "M", "libtype", "kernelName"]
    rows = [["gfx950", "1", "ck", "a"], ["gfx942", "1", "ck", "b"]]
    assert (["a"], 1) == _names(rules, header, rows, frozenset({GFX950}))
