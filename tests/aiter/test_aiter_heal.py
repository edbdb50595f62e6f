"""Plan and heal on a real tree in tmp: committed tables, gcc-built modules, real renames."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from aiter_support import BPS, BPS_CK, BPS_CKTILE, OPUS
from structlog.testing import capture_logs

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import folder as qfs
from hal0_reconciler.aiter.quarantine import heal
from helpers import quarantines

pytestmark = pytest.mark.usefixtures("no_processes")


def _verdicts(report: monitor.MonitorReport) -> dict[str, tuple[str, str]]:
    (base,) = [p for p in report.plans if p.environment == "base"]
    return {m.module: (str(m.status), str(m.action)) for m in base.modules}


def _events(logs) -> list[str]:
    return [e["event"] for e in logs]


@pytest.fixture
def stale_tree(make_tree, built_modules):
    """ck module healthy, cktile module built from older tables (one name short)."""
    tree = make_tree()
    tree.install(BPS_CK, built_modules[BPS_CK])
    tree.install(BPS_CKTILE, built_modules["stale_cktile"])
    (tree.jit / "build" / "module_unrelated" / "blob").mkdir(parents=True)
    shutil.copyfile(built_modules[BPS_CK], tree.jit / "module_unrelated.so")
    return tree


def test_plan_gives_the_verdict_per_module(stale_tree):
    """Healthy ck is covered, stale cktile is uncovered and name-keyed (heal)."""
    report = monitor.AiterMonitor(stale_tree.settings()).check(heal=False)
    assert _verdicts(report) == {
        BPS_CK: ("covered", "none"),
        BPS_CKTILE: ("uncovered", "heal"),
        OPUS: ("not-built", "none"),  # the written bf16 table's opus rows
        "module_gemm_a8w8": ("not-built", "none"),  # shape-keyed, not built yet
    }
    (base,) = report.plans
    (cktile,) = [m for m in base.modules if m.module == BPS_CKTILE]
    assert len(cktile.missing) == 1
    assert all(r.table.name.endswith(".csv") and r.line > 1 for r in cktile.missing[0].refs)


def test_target_filtering_changes_the_verdict(make_tree, built_modules):
    """Modules built for gfx950:256 cover gfx950 rows only; for gfx942:80 the same tree is stale."""
    tree = make_tree()
    tree.install(BPS_CK, built_modules[BPS_CK])
    tree.install(BPS_CKTILE, built_modules[BPS_CKTILE])
    on950 = monitor.AiterMonitor(tree.settings(target="gfx950:256")).check(heal=False)
    on942 = monitor.AiterMonitor(tree.settings(target="gfx942:80")).check(heal=False)
    assert _verdicts(on950)[BPS_CK] == ("covered", "none")
    assert _verdicts(on942)[BPS_CK] == ("uncovered", "heal")


def test_heal_quarantines_exactly_the_stale_modules(stale_tree):
    """Only the stale module's .so and build/<module>/ move; every other file stays."""
    before = sorted(p.relative_to(stale_tree.jit) for p in stale_tree.jit.rglob("*"))
    with capture_logs() as logs:
        report = monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    (result,) = report.heals
    qdir = stale_tree.jit / heal.QUARANTINE_DIR / result.quarantine
    moved = {
        f"{BPS_CKTILE}.so",
        f"build/{BPS_CKTILE}",
        f"build/{BPS_CKTILE}/blob",
        f"build/{BPS_CKTILE}/blob/gen.cpp",
    }
    after = sorted(
        p.relative_to(stale_tree.jit)
        for p in stale_tree.jit.rglob("*")
        if heal.QUARANTINE_DIR not in p.parts
    )
    assert sorted(p for p in before if str(p) not in moved) == after
    assert (qdir / f"{BPS_CKTILE}.so").is_file()
    assert (qdir / "build" / BPS_CKTILE / "blob" / "gen.cpp").is_file()
    assert [e for e in _events(logs) if "quarantined" in e] == ["aiter.module_quarantined"]
    assert _verdicts(report)[BPS_CKTILE] == ("not-built", "none")  # re-planned after the heal


