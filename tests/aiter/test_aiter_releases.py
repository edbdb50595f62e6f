"""`aiter plan --json` on each release's real shipped tables, per scenario, as that release's code
reaches them (the tables are read from ../shared/fixtures; every module is built from them)."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from aiter_support import BPS, BPS_CK, SoBuilder, Tree

from hal0_reconciler.aiter import cli, monitor
from hal0_reconciler.aiter.rules import routing
from helpers.hosts import SHARED

pytestmark = pytest.mark.usefixtures("no_processes")

RELEASES = {
    "v0.1.9": "0.1.9",
    "v0.1.13": "0.1.13",
    "v0.1.16": "0.1.16",
    "e4048607": "0.1.21.dev46+ge4048607a5",
}
TARGET = ("gfx950", 256)
VAR = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE"
NAME_KEYED = {"v0.1.16", "e4048607"}  # name-keyed modules from v0.1.15 (aiter #3075)
FIRST_PATH_UNCHECKED = {"v0.1.9"}  # v0.1.7-v0.1.11 read a ':'-list's first path unchecked
EMPTY_FAILS = {"v0.1.9"}  # v0.1.7-v0.1.11 read '' for AITER_CONFIG_X=


def _configs(release: str) -> Path:
    path = SHARED / "fixtures" / "aiter" / release / "aiter" / "configs"
    if not path.is_dir():
        pytest.skip(f"real aiter {release} tables not present at {path} (../shared/fixtures)")
    return path


def _run(tree: Tree, *argv: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["aiter", "plan", "--json", *argv])
    out = io.StringIO()
    code = cli.main(args, tree.settings(env=env), out=out)
    return code, json.loads(out.getvalue())


def _shape_entries(
    files: list[Path], route: routing.TableRoute, module: str
) -> list[tuple[tuple[str, ...], str]]:
    """The lookup entries a release's generator writes for ``module`` from ``files`` (rows for
    the target, of the libtypes routed to it)."""
    entries = []
    for path in files:
        try:
            rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        for r in rows:
            name = (r.get("kernelName") or "").strip()
            if route.module_for(r.get("libtype"), name) != module:
                continue
            if r.get("gfx", TARGET[0]) != TARGET[0] or r.get("cu_num") != str(TARGET[1]):
                continue
            dims = [r[c] for c in ("B", "M", "N", "K") if r.get(c)]
            entries.append(((TARGET[0], str(TARGET[1]), *dims), name))
    return entries


@pytest.fixture(params=list(RELEASES))
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_BUILT: dict[str, dict[str, Path]] = {}
"""Per release, the module files built from its tables (once per test process)."""


def _built_modules(
    release: str, tree: Tree, so_builder: SoBuilder, shape_builder: Any
) -> dict[str, Path]:
    if release in _BUILT:
        return _BUILT[release]
    report = monitor.AiterMonitor(tree.settings()).check(heal=False)
    (base,) = report.plans
    built: dict[str, Path] = {}
    for mod in base.modules:
        srcs = [s for s in base.sources if mod.module in s.route.modules.values()]
        if mod.keyed is routing.Keyed.NAME:
            names = {
                r.name
                for s in srcs
                if s.table is not None
                for r in s.table.rows
                if r.module == mod.module
            }
            built[mod.module] = so_builder.build(sorted(names))
        elif mod.keyed is routing.Keyed.SHAPE:
            entries = [
                e for s in srcs for e in _shape_entries([Path(s.file.path)], s.route, mod.module)
            ]
            built[mod.module] = shape_builder.build(entries)
        else:  # id-keyed (opus): nothing in the file to build from or read back
            built[mod.module] = so_builder.build(["hal0_opus_placeholder"])
    _BUILT[release] = built
    return built


@pytest.fixture
def pristine(release: str, tmp_path: Path, so_builder: SoBuilder, shape_builder: Any) -> Tree:
    """A release's real tables with every module built from them, as that release builds it:
    name-keyed modules with their names, shape-keyed ones with their shape map."""
    tree = Tree(tmp_path / "tree", _configs(release))
    tree.version(RELEASES[release])
    for module, so in _built_modules(release, tree, so_builder, shape_builder).items():
        tree.install(module, so)
    return tree


def _verdicts(doc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    (plan,) = doc["plans"]
    return {m["module"]: (m["status"], m["action"]) for m in plan["modules"]}


def test_a_pristine_install_of_each_release_has_nothing_to_do(pristine: Tree, release: str):
    """Every module built from its own tables: exit 0, no fatal boot, no problem (no warning),
    nothing uncovered; name-keyed modules covered, shape-keyed ones not verifiable."""
    code, doc = _run(pristine)
    (plan,) = doc["plans"]
    assert (0, [], []) == (code, plan["fatal"], list(plan["problems"]))
    verdicts = _verdicts(doc)
    assert {"covered", "unverifiable"} >= {s for s, _ in verdicts.values()}
    assert {"none"} == {a for _, a in verdicts.values()}
    keyed = {m["module"]: m["keyed"] for m in plan["modules"]}
    assert (release in NAME_KEYED) == ("name" in keyed.values())
    assert RELEASES[release] in plan["rules"]
    if release in NAME_KEYED:
        assert ("covered", "none") == verdicts[BPS_CK]
    assert "module_gemm_a8w8" not in {m["module"] for m in plan["modules"] if m["broken"]}


def _scenario(tree: Tree, configs: Path, case: str) -> dict[str, str]:
    """The environment for ``case`` (changing the tree where the case needs it)."""
    default = tree.configs / f"{BPS}.csv"
    overlay_dir = tree.configs / "model_configs"
    if case == "set":
        return {VAR: str(default)}
    if case == "list":
        extra = tree.root / "extra.csv"
        extra.write_text(default.read_text().splitlines()[0] + "\n")  # header only
        return {VAR: f"{default}:{extra}"}
    if case == "empty":
        return {VAR: ""}
    if case == "whitespace":
        return {VAR: "  "}
    if case == "missing":
        return {VAR: str(tree.root / "nope.csv")}
    if case == "missing-first":
        return {VAR: f"{tree.root / 'nope.csv'}:{default}"}
    if case == "overlay-not-csv":
        (overlay_dir / f"zz_{BPS}.bak").write_text(default.read_text())
        return {}
    if case == "other-target":
        lines = default.read_text().splitlines(keepends=True)
        head = lines[0].rstrip("\n").split(",")
        row = dict(zip(head, lines[1].rstrip("\n").split(","), strict=False))
        row |= {"cu_num": "80", "kernelName": "hal0_other_target_only_kernel"}
        row |= {"gfx": "gfx942"} if "gfx" in row else {}
        row |= {"libtype": "ck"} if "libtype" in row else {}
        default.write_text("".join(lines) + ",".join(row[c] for c in head) + "\n")
        return {}
    raise AssertionError(case)


# case -> (exit code, fatal) per release group; "*" for every release
SCENARIOS: dict[str, dict[str, tuple[int, bool]]] = {
    "set": {"*": (0, False)},
    "list": {"*": (0, False)},
    "empty": {"v0.1.9": (1, True), "*": (0, False)},
    "whitespace": {"*": (1, True)},
    "missing": {"*": (1, True)},
    "missing-first": {"v0.1.9": (1, True), "*": (0, False)},
    "overlay-not-csv": {"*": (0, False)},
    "other-target": {"*": (0, False)},
}


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_each_scenario_gets_its_release_s_verdict(pristine: Tree, release: str, case: str):
    """unset/set/`:`-list/`X=`/whitespace/missing path/missing first path/an overlay glob/a row
    for another target: the exit code and whether the boot dies, as each release's code does
    it; a fatal verdict names the variable."""
    env = _scenario(pristine, _configs(release), case)
    code, doc = _run(pristine, env=env)
    (plan,) = doc["plans"]
    want = SCENARIOS[case].get(release, SCENARIOS[case]["*"])
    assert want == (code, bool(plan["fatal"]))
    if plan["fatal"]:
        assert all(VAR in f for f in plan["fatal"])
    assert () == tuple(h for h in doc["heals"])
    if case == "overlay-not-csv":  # `*<stem>*` up to v0.1.12, `*<stem>*.csv` from v0.1.13
        loaded = {
            Path(f["path"]).name
            for r in plan["resolutions"]
            if r["route"]["stem"] == BPS
            for f in r["files"]
        }
        assert (release == "v0.1.9") == (f"zz_{BPS}.bak" in loaded)


def _drop_a_name(tree: Tree, so_builder: SoBuilder, release: str) -> str:
    """Rebuild the blockscale-bpreshuffle ck module without one of its names; that name."""
    (base,) = monitor.AiterMonitor(tree.settings()).check(heal=False).plans
    names = sorted(
        {
            r.name
            for s in base.sources
            if s.table is not None and BPS_CK in s.route.modules.values()
            for r in s.table.rows
            if r.module == BPS_CK
        }
    )
    tree.install(BPS_CK, so_builder.build(names[1:]))
    return names[0]


def test_a_missing_kernel_heals_only_a_name_keyed_module(
    pristine: Tree, release: str, so_builder: SoBuilder
):
    """One kernel missing from the blockscale-bpreshuffle ck module: from v0.1.15 (name-keyed)
    a heal is pending (exit 2); before, the module is shape-keyed: not verifiable, exit 0."""
    missing = _drop_a_name(pristine, so_builder, release)
    code, doc = _run(pristine)
    if release in NAME_KEYED:
        assert (2, ("uncovered", "heal")) == (code, _verdicts(doc)[BPS_CK])
        (plan,) = doc["plans"]
        (mod,) = [m for m in plan["modules"] if m["module"] == BPS_CK]
        assert [missing] == [m["name"] for m in mod["missing"]]
    else:
        assert (0, ("unverifiable", "none")) == (code, _verdicts(doc)[BPS_CK])


def test_a_broken_row_and_a_missing_kernel_is_fix_tables(
    pristine: Tree, release: str, so_builder: SoBuilder
):
    """A missing kernel plus a ck row whose kernelName is empty: from v0.1.15 the code generator
    raises on 'nan', so the verdict is fix-tables (exit 1, never a heal); before, the empty name
    was not fatal and the module is shape-keyed (exit 0)."""
    _drop_a_name(pristine, so_builder, release)
    default = pristine.configs / f"{BPS}.csv"
    lines = default.read_text().splitlines(keepends=True)
    head = lines[0].rstrip("\n").split(",")
    col = head.index("kernelName")
    lib = head.index("libtype") if "libtype" in head else None
    n = next(
        i
        for i, t in enumerate(lines[1:], 1)
        if (lib is None or t.split(",")[lib] == "ck") and ",256," in f",{t}"
    )
    fields = lines[n].rstrip("\n").split(",")
    fields[col] = ""
    lines[n] = ",".join(fields) + "\n"
    default.write_text("".join(lines))
    code, doc = _run(pristine)
    if release in NAME_KEYED:
        assert (1, ("uncovered", "fix-tables")) == (code, _verdicts(doc)[BPS_CK])
        (plan,) = doc["plans"]
        (mod,) = [m for m in plan["modules"] if m["module"] == BPS_CK]
        assert [(str(default), n + 1)] == [(b["table"], b["line"]) for b in mod["broken"]]
    else:
        assert (0, ("unverifiable", "none")) == (code, _verdicts(doc)[BPS_CK])
    assert [] == doc["heals"]


def test_a_shape_twice_in_a_pinned_file_is_fix_tables(pristine: Tree, release: str):
    """The default pinned alone with one of its rows repeated (another `us`): loaded unmerged,
    aiter's lookup raises 'index must be unique' on every boot: fix-tables, exit 1, in every
    release."""
    default = pristine.configs / f"{BPS}.csv"
    pinned = pristine.root / "pinned.csv"
    lines = default.read_text().splitlines(keepends=True)
    head = lines[0].rstrip("\n").split(",")
    n = next(i for i, t in enumerate(lines[1:], 1) if ",256," in f",{t}")
    fields = lines[n].rstrip("\n").split(",")
    fields[head.index("us")] = "999.5"
    pinned.write_text("".join([*lines, ",".join(fields) + "\n"]))
    code, doc = _run(pristine, env={VAR: str(pinned)})
    (plan,) = doc["plans"]
    broken = [(m["module"], b["line"]) for m in plan["modules"] for b in m["broken"]]
    assert 1 == code
    assert broken
    assert {len(lines) + 1} == {line for _, line in broken}
    assert [] == doc["heals"]


def test_the_rule_set_and_routing_follow_the_release(pristine: Tree, release: str):
    """`aiter plan` names the release's version, the rule set and the routing it followed."""
    _, doc = _run(pristine)
    (plan,) = doc["plans"]
    expected = {
        "v0.1.9": ("v0.1.7-v0.1.11", "v0.1.6-v0.1.14"),
        "v0.1.13": ("v0.1.13-v0.1.14", "v0.1.6-v0.1.14"),
        "v0.1.16": ("v0.1.15-e4048607", "e4048607"),
        "e4048607": ("v0.1.15-e4048607", "e4048607"),
    }[release]
    assert f"rules {expected[0]} (chosen by version {RELEASES[release]})" in plan["rules"]
    assert plan["rules"].endswith(f"routing {expected[1]}")


def test_a_release_without_shared_fixtures_is_skipped_with_the_reason():
    """A missing release folder skips, naming where the tables were looked for."""
    with pytest.raises(pytest.skip.Exception, match="not present at"):
        _configs("v0.0.0-not-a-release")
