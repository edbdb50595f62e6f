"""Parsed tables on disk: a check in a new process parses only the tables that changed, and
never trusts a table read within a second of its last change."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiter_support import Tree

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.tables import cache as tablecache


def _checked(tree: Tree) -> tuple[monitor.AiterMonitor, list[tuple[str, str]]]:
    """A new monitor (as in a new process) after one check, and the module verdicts."""
    mon = monitor.AiterMonitor(tree.settings())
    report = mon.check(heal=False)
    verdicts = sorted((m.module, str(m.status)) for p in report.plans for m in p.modules)
    return mon, verdicts


@pytest.fixture
def settled_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tablecache, "SETTLED_NS", 0)


def test_a_new_process_parses_no_unchanged_table(
    make_tree: Callable[..., Tree], settled_at_once: None
) -> None:
    tree = make_tree()
    time.sleep(0.02)
    first, verdicts = _checked(tree)
    assert first.surveyor.table_reads > 0
    again, same = _checked(tree)
    assert (0, verdicts) == (again.surveyor.table_reads, same)


def test_a_changed_table_is_parsed_again(
    make_tree: Callable[..., Tree], settled_at_once: None
) -> None:
    tree = make_tree()
    time.sleep(0.02)
    first, _ = _checked(tree)
    table = next(tree.configs.glob("*_tuned_gemm.csv"))
    table.write_text(table.read_text() + "\n")
    time.sleep(0.02)
    again, _ = _checked(tree)
    unchanged, _ = _checked(tree)
    # the changed table is parsed again (once per way it is read), none of the others is
    assert 0 < again.surveyor.table_reads < first.surveyor.table_reads
    assert 0 == unchanged.surveyor.table_reads


def test_a_table_read_right_after_its_change_is_not_stored(make_tree: Callable[..., Tree]) -> None:
    tree = make_tree()  # just copied: every table changed less than a second ago
    first, _ = _checked(tree)
    again, _ = _checked(tree)
    assert first.surveyor.table_reads == again.surveyor.table_reads > 0


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_text("{half"),
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "package": "0.0.0"})),
        lambda p: p.write_text(
            json.dumps(
                {
                    **json.loads(p.read_text()),
                    "tables": {k: {"rows": [1]} for k in json.loads(p.read_text())["tables"]},
                }
            )
        ),
    ],
    ids=["not-json", "other-version", "bad-entries"],
)
def test_a_damaged_or_foreign_cache_is_read_past(
    make_tree: Callable[..., Tree], settled_at_once: None, damage: Callable[[Path], None]
) -> None:
    tree = make_tree()
    time.sleep(0.02)
    first, verdicts = _checked(tree)
    damage(tree.state / "aiter" / "tables.json")
    (tree.state / "aiter" / "needs.json").unlink()  # the tables must be read, not their needs
    again, same = _checked(tree)
    assert (first.surveyor.table_reads, verdicts) == (again.surveyor.table_reads, same)