def test_failed_move_rolls_everything_back(make_tree, built_modules, monkeypatch):
    """The 2nd rename fails: the 1st is undone, nothing is lost, no quarantine is left behind."""
    tree = make_tree()
    tree.install(BPS_CK, built_modules["stale_ck"])
    tree.install(BPS_CKTILE, built_modules["stale_cktile"])
    before = {
        p.relative_to(tree.jit): p.read_bytes() if p.is_file() else None
        for p in tree.jit.rglob("*")
    }
    real_rename, moves = qfs.rename_noreplace, []

    def flaky(src_fd, src, dst_fd, dst):
        moves.append((os.readlink(f"/proc/self/fd/{src_fd}"), src))
        if len(moves) == 2:
            raise PermissionError(13, "Permission denied", dst)
        real_rename(src_fd, src, dst_fd, dst)

    monkeypatch.setattr(qfs, "rename_noreplace", flaky)
    with capture_logs() as logs:
        report = monitor.AiterMonitor(tree.settings()).check(heal=True)
    after = {
        p.relative_to(tree.jit): p.read_bytes() if p.is_file() else None
        for p in tree.jit.rglob("*")
        if heal.QUARANTINE_DIR not in p.parts
    }
    assert before == after
    assert heal.list_quarantines(tree.jit) == []
    assert [e for e in _events(logs) if e.startswith("aiter.heal")] == ["aiter.heal_failed"]
    assert "undone" in report.heals[0].error
    qroot = str(tree.jit / heal.QUARANTINE_DIR)
    out = [not where.startswith(qroot) for where, _ in moves]
    assert [True, True, False] == out  # two moves tried, one undone
    assert moves[0][1] == moves[2][1]  # the one that moved is the one put back


def test_convergence_guard_stops_a_second_heal(stale_tree, built_modules):
    """Rebuilt to the same stale registry with the same tables: ERROR once, no second quarantine."""
    mon = monitor.AiterMonitor(stale_tree.settings())
    first = mon.check(heal=True)
    stale_tree.install(BPS_CKTILE, built_modules["stale_cktile"])  # "aiter rebuilt it": still short
    with capture_logs() as logs:
        second = mon.check(heal=True)
        third = mon.check(heal=True)
    assert [first.heals[0].quarantine] == [q.name for q in heal.list_quarantines(stale_tree.jit)]
    assert (second.heals, third.heals) == ((), ())
    assert _verdicts(second)[BPS_CKTILE] == ("uncovered", "not-converging")
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["aiter.heal_not_converging"]
    assert second.not_converging


def test_guard_lifts_when_the_tables_change(stale_tree, built_modules):
    """A new table digest allows one more heal."""
    mon = monitor.AiterMonitor(stale_tree.settings())
    mon.check(heal=True)
    stale_tree.install(BPS_CKTILE, built_modules["stale_cktile"])
    table = stale_tree.configs / f"{BPS}.csv"
    table.write_bytes(table.read_bytes() + b"gfx950,256,1,1,1,ck,0,0,1.0,new_ck_kernel_x,0,0,0\n")
    report = mon.check(heal=True)
    assert {BPS_CK, BPS_CKTILE} == {m for h in report.heals for m in h.modules}


def test_heal_is_refused_while_aiter_holds_the_build_lock(stale_tree):
    """build/lock_module_<name> exists: nothing moves, retry later."""
    (stale_tree.jit / "build" / f"lock_{BPS_CKTILE}").touch()
    with capture_logs() as logs:
        report = monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    assert (stale_tree.jit / f"{BPS_CKTILE}.so").is_file()
    assert heal.list_quarantines(stale_tree.jit) == []
    assert "aiter.heal_refused_build_running" in _events(logs)
    assert (report.retry_soon, report.heal_pending) == (True, True)


