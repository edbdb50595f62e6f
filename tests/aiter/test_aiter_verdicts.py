"""Verdicts by the installed aiter's rules, on real tables and gcc-built modules: what a heal
must never touch (rows the boot does not load, rows for a target the build does not compile,
rows no rebuild can fix) and what only an explanation can answer (opus ids)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from aiter_support import BPS, BPS_CK, BPS_CKTILE, DATA_CONFIGS, OPUS
from structlog.testing import capture_logs

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.quarantine import heal

pytestmark = pytest.mark.usefixtures("no_processes")
VAR = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE"
E4048607 = "0.1.21.dev46+ge4048607a5"
LIB_MODULE = {"ck": BPS_CK, "cktile": BPS_CKTILE}


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8-sig"))))


def _bps_files(configs: Path, *, default: bool) -> list[Path]:
    overlays = sorted(
        p for p in (configs / "model_configs").glob(f"*{BPS}*.csv") if "untuned" not in p.name
    )
    return [configs / f"{BPS}.csv", *overlays] if default else overlays


def _names(files: list[Path], gfx: str, cu: str) -> dict[str, set[str]]:
    """module → kernel names of the ck/cktile rows for gfx:cu (read with the csv module)."""
    out: dict[str, set[str]] = {m: set() for m in LIB_MODULE.values()}
    for path in files:
        for row in _rows(path):
            if (row["gfx"], row["cu_num"]) == (gfx, cu) and row["libtype"] in LIB_MODULE:
                out[LIB_MODULE[row["libtype"]]].add(row["kernelName"])
    return out


def _modules(report: monitor.MonitorReport) -> dict[str, object]:
    (base,) = [p for p in report.plans if p.environment == "base"]
    return {m.module: m for m in base.modules}


def _verdict(report: monitor.MonitorReport, module: str) -> tuple[str, str]:
    mod = _modules(report)[module]
    return str(mod.status), str(mod.action)  # type: ignore[attr-defined]


@pytest.fixture(params=["committed", "shipped"])
def configs(request) -> Path:
    if request.param == "committed":
        return DATA_CONFIGS
    return request.getfixturevalue("real_configs")


# --- 1. a set-but-empty AITER_CONFIG_X= ---------------------------------------------------------


def test_set_but_empty_variable_heals_nothing_the_overlays_cover(configs, make_tree, so_builder):
    """AITER_CONFIG_X= drops the shipped default: modules built from the overlays alone are
    covered (the default's rows are never read), and nothing is quarantined. Unset, the
    committed default adds 2 ck names the overlays lack, so the same modules need a heal
    (the shipped default adds none: its rows are all in overlays too)."""
    tree = make_tree(configs)
    tree.version(E4048607)
    overlay_names = _names(_bps_files(configs, default=False), "gfx950", "256")
    for module, names in overlay_names.items():
        tree.install(module, so_builder.build(names or {"placeholder"}))
    empty = monitor.AiterMonitor(tree.settings(env={VAR: ""})).check(heal=True)
    assert (_verdict(empty, BPS_CK), _verdict(empty, BPS_CKTILE)) == (
        ("covered", "none"),
        ("covered", "none"),
    )
    assert (empty.heals, heal.list_quarantines(tree.jit)) == ((), [])
    assert tree.configs / f"{BPS}.csv" not in {Path(s.file.path) for s in empty.plans[0].sources}
    assert any("drops the shipped default" in p for p in empty.plans[0].problems)
    default_only = (
        _names(_bps_files(configs, default=True), "gfx950", "256")[BPS_CK] - (overlay_names[BPS_CK])
    )
    assert len(default_only) == (2 if configs == DATA_CONFIGS else 0)
    unset = monitor.AiterMonitor(tree.settings()).check(heal=False)
    expected = ("uncovered", "heal") if default_only else ("covered", "none")
    assert expected == _verdict(unset, BPS_CK)


# --- 3. an empty kernelName in a ck row ----------------------------------------------------------


def test_a_broken_row_is_reported_by_file_and_line_and_never_healed(configs, make_tree, so_builder):
    """A real overlay with one gfx950 ck row's kernelName blanked: the module stays as it is,
    the row is named (file:line, 'no rebuild fixes it'), and the verdict asks for a person."""
    tree = make_tree(configs)
    for module, names in _names(_bps_files(configs, default=True), "gfx950", "256").items():
        tree.install(module, so_builder.build(names))
    overlay = tree.configs / "model_configs" / f"glm5_{BPS}.csv"
    lines = overlay.read_text().splitlines(keepends=True)
    header = lines[0].strip().split(",")
    col, lib = header.index("kernelName"), header.index("libtype")
    line = next(
        n
        for n, text in enumerate(lines[1:], 2)
        if text.split(",")[lib] == "ck" and text.startswith("gfx950,256,")
    )
    fields = lines[line - 1].rstrip("\n").split(",")
    fields[col] = ""
    lines[line - 1] = ",".join(fields) + "\n"
    overlay.write_text("".join(lines))
    mon = monitor.AiterMonitor(tree.settings())
    with capture_logs() as logs:
        report = mon.check(heal=True)
        mon.check(heal=True)
    ck = _modules(report)[BPS_CK]
    assert [(str(overlay), line)] == [
        (e["path"], e["line"]) for e in logs if e["event"] == "aiter.table_row_broken"
    ]  # said once, as an error
    assert ("covered", "fix-tables") == _verdict(report, BPS_CK)
    assert [(overlay, line)] == [(Path(b.table), b.line) for b in ck.broken]  # type: ignore[attr-defined]
    assert "no rebuild fixes it" in ck.broken[0].reason  # type: ignore[attr-defined]
    assert (report.heals, report.needs_operator) == ((), True)


# --- 4. opus rows: module_deepgemm_opus, keyed by id ---------------------------------------------


def _opus_ids(files: list[Path], gfx: str, cu: str) -> set[str]:
    ids = set()
    for path in files:
        for row in _rows(path):
            if row.get("libtype") == "opus" and (row["gfx"], row["cu_num"]) == (gfx, cu):
                kid = row.get("solidx") or row.get("kernelId")
                ids.add(str(int(float(kid))))
    return ids


@pytest.mark.parametrize("target", ["gfx950:256", "gfx942:80"])
def test_opus_rows_route_to_module_deepgemm_opus_by_id_and_are_never_healed(
    configs, make_tree, so_builder, target
):
    """opus ids come from the resolved blockscale-bpreshuffle table plus the fixed bf16 tables
    (whatever AITER_CONFIG_GEMM_BF16 says); the verdict says coverage cannot be verified, and
    an existing module_deepgemm_opus.so is never quarantined."""
    tree = make_tree(configs)
    tree.install(OPUS, so_builder.build(["no_ids_as_strings_here"]))
    gfx, cu = target.split(":")
    fixed = [
        configs / "bf16_tuned_gemm.csv",
        *sorted(configs.glob("model_configs/*_bf16_tuned_gemm.csv")),
    ]
    expected = _opus_ids([*fixed, *_bps_files(configs, default=True)], gfx, cu)
    elsewhere = tree.root / "bf16_pinned.csv"
    elsewhere.write_text("gfx,cu_num,libtype,solidx,kernelName\n")
    report = monitor.AiterMonitor(
        tree.settings(target=target, env={"AITER_CONFIG_GEMM_BF16": str(elsewhere)})
    ).check(heal=True)
    opus = _modules(report)[OPUS]
    assert expected
    assert ("unverifiable", "none") == _verdict(report, OPUS)
    assert len(expected) == opus.needed  # type: ignore[attr-defined]
    assert "cannot be verified" in opus.reason  # type: ignore[attr-defined]
    assert [] == [h for h in report.heals if OPUS in h.modules]
    assert (tree.jit / f"{OPUS}.so").is_file()


def test_a_pinned_blockscale_bpreshuffle_table_feeds_its_opus_ids(make_tree, tmp_path):
    """The opus generator reads the RESOLVED blockscale-bpreshuffle table: a pinned file's opus
    row adds its id; the shipped overlays' ids are then gone."""
    tree = make_tree()
    pinned = tmp_path / "pinned.csv"
    pinned.write_text(
        "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName\n"
        "gfx950,256,1,2,3,opus,98765,0,1.0,opus_pinned\n"
    )
    plain = monitor.AiterMonitor(tree.settings()).check(heal=False)
    pinned_report = monitor.AiterMonitor(tree.settings(env={VAR: str(pinned)})).check(heal=False)
    names = {
        r.name
        for src in pinned_report.plans[0].sources
        if src.table is not None
        for r in src.table.rows
        if r.module == OPUS
    }
    assert "98765" in names
    assert _modules(pinned_report)[OPUS].needed == _modules(plain)[OPUS].needed + 1  # type: ignore[attr-defined]


# --- 5. the looked-up target and the compiled target differ --------------------------------------


@pytest.fixture
def kfd_80(tmp_path: Path) -> Path:
    """An 80-CU gfx942 (an MI308X-like part)."""
    node = tmp_path / "kfd" / "1"
    node.mkdir(parents=True)
    (node / "properties").write_text("simd_count 320\nsimd_per_cu 4\ngfx_target_version 90402\n")
    return node.parent


def test_rows_looked_up_on_a_target_the_build_never_compiles_are_explained_not_healed(
    configs, make_tree, so_builder, kfd_80
):
    """GPU_ARCHS=gfx942 without CU_NUM on an 80-CU part: aiter compiles the cu-304 rows, the
    runtime looks up the cu-80 rows. Those names are 'not compiled for this target', the
    variables are named, nothing is quarantined; with CU_NUM=80 the same tree is healed."""
    tree = make_tree(configs)
    files = _bps_files(configs, default=True)
    for module, names in _names(files, "gfx942", "304").items():
        tree.install(module, so_builder.build(names or {"placeholder"}))
    looked_up = _names(files, "gfx942", "80")[BPS_CK] - _names(files, "gfx942", "304")[BPS_CK]
    options = {"target": "auto", "kfd_topology_dir": kfd_80}
    with capture_logs() as logs:
        apart = monitor.AiterMonitor(tree.settings(env={"GPU_ARCHS": "gfx942"}, **options)).check(
            heal=True
        )
    ck = _modules(apart)[BPS_CK]
    assert looked_up
    assert ("uncovered", "fix-tables") == _verdict(apart, BPS_CK)
    assert (looked_up, ()) == ({m.name for m in ck.unbuildable}, ck.missing)  # type: ignore[attr-defined]
    assert (apart.heals, heal.list_quarantines(tree.jit)) == ((), [])
    assert apart.plans[0].target == "gfx942:80 (compiled for gfx942:304)"
    assert any("GPU_ARCHS=gfx942 with CU_NUM unset" in p for p in apart.plans[0].problems)
    assert "aiter.module_quarantined" not in [e["event"] for e in logs]
    agreed = monitor.AiterMonitor(
        tree.settings(env={"GPU_ARCHS": "gfx942", "CU_NUM": "80"}, **options)
    ).check(heal=False)
    assert ("uncovered", "heal") == _verdict(agreed, BPS_CK)


# --- 6. rows that lose the duplicate-shape merge -------------------------------------------------


def _duplicate_overlay(tree, *, slower: bool) -> str:
    """An overlay repeating a real gfx950 ck row's shape with another kernel, slower or faster."""
    default = tree.configs / f"{BPS}.csv"
    header = default.read_text().splitlines()[0]
    row = next(r for r in _rows(default) if r["libtype"] == "ck" and r["gfx"] == "gfx950")
    row["kernelName"] = "duplicate_shape_kernel_x"
    row["us"] = str(float(row["us"]) + (50.0 if slower else -0.001))
    text = header + "\n" + ",".join(row[c] for c in header.split(",")) + "\n"
    (tree.configs / "model_configs" / f"zz_dup_{BPS}.csv").write_text(text)
    return row["kernelName"]


@pytest.mark.parametrize(
    "case",
    [
        (E4048607, "stops the first boot", ("covered", "none")),
        ("0.1.11", "lose the duplicate-shape merge", ("unverifiable", "none")),
    ],
    ids=["e4048607", "0.1.11"],
)
def test_a_row_losing_the_duplicate_merge_is_not_missing(configs, make_tree, so_builder, case):
    """A slower duplicate of a real shape is never compiled: not missing, no heal; the plan says
    what this aiter does with it (e4048607 stops the first boot and rewrites the CSVs; 0.1.7 to
    0.1.11 keep the winner in memory, and every module there is shape-keyed). A faster
    duplicate wins and IS needed."""
    version, says, verdict = case
    tree = make_tree(configs)
    tree.version(version)
    for module, names in _names(_bps_files(configs, default=True), "gfx950", "256").items():
        tree.install(module, so_builder.build(names))
    kernel = _duplicate_overlay(tree, slower=True)
    report = monitor.AiterMonitor(tree.settings()).check(heal=True)
    assert verdict == _verdict(report, BPS_CK)
    assert (report.heals, _modules(report)[BPS_CK].merged_away) == ((), 1)  # type: ignore[attr-defined]
    said = report.plans[0].problems if version == E4048607 else report.plans[0].notes
    assert any(says in p for p in said)  # resolved in memory: a note, not a problem
    assert version in report.plans[0].rules
    if version != E4048607:
        return
    _duplicate_overlay(tree, slower=False)
    faster = monitor.AiterMonitor(tree.settings()).check(heal=False)
    assert [kernel] == [m.name for m in _modules(faster)[BPS_CK].missing]  # type: ignore[attr-defined]


def test_environments_with_different_targets_keep_their_own_verdicts(make_tree, kfd_80):
    """Two environments of one tree: the base looks up gfx942:80 rows, a slot setting only
    CU_NUM=304 (no AITER_* variable: still its own environment) looks up gfx942:304 rows (none
    in these tables); each keeps its own verdict, check after check (what one check remembers
    for the next is per target)."""
    tree = make_tree()
    (tree.slots / "big.toml").write_text('[server]\nenv = { CU_NUM = "304" }\n')
    mon = monitor.AiterMonitor(tree.settings(target="auto", kfd_topology_dir=kfd_80))
    for _ in range(2):
        report = mon.check(heal=False)
        by_env = {p.environment: (p.target, {m.module for m in p.modules}) for p in report.plans}
        assert by_env["base"][0] == "gfx942:80"
        assert by_env["slot:big"][0] == "gfx942:304"
        assert BPS_CK in by_env["base"][1]
        assert BPS_CK not in by_env["slot:big"][1]
