"""What the tables ask of each module, kept on disk (``needs.json``): a check in a new process
with nothing changed reads no table, yet is exactly as right as a cold check after ANY change of
its inputs (a table edited, even keeping size and mtime; added; removed; a module rebuilt; the
routing, the merge keys, the target or the aiter version changed), and a damaged cache file
reads as empty and is rewritten."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiter_support import (
    BPS,
    BPS_CK,
    BPS_CKTILE,
    DATA_CONFIGS,
    GFX950,
    SoBuilder,
    Tree,
    csv_text,
    names_for,
)

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.rules import installed, routing
from hal0_reconciler.aiter.tables import cache as tablecache
from hal0_reconciler.aiter.tables import needs as needscache
from hal0_reconciler.settings import Settings

pytestmark = pytest.mark.usefixtures("no_processes")
VAR = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE"
E4048607 = "0.1.21.dev46+ge4048607a5"


@pytest.fixture(autouse=True)
def settled_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's last change counts as settled as soon as the clock moved past it."""
    monkeypatch.setattr(tablecache, "SETTLED_NS", 0)


def _settle() -> None:
    time.sleep(0.03)  # past the ctime tick of the last write


@pytest.fixture
def world(make_tree: Callable[..., Tree], built_modules: dict[str, Path]) -> Tree:
    """Committed tables plus a slower duplicate of a real shape (a merge loser), a stale ck
    module (names missing, with their rows) and a healthy cktile one."""
    tree = make_tree()
    default = tree.configs / f"{BPS}.csv"
    header, *lines = default.read_text().splitlines()
    cols = header.split(",")
    row = next(
        dict(zip(cols, line.split(","), strict=True))
        for line in lines
        if ",ck," in line and line.startswith("gfx950,256,")
    )
    row |= {"kernelName": "duplicate_shape_kernel_x", "us": str(float(row["us"]) + 50)}
    (tree.configs / "model_configs" / f"zz_dup_{BPS}.csv").write_text(
        csv_text(cols, [[row[c] for c in cols]])
    )
    tree.install(BPS_CK, built_modules["stale_ck"])
    tree.install(BPS_CKTILE, built_modules[BPS_CKTILE])
    _settle()
    return tree


def _view(report: monitor.MonitorReport, *, rows: bool = False) -> list[Any]:
    """Everything a plan says, the sources' rows too when ``rows``."""
    return [
        (
            p.environment,
            p.target,
            p.rules,
            p.problems,
            [
                (
                    str(s.file.path),
                    str(s.file.origin),
                    s.error,
                    None
                    if s.table is None
                    else (
                        s.table.digest,
                        s.table.data_rows,
                        s.table.other_target_rows,
                        s.table.uncompiled_rows,
                        s.table.quirks,
                        s.table.broken,
                        s.table.rows if rows else None,
                    ),
                )
                for s in p.sources
            ],
            p.modules,
        )
        for p in report.plans
    ]


def _check(settings: Settings) -> tuple[monitor.AiterMonitor, monitor.MonitorReport]:
    """A check in a new process (a new monitor: only the on-disk caches carry over)."""
    mon = monitor.AiterMonitor(settings)
    return mon, mon.check(heal=False)


def _cold(settings: Settings, tmp_path: Path) -> monitor.MonitorReport:
    """The same check with no cache at all."""
    fresh = tmp_path / f"cold-{time.monotonic_ns()}"
    return _check(dataclasses.replace(settings, state_dir=fresh))[1]


def _warm_state(settings: Settings) -> monitor.MonitorReport:
    """Checks until the caches hold this tree (the second one is served from them)."""
    _check(settings)
    mon, report = _check(settings)
    assert (0, 1) == (mon.surveyor.table_reads, mon.surveyor.needs_cache.hits)
    return report


