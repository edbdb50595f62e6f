"""Each module judged by the key it is really keyed by; no heal that a rebuild cannot finish."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from aiter_support import BPS, BPS_CK, BPS_CKTILE, GFX950, Tree, names_for
from structlog.testing import capture_logs

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.registry import cache as registry
from hal0_reconciler.aiter.tables import rows as tables

pytestmark = pytest.mark.usefixtures("no_processes")
E4048607 = "0.1.21.dev46+ge4048607a5"
A8W8 = "module_gemm_a8w8"
VAR = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE"


def _a8w8_entries(configs: Path, target: tables.Target) -> list[tuple[tuple[str, ...], str]]:
    rows = csv.DictReader(io.StringIO((configs / "a8w8_tuned_gemm.csv").read_text()))
    return [
        ((r["gfx"], r["cu_num"], r["M"], r["N"], r["K"]), r["kernelName"])
        for r in rows
        if (r["gfx"], r["cu_num"]) == (target.gfx, str(target.cu_num))
    ]


def _modules(report: monitor.MonitorReport) -> dict[str, plan.ModulePlan]:
    return {m.module: m for m in report.plans[0].modules}


def _healthy(tree: Tree, rules, so_builder) -> None:
    for module, names in names_for(tree.configs, rules, GFX950).items():
        tree.install(module, so_builder.build(names))


def test_a_shape_keyed_module_holds_its_names_only_inside_mangled_symbols(
    make_tree, shape_builder, tmp_path
):
    """A module built like aiter's shape-keyed generators lay it out has every kernel name only
    inside a `_Z...` symbol: the name rule (name + NUL) finds none of them."""
    tree = make_tree()
    entries = _a8w8_entries(tree.configs, GFX950)
    so = shape_builder.build(entries)
    data = so.read_bytes()
    names = sorted({name for _, name in entries})
    assert all(f"{len(n)}{n}I".encode() in data for n in names)  # mangled: _Z<len><name>I...
    scan = registry.Registry(tmp_path / "cache.json").scan(so, names)
    assert scan is not None
    assert dict.fromkeys(names, False) == dict(scan.registered)


def test_a_shape_keyed_module_is_not_verifiable_and_never_healed(
    make_tree, shape_builder, so_builder, rules
):
    """module_gemm_a8w8 built without one of its shapes (which the name rule cannot see, and a
    new shape reusing a compiled kernel would hide): not verifiable, an info line, no heal, and
    `aiter plan` has nothing to do (exit 0) for it."""
    tree = make_tree()
    tree.version(E4048607)
    _healthy(tree, rules, so_builder)
    tree.install(A8W8, shape_builder.build(_a8w8_entries(tree.configs, GFX950)[1:]))
    with capture_logs() as logs:
        report = monitor.AiterMonitor(tree.settings()).check(heal=True)
    a8w8 = _modules(report)[A8W8]
    assert ("unverifiable", "none") == (str(a8w8.status), str(a8w8.action))
    assert "not verifiable, never healed" in a8w8.reason
    assert ((), [], False) == (report.heals, heal.list_quarantines(tree.jit), report.needs_operator)
    assert [] == [e for e in logs if e.get("module") == A8W8 and e["log_level"] != "info"]


def test_q_dtype_w_repeats_are_healthy(make_tree, shape_builder, so_builder, rules):
    """a8w8 repeats a shape with int8 and fp8 (aiter keys the runtime lookup with q_dtype_w):
    no broken row, no problem, no warning for it."""
    tree = make_tree()
    tree.version(E4048607)
    _healthy(tree, rules, so_builder)
    tree.install(A8W8, shape_builder.build(_a8w8_entries(tree.configs, GFX950)))
    with capture_logs() as logs:
        report = monitor.AiterMonitor(tree.settings()).check(heal=False)
    assert () == _modules(report)[A8W8].broken
    assert [] == [p for p in report.plans[0].problems if "a8w8_tuned_gemm" in p]
    assert [] == [
        e
        for e in logs
        if e["log_level"] in {"warning", "error"}
        and ("a8w8_tuned_gemm" in str(e) or A8W8 in str(e))
    ]


def _blank_a_ck_name(path: Path, value: str) -> int:
    """Set the kernelName of the first gfx950 ck row of ``path`` to ``value``; its line."""
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].strip().split(",")
    col = header.index("kernelName")
    line = next(n for n, t in enumerate(lines[1:], 2) if ",ck," in t and t.startswith("gfx950,"))
    fields = lines[line - 1].rstrip("\n").split(",")
    fields[col] = value
    lines[line - 1] = ",".join(fields) + "\n"
    path.write_text("".join(lines))
    return line


@pytest.mark.parametrize("value", ["", "NA", "None", "nan", "TRAILING "])
def test_a_broken_row_plus_a_missing_kernel_is_fix_tables_never_a_heal(
    make_tree, so_builder, rules, value
):
    """A name-keyed module missing one kernel, fed by a table that also has a row aiter's code
    generator fails on (a NaN cell, or a name with outer whitespace pandas keeps): the rebuild
    would fail on that row and lose every shape the module served, so the verdict is
    fix-tables (file:line, why) and nothing is quarantined."""
    tree = make_tree()
    tree.version(E4048607)
    need = names_for(tree.configs, rules, GFX950)
    tree.install(BPS_CK, so_builder.build(sorted(need[BPS_CK])[1:]))
    tree.install(BPS_CKTILE, so_builder.build(need[BPS_CKTILE]))
    overlay = tree.configs / "model_configs" / f"{BPS}_glm5.2.csv"
    cell = value.replace("TRAILING", min(need[BPS_CK]))
    line = _blank_a_ck_name(overlay, cell)
    report = monitor.AiterMonitor(tree.settings()).check(heal=True)
    ck = _modules(report)[BPS_CK]
    assert ("uncovered", "fix-tables") == (str(ck.status), str(ck.action))
    assert [(overlay, line)] == [(Path(b.table), b.line) for b in ck.broken]
    assert "no rebuild fixes it" in ck.broken[0].reason
    assert ((), []) == (report.heals, heal.list_quarantines(tree.jit))


def test_a_shape_twice_in_a_pinned_file_is_fix_tables(make_tree, so_builder, rules):
    """A pinned single file holding one shape twice is loaded unmerged: aiter's lookup raises
    'index must be unique' on every boot; fix-tables naming the line, never a heal, even with a
    kernel missing."""
    tree = make_tree()
    tree.version(E4048607)
    need = names_for(tree.configs, rules, GFX950)
    tree.install(BPS_CK, so_builder.build(sorted(need[BPS_CK])[1:]))
    pinned = tree.root / "pinned.csv"
    lines = (tree.configs / f"{BPS}.csv").read_text().splitlines(keepends=True)
    ck = next(t for t in lines[1:] if ",ck," in t)
    pinned.write_text("".join([*lines, ck.replace(",1.0,2.0,", ",1.5,2.0,")]))  # same shape
    report = monitor.AiterMonitor(tree.settings(env={VAR: str(pinned)})).check(heal=True)
    mod = _modules(report)[BPS_CK]
    assert "fix-tables" == str(mod.action)
    assert [(pinned, len(lines) + 1)] == [(Path(b.table), b.line) for b in mod.broken]
    assert "index must be unique" in mod.broken[0].reason
    assert () == report.heals
    pinned.write_text("".join([*lines, ck]))  # the very same row again: dropped by the lookup
    same = monitor.AiterMonitor(tree.settings(env={VAR: str(pinned)})).check(heal=False)
    assert () == _modules(same)[BPS_CK].broken
    pinned.write_text("".join(lines))
    again = monitor.AiterMonitor(tree.settings(env={VAR: str(pinned)})).check(heal=False)
    assert ("uncovered", "heal") == (
        str(_modules(again)[BPS_CK].status),
        str(_modules(again)[BPS_CK].action),
    )


def test_heal_shape_keyed_is_accepted_with_a_warning_and_ignored(
    make_tree, shape_builder, so_builder, rules
):
    """The 0.1 setting heal_shape_keyed = true still loads and changes nothing: the shape-keyed
    module missing a shape is still not healed (the one warning is the settings loader's, at
    every load: tests/daemon/test_deprecated_settings.py; the aiter check adds none)."""
    tree = make_tree()
    tree.version(E4048607)
    _healthy(tree, rules, so_builder)
    tree.install(A8W8, shape_builder.build(_a8w8_entries(tree.configs, GFX950)[1:]))
    with capture_logs() as logs:
        mon = monitor.AiterMonitor(tree.settings(heal_shape_keyed=True))
        report = mon.check(heal=True)
    assert [] == [e for e in logs if "deprecated" in e["event"]]
    assert ("unverifiable", "none", ()) == (
        str(_modules(report)[A8W8].status),
        str(_modules(report)[A8W8].action),
        report.heals,
    )