def test_restore_puts_a_quarantine_back_and_holds_the_module(stale_tree, built_modules):
    """restore <id>: the old files return, the rebuilt ones are kept aside, no re-heal follows."""
    mon = monitor.AiterMonitor(stale_tree.settings())
    qid = mon.check(heal=True).heals[0].quarantine
    stale_tree.install(BPS_CKTILE, built_modules[BPS_CKTILE])  # the rebuild
    _, displaced = mon.restore(qid)
    assert (
        stale_tree.jit.joinpath(f"{BPS_CKTILE}.so").read_bytes()
        == built_modules["stale_cktile"].read_bytes()
    )
    assert displaced is not None
    assert (displaced.path / f"{BPS_CKTILE}.so").read_bytes() == built_modules[
        BPS_CKTILE
    ].read_bytes()
    assert not (stale_tree.jit / heal.QUARANTINE_DIR / qid).exists()
    report = mon.check(heal=True)
    assert (report.heals, _verdicts(report)[BPS_CKTILE]) == ((), ("uncovered", "held"))


def test_only_the_newest_quarantines_are_kept(stale_tree, built_modules):
    """keep_quarantines bounds the folder (oldest deleted first)."""
    for day in range(1, 5):
        quarantines.install(stale_tree.jit, f"module_old{day}", b"old")
        quarantines.heal_modules(stale_tree.jit, stale_tree.state, [f"module_old{day}"], day=day)
    monitor.AiterMonitor(stale_tree.settings(keep_quarantines=2)).check(heal=True)
    names = [q.name for q in heal.list_quarantines(stale_tree.jit)]
    assert names[:1] == ["20200104T000000Z"]
    assert len(names) == 2


DIRT = {
    "bom": b"\xef\xbb\xbfgfx,cu_num,libtype,kernelName\ngfx950,256,ck,dirty_only_kernel\n",
    "utf16": "gfx,cu_num,libtype,kernelName\ngfx950,256,ck,dirty_only_kernel\n".encode("utf-16"),
    "ragged": b"gfx,cu_num,libtype,kernelName\ngfx950,256,ck,dirty_only_kernel,extra\n",
    "overlong": b"gfx,cu_num,libtype,kernelName,x\ngfx950,256,ck,dirty_only_kernel,"
    + b"y" * 131_073
    + b"\n",
    "headeronly": b"M,N,K",
    "nonewline": b"gfx,cu_num,libtype,kernelName\ngfx950,256,ck,dirty_only_kernel",
}


def test_dirty_tables_each_give_one_event_and_the_check_goes_on(stale_tree):
    """Six dirty overlays: six table events, the verdicts are still computed; a rerun is quiet."""
    for label, data in DIRT.items():
        (stale_tree.configs / "model_configs" / f"{BPS}_{label}.csv").write_bytes(data)
    mon = monitor.AiterMonitor(stale_tree.settings())
    with capture_logs() as logs:
        report = mon.check(heal=False)
    table_events = [
        (e["event"], e["path"].rsplit("_", 1)[-1])
        for e in logs
        if e["event"].startswith("aiter.table_")
    ]
    assert sorted(
        [("aiter.table_quirks", f"{k}.csv") for k in DIRT if k != "headeronly"]
        + [("aiter.table_unreadable", "headeronly.csv")]
    ) == sorted(table_events)
    assert _verdicts(report)[BPS_CK] == (
        "uncovered",
        "heal",
    )  # dirty_only_kernel is named by dirty overlays
    with capture_logs() as quiet:
        mon.check(heal=False)
    assert quiet == []


@pytest.mark.timeout(30)
def test_slot_env_with_aiter_variable_is_its_own_environment(stale_tree, tmp_path):
    """A slot pinning its own table is checked apart from the base; broken slot files are skipped."""
    pinned = stale_tree.package / "pinned.csv"  # a slot's paths count only inside the tree
    pinned.write_text("gfx,cu_num,libtype,kernelName\ngfx950,256,ck,only_in_pinned\n")
    (stale_tree.slots / "s1.toml").write_text(
        f'[server]\nenv = {{ AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE = "{pinned}" }}\n'
    )
    (stale_tree.slots / "s2.toml").write_text('[server]\nenv = { OTHER = "1" }\n')
    (stale_tree.slots / "broken.toml").write_text("[server\n")
    os.mkfifo(stale_tree.slots / "fifo.toml")  # never opened: it would block a plain read
    with capture_logs() as logs:
        report = monitor.AiterMonitor(stale_tree.settings()).check(heal=False)
    assert [p.environment for p in report.plans] == ["base", "slot:s1"]
    slot = report.plans[1]
    assert {m.module: (str(m.status), str(m.action)) for m in slot.modules} == {
        BPS_CK: ("uncovered", "heal"),
        OPUS: ("not-built", "none"),
        "module_gemm_a8w8": ("not-built", "none"),
    }
    unreadable = [e for e in logs if e["event"] == "aiter.slot_unreadable"]
    assert ["broken", "fifo"] == sorted(str(e.get("slot")) for e in unreadable)


