"""Reading tuned tables: target and libtype filters, real-world dirt, arbitrary bytes."""

from __future__ import annotations

import contextlib
import csv
import io
import string

import pytest
from aiter_support import (
    BPS,
    BPS_CK,
    BPS_CKTILE,
    DATA_CONFIGS,
    GFX942,
    GFX950,
    csv_text,
    route_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.aiter.tables import rows as tables

HEADER = ["gfx", "cu_num", "M", "libtype", "kernelName"]


def _parse(rules, data: bytes, targets=frozenset({GFX950}), stem: str = BPS) -> tables.Table:
    return tables.parse_table(data, route=route_of(rules, stem), targets=targets)


def test_rows_for_other_targets_are_dropped_on_a_real_table(real_configs, rules):
    """glm5 overlay: gfx942:80 rows are never compiled for gfx950:256 and are not counted."""
    data = (real_configs / "model_configs" / f"glm5_{BPS}.csv").read_bytes()
    on950 = _parse(rules, data)
    on942 = _parse(rules, data, frozenset({GFX942}))
    assert (len(on950.rows), on950.other_target_rows) == (79, 134)
    assert (len(on942.rows), on942.other_target_rows) == (117, 79)
    assert {BPS_CK, BPS_CKTILE} == {r.module for r in on950.rows}
    assert on942.uncompiled_rows == 17  # asm rows


def test_row_line_numbers_count_the_header_as_line_one(rules):
    """References point at the file's own line numbers."""
    text = csv_text(
        HEADER, [["gfx950", "256", "1", "asm", "_ZNx"], ["gfx950", "256", "1", "ck", "k1"]]
    )
    assert [(r.name, r.line, r.module) for r in _parse(rules, text.encode()).rows] == [
        ("k1", 3, BPS_CK)
    ]


def test_no_libtype_column_skips_zn_and_reports_empty_names(rules):
    """Tables without libtype: `_ZN` names are asm; an empty name is a broken row (aiter reads
    'nan', which is not '_ZN...', so its code generator looks 'nan' up and fails)."""
    text = csv_text(
        ["gfx", "cu_num", "kernelName"],
        [["gfx950", "256", "_ZN5aiterX"], ["gfx950", "256", ""], ["gfx950", "256", "a4"]],
    )
    table = _parse(rules, text.encode(), stem="a4w4_blockscale_tuned_gemm")
    assert [r.name for r in table.rows] == ["a4"]
    assert [(3, "module_gemm_a4w4_blockscale")] == [(b.line, b.module) for b in table.broken]


@pytest.mark.parametrize("configs", ["shipped", "committed"])
def test_an_empty_kernel_name_in_a_ck_row_is_a_broken_row_on_real_tables(
    real_configs, rules, configs
):
    """A real glm5 overlay with one ck row's kernelName blanked: that line is reported broken
    (never skipped, never a 'missing' name); asm rows with the same blank stay skipped."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    lines = (where / "model_configs" / f"glm5_{BPS}.csv").read_text().splitlines(keepends=True)
    header = lines[0].strip().split(",")
    col, lib = header.index("kernelName"), header.index("libtype")
    ck_line = next(
        n
        for n, text in enumerate(lines[1:], 2)
        if text.split(",")[lib] == "ck" and "gfx950" in text
    )
    asm_line = next(n for n, text in enumerate(lines[1:], 2) if text.split(",")[lib] == "asm")
    for n in (ck_line, asm_line):
        fields = lines[n - 1].rstrip("\n").split(",")
        fields[col] = ""
        lines[n - 1] = ",".join(fields) + "\n"
    table = _parse(rules, "".join(lines).encode(), targets=frozenset({GFX950, GFX942}))
    assert [(ck_line, BPS_CK)] == [(b.line, b.module) for b in table.broken]
    assert "no rebuild fixes it" in table.broken[0].reason
    assert ck_line not in {r.line for r in table.rows}


@pytest.mark.parametrize("configs", ["shipped", "committed"])
def test_opus_rows_are_read_by_kernel_id_from_the_real_bf16_table(real_configs, rules, configs):
    """The bf16 table's opus rows feed module_deepgemm_opus by id (solidx, then kernelId)."""
    where = real_configs if configs == "shipped" else DATA_CONFIGS
    data = (where / "bf16_tuned_gemm.csv").read_bytes()
    (reg,) = rules.registries
    table = tables.parse_table(data, route=reg.route, targets=frozenset({GFX950}))
    reader = csv.DictReader(io.StringIO(data.decode()))
    expected = [
        (str(int(row["solidx"])), n)
        for n, row in enumerate(reader, 2)
        if row["libtype"] == "opus" and (row["gfx"], row["cu_num"]) == ("gfx950", "256")
    ]
    assert len(expected) == (36 if configs == "shipped" else 4)
    assert expected == [(r.name, r.line) for r in table.rows]
    assert {"module_deepgemm_opus"} == {r.module for r in table.rows}
    assert table.broken == ()


def test_an_opus_row_without_an_integer_id_is_broken(rules):
    """An opus row whose ids are empty or not integers cannot be looked up: broken."""
    (reg,) = rules.registries
    text = csv_text(
        ["gfx", "cu_num", "libtype", "solidx", "kernelId", "kernelName"],
        [
            ["gfx950", "256", "opus", "", "7", "k7"],
            ["gfx950", "256", "opus", "", "", "k"],
            ["gfx950", "256", "opus", "1.5", "", "k"],
            ["gfx950", "256", "triton", "", "", "t"],
        ],
    )
    table = tables.parse_table(text.encode(), route=reg.route, targets=frozenset({GFX950}))
    assert [("7", 2)] == [(r.name, r.line) for r in table.rows]
    assert [3, 4] == [b.line for b in table.broken]


GOOD = csv_text(
    HEADER, [["gfx950", "256", "1", "ck", "kern_a"], ["gfx950", "256", "2", "ck", "kern_b"]]
)


@pytest.mark.parametrize(
    ("label", "data", "names", "quirk"),
    [
        ("utf-8 bom", b"\xef\xbb\xbf" + GOOD.encode(), ["kern_a", "kern_b"], "byte order mark"),
        ("utf-16", GOOD.encode("utf-16"), ["kern_a", "kern_b"], "UTF-16"),
        (
            "ragged",
            (GOOD + "gfx950,256,3,ck,kern_c,extra\ngfx950,256\n").encode(),
            ["kern_a", "kern_b", "kern_c"],
            "ragged",
        ),
        (
            "overlong field",
            GOOD.encode() + b"gfx950,256," + b"9" * 140_000 + b",ck,kern_c\n",
            ["kern_a", "kern_b", "kern_c"],
            "over the csv module's 131072 limit",
        ),
        ("no final newline", GOOD.rstrip("\n").encode(), ["kern_a", "kern_b"], "no final newline"),
    ],
)
def test_dirty_tables_are_read_with_one_quirk(rules, label, data, names, quirk):
    """Dirt that can be read is read, and noted once."""
    table = _parse(rules, data)
    assert names == [r.name for r in table.rows], label
    assert len(table.quirks) == 1, table.quirks
    assert quirk in table.quirks[0]


@pytest.mark.parametrize(
    ("label", "data", "reason"),
    [
        ("header-only 5-byte untuned file", b"M,N,K", "no kernelName column"),
        ("empty", b"", "empty file"),
        ("not utf-8", b"gfx,kernelName\n\xff\xfe\xfd\n"[0:14] + b"\xc3\x28\n", "not UTF-8"),
        ("binary", b"\x7fELF\x00\x00", "NUL"),
        ("quoted overlong", ('kernelName\n"' + "x" * 140_000 + '"\n').encode(), "CSV error"),
    ],
)
def test_unreadable_tables_raise_one_reason(rules, label, data, reason):
    """What cannot be read raises TableUnreadable naming why."""
    with pytest.raises(tables.TableUnreadable, match=reason):
        _parse(rules, data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_raise_nothing_but_table_unreadable(rules, data):
    """Any bytes: a Table or TableUnreadable, never another exception."""
    with contextlib.suppress(tables.TableUnreadable):
        _parse(rules, data)


_NAME = st.text(alphabet=string.ascii_letters + string.digits + '_x",. ', min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            _NAME,
            st.sampled_from(["ck", "cktile", "asm", "triton"]),
            st.sampled_from([GFX950, GFX942]),
        ),
        max_size=30,
    )
)
def test_generated_tables_round_trip_their_kernel_names(rules, rows):
    """Kernel names of well-formed CSVs (quoting included) come back for the target and libtypes kept."""
    text = csv_text(HEADER, [[t.gfx, str(t.cu_num), "1", lib, name] for name, lib, t in rows])
    kept = [name for name, lib, t in rows if t == GFX950 and lib in {"ck", "cktile"}]
    table = _parse(rules, text.encode())
    assert [n for n in kept if n == n.strip() and n not in tables.NA_VALUES] == [
        r.name for r in table.rows
    ]  # exactly as pandas reads the cell: never stripped
    assert sum(1 for n in kept if n != n.strip() or n in tables.NA_VALUES) == len(table.broken)


