"""The `aiter` verbs: exit codes, JSON, explain, heal twice, restore, and one real subprocess."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiter_support import BPS_CK, BPS_CKTILE

from hal0_reconciler.aiter import cli, monitor
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.settings import Settings

pytestmark = pytest.mark.usefixtures("no_processes")
SRC = Path(__file__).resolve().parents[2] / "src"


def _run(tree, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["aiter", *argv])
    out = io.StringIO()
    return cli.main(args, tree.settings(), out=out), out.getvalue()


@pytest.fixture
def tree(make_tree, built_modules):
    t = make_tree()
    t.install(BPS_CK, built_modules[BPS_CK])
    t.install(BPS_CKTILE, built_modules["stale_cktile"])
    return t


def test_plan_exits_2_when_a_heal_is_pending_and_0_after(tree, built_modules):
    """Stale module: 2; healthy again: 0."""
    assert _run(tree, "plan")[0] == 2
    tree.install(BPS_CKTILE, built_modules[BPS_CKTILE])
    assert _run(tree, "plan")[0] == 0


def test_plan_json_lists_the_missing_names_and_rows(tree):
    """--json carries the verdict, missing names and their table rows."""
    code, out = _run(tree, "plan", "--json")
    doc = json.loads(out)
    (cktile,) = [m for m in doc["plans"][0]["modules"] if m["module"] == BPS_CKTILE]
    assert (
        code,
        doc["heal_pending"],
        cktile["status"],
        cktile["action"],
    ) == (2, True, "uncovered", "heal")
    assert cktile["missing"][0]["refs"][0]["line"] > 1


def test_plan_exits_1_on_error(tree, tmp_path):
    """Broken routing data is an error, not 'nothing to do'."""
    bad = tmp_path / "routing.toml"
    bad.write_text("not = [toml")
    assert _run(tree, "plan", "--routing-file", str(bad))[0] == 1


def test_heal_then_second_heal_after_unchanged_rebuild_refuses_to_loop(tree, built_modules):
    """heal quarantines the stale module; after an unchanged rebuild, heal exits 1 and moves nothing."""
    code, out = _run(tree, "heal")
    assert code == 0
    assert "quarantine" in out
    tree.install(BPS_CKTILE, built_modules["stale_cktile"])
    code, out = _run(tree, "heal")
    assert (code, len(heal.list_quarantines(tree.jit))) == (1, 1)
    assert "not-converging" in out


def test_restore_verb(tree):
    """restore <id> puts the module back; an unknown id is exit 1."""
    _run(tree, "heal")
    (qdir,) = heal.list_quarantines(tree.jit)
    assert (
        _run(tree, "restore", qdir.name)[0],
        (tree.jit / f"{BPS_CKTILE}.so").exists(),
    ) == (0, True)
    assert _run(tree, "restore", "19990101T000000Z")[0] == 1


def test_explain_a_real_registry_miss_message(tree):
    """The crash text names the kernel: explain finds module, rows, the disk verdict and the heal."""
    report = monitor.AiterMonitor(tree.settings()).check(heal=False)
    (cktile,) = [m for m in report.plans[0].modules if m.module == BPS_CKTILE]
    kernel = cktile.missing[0].name
    text = (
        f"[aiter] kernel '{kernel}' is not present in the compiled registry. The tuned CSV "
        "references a kernel that was not built into aiter. Rebuild aiter (or remove this row "
        "from aiter/configs/a8w8_blockscale_bpreshuffle_tuned_gemm.csv) and try again."
    )
    code, out = _run(tree, "explain", text)
    assert code == 0
    assert f"module {BPS_CKTILE}" in out
    assert "does NOT register it" in out
    assert "heal would quarantine" in out
    assert cktile.missing[0].refs[0].line == int(out.split("named by ")[1].split(":")[1].split()[0])


def test_explain_without_the_marker_is_an_error(tree):
    """Text without the registry-miss marker: exit 1."""
    assert _run(tree, "explain", "Segmentation fault")[0] == 1


def test_real_subprocess_plan(tree, tmp_path):
    """`python -m hal0_reconciler aiter plan` over the tree: exit 2 and the stale module named."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "HAL0_HOME": str(tmp_path / "nohal0")}
    argv = [
        sys.executable,
        "-m",
        "hal0_reconciler",
        "aiter",
        "plan",
        "--package-dir",
        str(tree.package),
        "--jit-dir",
        str(tree.jit),
        "--target",
        "gfx950:256",
        "--state-dir",
        str(tree.state),
        "--slots-dir",
        str(tree.slots),
        "--log-level",
        "error",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{BPS_CKTILE}: uncovered -> heal" in proc.stdout


def test_options_override_configured_trees(tree, built_modules):
    """--target on a configured tree replaces its target (here: gfx942:80 makes ck stale too)."""
    code, out = _run(tree, "plan", "--target", "gfx942:80", "--no-slots")
    assert (2, "target gfx942:80") == (code, out.split(", jit")[0].split("] ")[1])


@pytest.mark.parametrize("target", ["gfx950", "banana:x", "gfx950:0"])
def test_plan_exits_1_when_nothing_could_be_checked(tree, target):
    """An unknown or malformed target means nothing was checked: exit 1, not "nothing to do"."""
    code, out = _run(tree, "plan", "--target", target)
    assert 1 == code
    assert "nothing is checked" in out


def test_explain_a_kernel_no_table_names_is_an_error(tree):
    """A registry-miss message for a kernel no loaded table names: exit 1 (nothing to heal)."""
    text = "[aiter] kernel 'no_such_kernel_xyz' is not present in the compiled registry."
    assert _run(tree, "explain", text)[0] == 1


def _run_bare(*argv: str, tmp_path: Path) -> tuple[int, str]:
    """`aiter ...` with no tree configured at all (only what the operator typed)."""
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["aiter", *argv])
    out = io.StringIO()
    bare = Settings(slots_dir=tmp_path / "slots", state_dir=tmp_path / "state")
    return cli.main(args, bare, out=out), out.getvalue()


