"""What the loaded rows ask of each module, and which rows lose aiter's duplicate-shape merge."""

from __future__ import annotations

from pathlib import PurePath

from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import resolve
from hal0_reconciler.aiter.tables import rows as tables

CSV = PurePath("/configs/t.csv")
OVERLAY = PurePath("/configs/model_configs/o.csv")
ROUTE = routing.TableRoute(
    "t", "AITER_CONFIG_T", routing.Keyed.NAME, ("kernelName",), {"ck": "module_x"}
)
AT_80 = tables.Target("gfx942", 80)
AT_304 = tables.Target("gfx942", 304)


def _source(*rows: tables.KernelRow, shapes=()) -> plan.TableSource:
    table = tables.Table(tuple(rows), "digest", len(rows), 0, 0, shapes=tuple(shapes))
    return plan.TableSource(
        resolve.ResolvedFile(CSV, resolve.Origin.DEFAULT, exists=True), ROUTE, table
    )


def test_a_name_looked_up_on_one_target_and_compiled_on_another_is_still_buildable():
    """Lookup on 80 CUs, build for 304: a name whose row exists for both is one a rebuild
    provides; a name only in the 80-CU rows is looked up only; nothing lost counts as merged."""
    both = [
        tables.KernelRow("k", 2, "module_x", "gfx942", 80),
        tables.KernelRow("k", 3, "module_x", "gfx942", 304),
        tables.KernelRow("only80", 4, "module_x", "gfx942", 80),
    ]
    needs = plan.module_needs(
        [_source(*both)], lookup=frozenset({AT_80}), compiled=frozenset({AT_304}), losers={}
    )["module_x"]
    assert (["k"], ["only80"], 0) == (
        sorted(needs.names),
        sorted(needs.unbuildable),
        needs.merged_away,
    )
    assert [plan.Reference(CSV, 2)] == list(needs.names["k"]), "only the looked-up row is named"


def test_of_two_rows_with_one_shape_the_slower_loses_the_merge():
    """Two files, one key each with the same value: the row with the higher ``us`` loses,
    and both rows take part in a duplicate."""
    fast = tables.Table((), "a", 1, 0, 0, shapes=(tables.Shape(2, ("1", "2"), 5.0),))
    slow = tables.Table((), "b", 1, 0, 0, shapes=(tables.Shape(7, ("1", "2"), 9.0),))
    assert ({OVERLAY: frozenset({7})}, 2) == plan.merge_losers([(CSV, fast), (OVERLAY, slow)])


def test_of_two_equally_fast_rows_with_one_shape_the_later_file_loses():
    """A tie on ``us``: the row of the file merged first wins, whatever the paths' order."""
    first = tables.Table((), "a", 1, 0, 0, shapes=(tables.Shape(2, ("1", "2"), 5.0),))
    later = tables.Table((), "b", 1, 0, 0, shapes=(tables.Shape(7, ("1", "2"), 5.0),))
    assert ({OVERLAY: frozenset({7})}, 2) == plan.merge_losers([(CSV, first), (OVERLAY, later)])