def test_a_new_process_reads_no_table_and_decodes_no_row(world: Tree, tmp_path: Path) -> None:
    """With nothing changed, a check in a new process takes every environment's needs from
    needs.json: no table is parsed, tables.json is not read, no row is decoded; its verdicts,
    missing names with their rows, merge losers and problems are the cold check's."""
    settings = world.settings()
    _check(settings)
    (world.state / "aiter" / "tables.json").rename(tmp_path / "tables.json")
    mon, report = _check(settings)
    assert (0, 1) == (mon.surveyor.table_reads, mon.surveyor.needs_cache.hits)
    lazy = [s.table for p in report.plans for s in p.sources]
    assert lazy
    assert all(isinstance(t, tablecache.LazyTable) and not t.loaded for t in lazy)
    cold = _cold(settings, tmp_path)
    assert _view(cold) == _view(report)
    ck = next(m for m in report.plans[0].modules if m.module == BPS_CK)
    assert (3, 1) == (len(ck.missing), ck.merged_away), "the world is not what this test needs"
    assert all(m.refs for m in ck.missing)
    assert any("share a shape across the merged files" in p for p in report.plans[0].problems)


def test_the_rows_of_a_warm_check_are_read_when_looked_at(world: Tree, tmp_path: Path) -> None:
    """A warm check's tables give the very rows a cold check parsed (explain reads them): from
    tables.json, else from the file when its bytes are the same; a table changed since the
    check gives no rows rather than another version's."""
    settings = world.settings()
    _check(settings)
    cold = _cold(settings, tmp_path)
    _, warm = _check(settings)
    assert _view(cold, rows=True) == _view(warm, rows=True)
    (world.state / "aiter" / "tables.json").unlink()
    _, warm = _check(settings)
    assert _view(cold, rows=True) == _view(warm, rows=True)
    _, warm = _check(settings)
    default = world.configs / f"{BPS}.csv"
    default.write_text(default.read_text().replace("gfx950,256,", "gfx950,256,", 1) + "\n")
    changed = [s.table for s in warm.plans[0].sources if Path(s.file.path) == default]
    assert changed
    assert all(t is not None and () == t.rows for t in changed)