_SHAPE = st.tuples(st.sampled_from(["1", "2", "3"]), st.sampled_from([1.0, 2.0, 3.0, float("inf")]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_SHAPE, max_size=8), min_size=1, max_size=4))
def test_duplicate_merge_keeps_one_fastest_row_per_shape(files):
    """aiter's merge: per shape exactly one row survives, one with the lowest `us` (the earliest
    file and line on ties); every other row of that shape loses."""
    from pathlib import PurePath

    from hal0_reconciler.aiter.decision import plan

    parsed = [
        (
            PurePath(f"f{i}.csv"),
            tables.Table(
                (),
                "",
                len(rows),
                0,
                0,
                shapes=tuple(tables.Shape(n, (key,), us) for n, (key, us) in enumerate(rows, 2)),
            ),
        )
        for i, rows in enumerate(files)
    ]
    losers, in_duplicates = plan.merge_losers(parsed)
    every = [(path, s) for path, t in parsed for s in t.shapes]
    winners = [(p, s) for p, s in every if s.line not in losers.get(p, frozenset())]
    keys = {s.key for _, s in every}
    assert sorted(keys) == sorted(s.key for _, s in winners)
    for key in keys:
        ((wp, ws),) = [(p, s) for p, s in winners if s.key == key]
        same = [(i, s) for i, (p, t) in enumerate(parsed) for s in t.shapes if s.key == key]
        best = min(same, key=lambda e: (e[1].us, e[0], e[1].line))
        assert (parsed[best[0]][0], best[1]) == (wp, ws)
    assert in_duplicates == sum(
        n for n in (sum(1 for _, s in every if s.key == k) for k in keys) if n > 1
    )