CKTILE_MISS = (
    "RuntimeError: gemm_a8w8_blockscale_cktile kernel "
    "'a8w8_blockscale_cktile_192x256x128_1x4x1_16x16x128_intrawave_0x0x0_1' is not present in "
    "the compiled registry. The tuned CSV references a kernel that was not built into aiter. "
    "Rebuild aiter (or remove this row from aiter/configs/a8w8_blockscale_tuned_gemm.csv) and "
    "try again."
)


def test_explain_without_a_tree_names_the_module_from_the_text(tmp_path):
    """Only the crash text: the module comes from the text itself; both cktile modules compile
    the source that raised it (whose message always names the blockscale table), so both are
    named; what a tree would add and aiter's AITER_REBUILD=1 are said."""
    code, out = _run_bare("explain", CKTILE_MISS, tmp_path=tmp_path)
    assert code == 0
    assert (
        "module module_gemm_a8w8_blockscale_cktile or "
        "module_gemm_a8w8_blockscale_bpreshuffle_cktile"
    ) in out
    assert "--package-dir" in out
    assert "AITER_REBUILD=1" in out


@pytest.mark.parametrize(
    ("text", "module"),
    [
        (
            (
                "kernel 'a8w8_blockscale_bpreshuffle_1x128x128_256x16x64x256_x' is not present "
                "in the compiled registry"
            ),
            "module module_gemm_a8w8_blockscale_bpreshuffle (from the kernel-name prefix",
        ),
        (
            (
                "gemm_a4w4_blockscale kernel 'a4w4_blockscale_256x64x128x128_16x16_x' is not "
                "present in the compiled registry"
            ),
            "module module_gemm_a4w4_blockscale (from the message's source",
        ),
        (
            "c10::Error: Kernel id 112 not found in a16w16 bf16 tune lookup table (gfx942)",
            "module module_deepgemm_opus",
        ),
    ],
)
def test_explain_without_a_tree_for_each_message_kind(tmp_path, text, module):
    """Kernel-name prefix, the message's own source, and opus 'Kernel id N not found'."""
    code, out = _run_bare("explain", text, tmp_path=tmp_path)
    assert (0, True) == (code, module in out)


def test_explain_without_a_tree_and_without_a_marker_is_an_error(tmp_path):
    """Text that is no registry miss: exit 1, nothing guessed."""
    assert _run_bare("explain", "Segmentation fault", tmp_path=tmp_path) == (1, "")