def test_mapped_processes_are_reported(stale_tree, monkeypatch):
    """A process holding the stale module keeps the old code: heal names it."""
    monkeypatch.undo()  # real process table for this test
    so = stale_tree.jit / f"{BPS_CKTILE}.so"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import ctypes,time; ctypes.CDLL({str(so)!r}); print(1, flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        report = monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    finally:
        proc.kill()
        proc.wait()
    holders = report.heals[0].still_mapped[str(so)]
    assert [f"pid {proc.pid} " in h for h in holders] == [True]


def test_quarantine_manifest_records_the_moves(stale_tree):
    """The manifest names each move, the missing kernels and the digest."""
    report = monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    qdir = stale_tree.jit / heal.QUARANTINE_DIR / report.heals[0].quarantine
    manifest = json.loads((qdir / heal.MANIFEST).read_text())
    assert list(manifest["modules"]) == [BPS_CKTILE]
    assert [f"{BPS_CKTILE}.so", f"build/{BPS_CKTILE}"] == manifest["entries"]
    assert isinstance(plan.Action.HEAL, str)


def test_restore_works_after_the_jit_folder_moved(stale_tree, built_modules):
    """Manifest paths are taken relative to the quarantine: a relocated JIT folder still restores."""
    qid = monitor.AiterMonitor(stale_tree.settings()).check(heal=True).heals[0].quarantine
    moved = stale_tree.jit.with_name("jit-moved")
    stale_tree.jit.rename(moved)
    restored, _ = heal.restore(moved, qid, book=quarantines.book_for(stale_tree.state))
    assert not restored.verified  # its digest names the old folder: restorable, never pruned
    assert (moved / f"{BPS_CKTILE}.so").read_bytes() == built_modules["stale_cktile"].read_bytes()
    assert (moved / "build" / BPS_CKTILE).is_dir()
    assert not (moved / heal.QUARANTINE_DIR / qid).exists()


def test_an_incomplete_quarantine_is_refused_and_kept(stale_tree):
    """If a quarantined file is gone, restore moves nothing and deletes nothing."""
    qid = monitor.AiterMonitor(stale_tree.settings()).check(heal=True).heals[0].quarantine
    qdir = stale_tree.jit / heal.QUARANTINE_DIR / qid
    shutil.rmtree(qdir / "build")
    with pytest.raises(heal.HealFailed, match="incomplete"):
        heal.restore(stale_tree.jit, qid, book=quarantines.book_for(stale_tree.state))
    assert (qdir / f"{BPS_CKTILE}.so").is_file()
    assert (qdir / heal.MANIFEST).is_file()
    assert not (stale_tree.jit / f"{BPS_CKTILE}.so").exists()


def test_a_manifest_naming_a_file_outside_the_jit_folder_is_refused(stale_tree, tmp_path):
    """A manifest can never move a file outside the JIT folder."""
    qid = monitor.AiterMonitor(stale_tree.settings()).check(heal=True).heals[0].quarantine
    manifest = stale_tree.jit / heal.QUARANTINE_DIR / qid / heal.MANIFEST
    doc = json.loads(manifest.read_text())
    doc["entries"][0] = "../elsewhere.so"
    manifest.write_text(json.dumps(doc))
    with pytest.raises(heal.HealFailed, match="unreadable manifest"):
        heal.restore(stale_tree.jit, qid, book=quarantines.book_for(stale_tree.state))
    assert not (stale_tree.jit.parent / "elsewhere.so").exists()