def _rename_a_needed_kernel(tree: Tree, *, keep_size_and_mtime: bool) -> None:
    """A ck gfx950 row names another kernel (same length: the file keeps its size)."""
    default = tree.configs / f"{BPS}.csv"
    before = default.stat()
    lines = default.read_text().splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if ",ck," in line and line.startswith("gfx950,"))
    cells = lines[i].split(",")
    name = cells[9]
    cells[9] = name[:-1] + ("Q" if name[-1] != "Q" else "R")
    lines[i] = ",".join(cells)
    if keep_size_and_mtime:
        with default.open("r+b") as fh:  # in place: same inode
            fh.write("".join(lines).encode())
        os.utime(default, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = default.stat()
        assert (before.st_ino, before.st_size, before.st_mtime_ns) == (
            after.st_ino,
            after.st_size,
            after.st_mtime_ns,
        )
    else:
        default.write_text("".join(lines))


def _add_table(tree: Tree) -> None:
    default = tree.configs / f"{BPS}.csv"
    header, first, *_ = default.read_text().splitlines()
    cols = header.split(",")
    row = dict(zip(cols, first.split(","), strict=True))
    row |= {"gfx": "gfx950", "cu_num": "256", "libtype": "ck", "M": "77777"}
    row |= {"kernelName": "a_kernel_only_the_new_table_names"}
    (tree.configs / "model_configs" / f"new_{BPS}.csv").write_text(
        csv_text(cols, [[row[c] for c in cols]])
    )


def _remove_table(tree: Tree) -> None:
    (tree.configs / "model_configs" / f"glm5_{BPS}.csv").unlink()


def _rebuild_module(tree: Tree, built: dict[str, Path]) -> None:
    tree.install(BPS_CK, built[BPS_CK])


def _merge_keys(tree: Tree) -> None:
    """aiter's merge keys come from the untuned table's header: with the kernel in them, the
    slower duplicate is no duplicate any more (and its kernel is needed)."""
    (tree.configs / f"{'untuned'.join(BPS.rsplit('tuned', 1))}.csv").write_text(
        "M,N,K,kernelName\n"
    )


def _upgrade_aiter(tree: Tree) -> None:
    tree.version(E4048607)


CHANGES: dict[str, Callable[[Tree, dict[str, Path]], None]] = {
    "row-edited": lambda t, _: _rename_a_needed_kernel(t, keep_size_and_mtime=False),
    "row-edited-keeping-size-and-mtime": lambda t, _: _rename_a_needed_kernel(
        t, keep_size_and_mtime=True
    ),
    "table-added": lambda t, _: _add_table(t),
    "table-removed": lambda t, _: _remove_table(t),
    "module-rebuilt": _rebuild_module,
    "merge-keys-changed": lambda t, _: _merge_keys(t),
    "aiter-upgraded": lambda t, _: _upgrade_aiter(t),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_any_changed_input_is_noticed_by_a_new_process(
    world: Tree,
    built_modules: dict[str, Path],
    tmp_path: Path,
    change: Callable[[Tree, dict[str, Path]], None],
) -> None:
    """After the change, a check in a new process with the caches of the old tree says exactly
    what a cold check says (and that differs from before: the change matters)."""
    settings = world.settings()
    before = _warm_state(settings)
    change(world, built_modules)
    _, warm = _check(settings)
    cold = _cold(settings, tmp_path)
    assert _view(before) != _view(cold), "the change changes nothing: a useless case"
    assert _view(cold, rows=True) == _view(warm, rows=True)
    _settle()  # and once the change settled, the caches serve it (still right)
    _check(settings)
    mon, again = _check(settings)
    assert (0, _view(cold)) == (mon.surveyor.table_reads, _view(again))


def _routing_with_ck_elsewhere(tmp_path: Path) -> Path:
    text = installed.shipped_text("routing.toml")
    assert f'ck = "{BPS_CK}"' in text
    path = tmp_path / "routing.toml"
    path.write_text(text.replace(f'ck = "{BPS_CK}"', 'ck = "module_somewhere_else"'))
    return path


def _kfd(root: Path, gfx_version: int, cus: int) -> Path:
    node = root / f"kfd-{gfx_version}-{cus}" / "1"
    node.mkdir(parents=True)
    (node / "properties").write_text(
        f"simd_count {cus * 4}\nsimd_per_cu 4\ngfx_target_version {gfx_version}\n"
    )
    return node.parent


def _live(tree: Tree, root: Path, gpu: tuple[int, int], archs: str) -> Settings:
    """A live GPU (KFD) and the GPU_ARCHS the build compiles for."""
    return tree.settings(target="auto", env={"GPU_ARCHS": archs}, kfd_topology_dir=_kfd(root, *gpu))


@pytest.mark.parametrize("what", ["routing", "target", "lookup-and-build-swapped"])
def test_changed_settings_are_noticed_by_a_new_process(
    world: Tree, tmp_path: Path, what: str
) -> None:
    """Other routing data, another target, or the live GPU and the build target swapped (the
    same rows are read, but which are looked up and which compiled changes): a new process
    with the old caches says what a cold check says."""
    gfx950, gfx942 = (90500, 256), (90402, 304)
    first = world.settings()
    if what == "lookup-and-build-swapped":
        first = _live(world, tmp_path, gfx950, "gfx942")
    before = _warm_state(first)
    settings = {
        "routing": lambda: world.settings(routing_file=_routing_with_ck_elsewhere(tmp_path)),
        "target": lambda: world.settings(target="gfx942:80"),
        "lookup-and-build-swapped": lambda: _live(world, tmp_path / "b", gfx942, "gfx950"),
    }[what]()
    _, warm = _check(settings)
    cold = _cold(settings, tmp_path)
    assert _view(before) != _view(cold)
    assert _view(cold, rows=True) == _view(warm, rows=True)


def _entries(tree: Tree) -> dict[str, Any]:
    doc = json.loads((tree.state / "aiter" / "needs.json").read_text())
    entries: dict[str, Any] = doc["entries"]
    return entries


def _first_entry(tree: Tree, edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        doc = json.loads(path.read_text())
        edit(next(iter(doc["entries"].values())))
        path.write_text(json.dumps(doc))

    return damage


def _first_refs(entry: dict[str, Any], text: str) -> None:
    names = next(iter(entry["needs"].values()))["names"]
    names[next(iter(names))] = text


DAMAGE: dict[str, Callable[[Tree], Callable[[Path], None]]] = {
    "not-json": lambda _: lambda p: p.write_text("{half"),
    "cut-short": lambda _: lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "other-format": lambda _: (
        lambda p: p.write_text(
            json.dumps({**json.loads(p.read_text()), "version": needscache.CACHE_VERSION + 1})
        )
    ),
    "other-package": lambda _: (
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "package": "0.0.0"}))
    ),
    "entry-empty": lambda t: _first_entry(t, lambda e: e.clear()),
    "refs-garbled": lambda t: _first_entry(t, lambda e: _first_refs(e, "1:x")),
    "refs-past-the-reads": lambda t: _first_entry(t, lambda e: _first_refs(e, "99999:2")),
    "source-past-the-reads": lambda t: _first_entry(
        t, lambda e: e["sources"].append([99999, "x", [0, 0, 0], [], []])
    ),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_or_foreign_cache_reads_as_empty_and_is_rewritten(
    world: Tree, tmp_path: Path, damage: Callable[[Tree], Callable[[Path], None]]
) -> None:
    """Nothing is taken from a damaged, other-format or other-version needs.json (or entry):
    the check derives the needs again, is right, and the file is written whole again."""
    settings = world.settings()
    _warm_state(settings)
    damage(world)(world.state / "aiter" / "needs.json")
    mon, report = _check(settings)
    assert (0, _view(_cold(settings, tmp_path))) == (mon.surveyor.needs_cache.hits, _view(report))
    again, _ = _check(settings)
    assert (0, 1) == (again.surveyor.table_reads, again.surveyor.needs_cache.hits)


def test_the_cache_is_bounded_and_holds_what_the_last_check_used(
    world: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One entry per distinct set of inputs (environments that read the same tables the same
    way share one), at most MAX_ENTRIES of them; the rest are derived again, still right; an
    entry the last check did not use is dropped."""
    monkeypatch.setattr(needscache, "MAX_ENTRIES", 2)
    overlays = sorted((world.configs / "model_configs").glob(f"*{BPS}*.csv"))
    for n, path in enumerate(overlays[:3]):
        (world.slots / f"pin{n}.toml").write_text(f'[server]\nenv = {{ {VAR} = "{path}" }}\n')
    (world.slots / "same.toml").write_text('[server]\nenv = { AITER_LOG_MORE = "1" }\n')
    settings = world.settings()
    _check(settings)
    assert 2 == len(_entries(world))
    _settle()
    mon, report = _check(settings)
    assert 5 == len(report.plans)
    # kept: the base's entry (the "same" slot's too) and the first pinned slot's
    assert (_view(_cold(settings, tmp_path)), 3) == (_view(report), mon.surveyor.needs_cache.hits)
    for slot in world.slots.iterdir():
        slot.unlink()
    _check(settings)
    assert 1 == len(_entries(world))


def test_a_table_changed_less_than_a_second_ago_gives_no_entry(
    world: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Needs derived from a table whose last change is too recent to rule out a rewrite in the
    same clock tick are not stored: the next process reads the tables again."""
    monkeypatch.setattr(tablecache, "SETTLED_NS", 3_600 * 10**9)
    shutil.rmtree(world.state, ignore_errors=True)
    first, _ = _check(world.settings())
    again, _ = _check(world.settings())
    assert first.surveyor.table_reads == again.surveyor.table_reads > 0
    assert 0 == again.surveyor.needs_cache.hits


def test_a_daemons_repeated_checks_keep_both_caches_whole(world: Tree, tmp_path: Path) -> None:
    """Checks in one process take tables and needs from memory (after a change, the unchanged
    tables too); what they used stays in the files, so a new process (a restart) still reads
    no table, from needs.json or, without it, from tables.json."""
    settings = world.settings()
    mon = monitor.AiterMonitor(settings)
    for _ in range(2):
        mon.check(heal=False)
    _add_table(world)
    _settle()
    mon.check(heal=False)  # the other tables from memory
    mon.check(heal=False)
    restarted, report = _check(settings)
    assert (0, 1) == (restarted.surveyor.table_reads, restarted.surveyor.needs_cache.hits)
    (world.state / "aiter" / "needs.json").unlink()
    restarted, report = _check(settings)
    assert (0, 0) == (restarted.surveyor.table_reads, restarted.surveyor.needs_cache.hits)
    assert _view(_cold(settings, tmp_path), rows=True) == _view(report, rows=True)


def test_a_module_rewritten_in_place_keeping_size_and_mtime_is_read_again(
    world: Tree, so_builder: SoBuilder, rules: routing.Routing, tmp_path: Path
) -> None:
    """A module whose bytes change while its inode, size and mtime stay (its ctime cannot):
    a new process reads it again and says what a cold check says."""
    names = sorted(names_for(DATA_CONFIGS, rules, GFX950)[BPS_CK])
    altered = [*names[:-1], names[-1][:-1] + ("Q" if names[-1][-1] != "Q" else "R")]
    short_one, whole = so_builder.build(altered), so_builder.build(names)
    assert short_one.stat().st_size == whole.stat().st_size
    so = world.install(BPS_CK, short_one)
    _settle()
    before = _warm_state(world.settings())
    was = so.stat()
    with so.open("r+b") as fh:
        fh.write(whole.read_bytes())
    os.utime(so, ns=(was.st_atime_ns, was.st_mtime_ns))
    now = so.stat()
    assert (was.st_ino, was.st_size, was.st_mtime_ns) == (now.st_ino, now.st_size, now.st_mtime_ns)
    _, warm = _check(world.settings())
    cold = _cold(world.settings(), tmp_path)
    assert _view(before) != _view(cold)
    assert _view(cold) == _view(warm)


def test_a_table_changed_less_than_a_second_ago_is_read_again_in_the_same_process(
    world: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's next check parses a table again while its last change is too recent to
    rule out a rewrite in the same clock tick (its stamp could not show it)."""
    monkeypatch.setattr(tablecache, "SETTLED_NS", 3_600 * 10**9)
    mon = monitor.AiterMonitor(world.settings())
    mon.check(heal=False)
    first = mon.surveyor.table_reads
    mon.check(heal=False)
    assert 2 * first == mon.surveyor.table_reads > 0


@pytest.mark.parametrize(
    "content",
    ['{"version": 0, "entries": {"k": 1}}', '{"version": 1, "entr'],
    ids=["foreign", "torn"],
)
def test_an_untrusted_cache_is_rewritten_even_with_nothing_to_store(
    world: Tree, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    """A needs.json of another format, or not JSON at all, is replaced by a valid (here empty)
    one at the next save, even when no entry could be stored (the tables are not settled)."""
    path = world.state / "aiter" / "needs.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    monkeypatch.setattr(tablecache, "SETTLED_NS", 3_600 * 10**9)
    _check(world.settings())
    doc = json.loads(path.read_text())
    assert (needscache.CACHE_VERSION, {}) == (doc["version"], doc["entries"])


def test_with_nothing_to_store_no_cache_file_is_made(
    world: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = world.state / "aiter" / "needs.json"
    monkeypatch.setattr(tablecache, "SETTLED_NS", 3_600 * 10**9)
    _check(world.settings())
    assert not path.exists()


def test_a_warm_check_with_nothing_changed_writes_no_cache_file(world: Tree) -> None:
    """Quiet when nothing changes: both cache files keep their inode and mtime."""
    settings = world.settings()
    _warm_state(settings)
    caches = [world.state / "aiter" / name for name in ("needs.json", "tables.json")]
    before = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in caches]
    mon, _ = _check(settings)
    assert 1 == mon.surveyor.needs_cache.hits
    assert before == [(p.stat().st_ino, p.stat().st_mtime_ns) for p in caches]


def test_a_merged_table_variable_naming_only_missing_files_is_checked(
    world: Tree, tmp_path: Path
) -> None:
    """A variable naming several files, none of which exists: nothing is read or merged for
    it, the plan says so, and a new process says the same."""
    settings = world.settings(env={VAR: f"{tmp_path}/gone-1.csv:{tmp_path}/gone-2.csv"})
    _check(settings)
    _settle()
    mon, report = _check(settings)
    assert any("gone-1.csv" in p for p in report.plans[0].problems)
    assert (0, _view(_cold(settings, tmp_path))) == (mon.surveyor.table_reads, _view(report))