def test_explain_a_kernel_id_miss_names_the_rows_and_says_it_cannot_be_verified(tree):
    """'Kernel id N not found ...': the opus rows naming id N, the module, and no heal."""
    report = monitor.AiterMonitor(tree.settings()).check(heal=False)
    row = next(
        (src, r)
        for src in report.plans[0].sources
        if src.table is not None
        for r in src.table.rows
        if r.module == "module_deepgemm_opus"
    )
    text = f"Kernel id {row[1].name} not found in a16w16 bf16 tune lookup table"
    code, out = _run(tree, "explain", text)
    assert code == 0
    assert f"kernel id {row[1].name}" in out
    assert f"named by {row[0].file.path}:{row[1].line}" in out
    assert "cannot be verified" in out
    assert "AITER_REBUILD=1" in out
    assert "the last code generation" not in out  # no sidecar: no hint
    sidecar = tree.jit / "build" / "compiled_kids_opus.json"
    sidecar.write_text(json.dumps([int(row[1].name) + 1]))
    assert f"did NOT list id {row[1].name} in {sidecar}" in _run(tree, "explain", text)[1]
    sidecar.write_text(json.dumps([int(row[1].name)]))
    assert f"listed id {row[1].name} in {sidecar} (a hint" in _run(tree, "explain", text)[1]


def test_plan_says_the_aiter_version_and_rule_set(tree):
    """The plan names the installed aiter's version and the rule set it followed; an unknown
    version falls back to the newest rules, said once."""
    _, out = _run(tree, "plan")
    assert "aiter version unknown, rules v0.1.15-e4048607" in out
    assert 1 == out.count("using the newest known rules")
    (tree.package / "_version.py").write_text("__version__ = '0.1.22'\n")
    _, out = _run(tree, "plan")
    assert "aiter 0.1.22, rules v0.1.15-e4048607" in out
    assert 1 == out.count("using the newest known rules v0.1.15-e4048607")
    (tree.package / "_version.py").write_text("__version__ = '0.1.21.dev46+ge4048607a5'\n")
    _, out = _run(tree, "plan")
    assert "aiter 0.1.21.dev46+ge4048607a5, rules v0.1.15-e4048607 (chosen by version" in out
    assert "routing e4048607" in out
    assert "newest known" not in out
    doc = json.loads(_run(tree, "plan", "--json")[1])
    assert doc["plans"][0]["rules"].startswith("aiter 0.1.21.dev46+ge4048607a5, rules v0.1.15")
    (tree.package / "_version.py").write_text("__version__ = '0.1.13'\n")
    _, out = _run(tree, "plan")
    assert "aiter 0.1.13, rules v0.1.13-v0.1.14 (chosen by version" in out
    assert "routing v0.1.6-v0.1.14" in out
    assert doc["plans"][0]["rules_note"] is None


def test_plan_exits_1_for_a_row_no_rebuild_fixes_and_json_names_it(tree, built_modules):
    """A ck row with an empty kernelName: exit 1 (a person must fix the table), the row in JSON."""
    tree.install(BPS_CKTILE, built_modules[BPS_CKTILE])
    table = tree.configs / "a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
    table.write_text(table.read_text() + "gfx950,256,9,9,9,ck,0,0,1.0,,0,0,0\n")
    line = len(table.read_text().splitlines())
    code, out = _run(tree, "plan", "--json")
    (ck,) = [m for m in json.loads(out)["plans"][0]["modules"] if m["module"] == BPS_CK]
    assert (code, ck["action"]) == (1, "fix-tables")
    assert [(str(table), line)] == [(b["table"], b["line"]) for b in ck["broken"]]
    code, text = _run(tree, "plan")
    assert f"broken row {table}:{line}" in text


def test_plan_prints_its_findings_and_logs_none_of_them(tree):
    """`aiter plan` in a new process prints every finding, an unreadable slot file too, and
    logs none (the daemon logs them): no log line, and neither structlog nor psutil loaded."""
    (tree.slots / "bad.toml").write_text("name = [unclosed\n")
    code = (
        "import sys\n"
        "from hal0_reconciler import cli\n"
        "rc = cli.main(sys.argv[1:])\n"
        "print('loaded:', sorted(m for m in ('structlog', 'psutil') if m in sys.modules))\n"
        "sys.exit(rc)\n"
    )
    argv = [sys.executable, "-c", code, "aiter", "plan", "--package-dir", str(tree.package),
            "--jit-dir", str(tree.jit), "--target", "gfx950:256", "--state-dir", str(tree.state),
            "--slots-dir", str(tree.slots)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert (2, "") == (proc.returncode, proc.stderr)
    assert "! slot bad unreadable, its environment is not checked: " in proc.stdout
    assert f"{BPS_CKTILE}: uncovered -> heal" in proc.stdout
    assert proc.stdout.rstrip().endswith("loaded: []")
