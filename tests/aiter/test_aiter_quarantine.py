"""Quarantine folders on a real tree: restore's refusals and its all-or-nothing undo, what a
restore leaves behind, which manifests are honoured (keyed digests in root's state), the journal
written before the first move, the fsyncs after the last, the heal memory's module identity, and
pruning."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from aiter_support import BPS_CK, BPS_CKTILE
from structlog.testing import capture_logs

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import folder as qfs
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.quarantine import journal as qj
from helpers import quarantines

pytestmark = pytest.mark.usefixtures("no_processes")


@pytest.fixture
def stale_tree(make_tree, built_modules):
    """ck module healthy, cktile module built from older tables (one name short)."""
    tree = make_tree()
    tree.install(BPS_CK, built_modules[BPS_CK])
    tree.install(BPS_CKTILE, built_modules["stale_cktile"])
    return tree


@pytest.fixture
def healed(stale_tree):
    """The stale module quarantined: (tree, quarantine id)."""
    qid = monitor.AiterMonitor(stale_tree.settings()).check(heal=True).heals[0].quarantine
    return stale_tree, qid


def _book(tree) -> manifest_digest.DigestBook:
    return quarantines.book_for(tree.state)


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _verdict(report: monitor.MonitorReport, module: str) -> tuple[str, str]:
    (base,) = [p for p in report.plans if p.environment == "base"]
    (mod,) = [m for m in base.modules if m.module == module]
    return (str(mod.status), str(mod.action))


@pytest.mark.parametrize("qid", ["../jit", "a/b", ".", "..", "", ".hidden", "20990101T000000Z"])
def test_restore_refuses_an_id_that_is_not_a_quarantine(healed, qid: str) -> None:
    """Only the name of an existing quarantine is restored; anything else (a path, a name
    that leaves the folder, an unknown id) is refused, naming the known ids, moving nothing."""
    tree, known = healed
    before = _files(tree.jit)
    with pytest.raises(heal.HealFailed, match=rf"no quarantine .*\(known: {known}\)"):
        heal.restore(tree.jit, qid, book=_book(tree))
    assert before == _files(tree.jit), "a refused restore moved files"


def test_restore_with_no_quarantine_says_none_are_known(stale_tree) -> None:
    """With no quarantine at all, the refusal says so."""
    with pytest.raises(heal.HealFailed, match=r"\(known: none\)"):
        heal.restore(stale_tree.jit, "20990101T000000Z", book=_book(stale_tree))


def test_an_incomplete_quarantine_is_refused_before_anything_moves(healed) -> None:
    """A quarantined file gone missing: refused up front with the missing path, nothing moved."""
    tree, qid = healed
    shutil.rmtree(tree.jit / heal.QUARANTINE_DIR / qid / "build")
    before = _files(tree.jit)
    with pytest.raises(heal.HealFailed, match=r"is incomplete \(missing: .*build"):
        heal.restore(tree.jit, qid, book=_book(tree))
    assert before == _files(tree.jit)


def test_a_restore_leaves_no_quarantine_folder_and_no_digest(healed) -> None:
    """After a restore its quarantine folder is gone entirely (nested build folders too), and
    so are its digests."""
    tree, qid = healed
    restored, _ = heal.restore(tree.jit, qid, book=_book(tree))
    assert (True, []) == (restored.verified, heal.list_quarantines(tree.jit))
    digests = json.loads((tree.state / "aiter" / manifest_digest.BOOK_FILE).read_text())
    assert {} == digests


def test_a_restore_that_fails_puts_the_displaced_files_back(
    healed, built_modules, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuilt module was set aside to make room, then moving the old one back failed:
    the rebuilt module returns to its place, the set-aside folder goes, the quarantine stays."""
    tree, qid = healed
    tree.install(BPS_CKTILE, built_modules[BPS_CKTILE])  # aiter rebuilt it
    before = _files(tree.jit)
    real = qfs.rename_noreplace
    qbuild = str(tree.jit / heal.QUARANTINE_DIR / qid / "build")

    def failing(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
        if os.readlink(f"/proc/self/fd/{src_fd}") == qbuild:
            raise OSError(errno.EIO, "Input/output error")
        real(src_fd, src, dst_fd, dst)

    monkeypatch.setattr(qfs, "rename_noreplace", failing)
    with pytest.raises(heal.HealFailed, match=r"Input/output error.*every move made was undone"):
        heal.restore(tree.jit, qid, book=_book(tree))
    assert before == _files(tree.jit), "a failed restore left files moved"
    assert (tree.jit / f"{BPS_CKTILE}.so").read_bytes() == built_modules[BPS_CKTILE].read_bytes()
    assert [qid] == [q.name for q in heal.list_quarantines(tree.jit)]


def test_a_quarantine_whose_manifest_cannot_be_written_moves_nothing(
    stale_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No journal or manifest, no move: the heal fails, every module stays, no folder is left."""

    def disk_full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    before = _files(stale_tree.jit)
    monkeypatch.setattr(qfs, "write_file", disk_full)
    report = monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    assert "nothing was moved" in (report.heals[0].error or "")
    assert before == _files(stale_tree.jit) - {heal.QUARANTINE_DIR}
    assert [] == heal.list_quarantines(stale_tree.jit), "an empty quarantine folder was left"


def test_the_journal_and_manifest_are_on_disk_before_the_first_move(
    stale_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the first rename of a heal, its journal (every planned move) and its signed manifest
    are already written."""
    seen: list[tuple[list[str], bool]] = []

    def at_rename(n: int) -> None:
        if n == 0:
            (qdir,) = heal.list_quarantines(stale_tree.jit)
            doc = json.loads((qdir / qj.JOURNAL).read_bytes())
            seen.append(([m["rel"] for m in doc["moves"]], (qdir / heal.MANIFEST).is_file()))

    monkeypatch.setattr(qfs, "rename_hook", at_rename)
    monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    assert [([f"{BPS_CKTILE}.so", f"build/{BPS_CKTILE}"], True)] == seen


def test_both_folders_are_fsynced_after_the_renames(
    stale_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the last rename of a heal, the JIT folder, its build folder, the quarantine and its
    build folder are each fsynced (a power cut then cannot undo a rename)."""
    events: list[object] = []
    real_rename, real_fsync = qfs.rename_noreplace, os.fsync

    def rename(*args: object) -> None:
        events.append("rename")
        real_rename(*args)  # type: ignore[arg-type]

    def fsync(fd: int) -> None:
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(qfs, "rename_noreplace", rename)
    monkeypatch.setattr(qfs.os, "fsync", fsync)
    qid = monitor.AiterMonitor(stale_tree.settings()).check(heal=True).heals[0].quarantine
    last = max(i for i, e in enumerate(events) if e == "rename")
    qdir = stale_tree.jit / heal.QUARANTINE_DIR / qid
    wanted = {str(stale_tree.jit), str(stale_tree.jit / "build"), str(qdir), str(qdir / "build")}
    assert wanted <= set(events[last + 1 :])


def test_the_key_and_the_digests_are_private_to_root(healed) -> None:
    """The key is 32 random bytes, 0600; the digest file is 0600 (both in root's state folder)."""
    tree, _ = healed
    key = tree.state / "aiter" / manifest_digest.KEY_FILE
    digests = tree.state / "aiter" / manifest_digest.BOOK_FILE
    modes = [stat.S_IMODE(p.stat().st_mode) for p in (key, digests)]
    assert (32, [0o600, 0o600]) == (len(key.read_bytes()), modes)


def test_an_edited_manifest_is_unverified_restorable_and_never_pruned(healed) -> None:
    """A manifest whose bytes changed after this daemon wrote it is unverified: still listed and
    restorable, never pruned."""
    tree, qid = healed
    manifest = tree.jit / heal.QUARANTINE_DIR / qid / heal.MANIFEST
    manifest.write_bytes(manifest.read_bytes().replace(b'"heal"', b'"heal" '))
    pruned = heal.prune(tree.jit, keep=0, book=_book(tree))
    assert ((), qid) == (pruned.removed, pruned.kept[0][0])
    assert "unverified" in pruned.kept[0][1]
    restored, _ = heal.restore(tree.jit, qid, book=_book(tree))
    assert (False, True) == (restored.verified, (tree.jit / f"{BPS_CKTILE}.so").is_file())


def test_a_copy_under_the_same_id_is_unverified(healed) -> None:
    """The real quarantine renamed away and a byte-identical copy put under its id: the copy is
    another folder, so its manifest is unverified (never pruned)."""
    tree, qid = healed
    qdir = tree.jit / heal.QUARANTINE_DIR / qid
    qdir.rename(qdir.with_name(".moved-away"))
    shutil.copytree(qdir.with_name(".moved-away"), qdir, symlinks=True)
    pruned = heal.prune(tree.jit, keep=0, book=_book(tree))
    assert ((), [qid]) == (pruned.removed, [k for k, _ in pruned.kept])


def test_a_010_quarantine_is_listed_restorable_and_never_pruned(stale_tree) -> None:
    """A 0.1.0 quarantine (absolute paths, no digest): listed, restorable, never pruned."""
    jit = stale_tree.jit
    qdir = jit / heal.QUARANTINE_DIR / "20200101T000000Z"
    (qdir / "build").mkdir(parents=True, mode=0o755)
    (qdir / "module_old.so").write_bytes(b"old")
    (qdir / "build" / "module_old").mkdir()
    moves = [
        {"src": str(jit / rel), "dst": str(qdir / rel)}
        for rel in ("module_old.so", "build/module_old")
    ]
    doc = {"id": qdir.name, "jit_dir": str(jit), "moves": moves, "modules": {"module_old": {}}}
    (qdir / heal.MANIFEST).write_text(json.dumps(doc))
    assert [qdir] == heal.list_quarantines(jit)
    assert () == heal.prune(jit, keep=0, book=_book(stale_tree)).removed
    restored, displaced = heal.restore(jit, qdir.name, book=_book(stale_tree))
    assert (False, None, b"old") == (
        restored.verified,
        displaced,
        (jit / "module_old.so").read_bytes(),
    )


def test_prune_removes_only_verified_whole_quarantines_beyond_keep(stale_tree) -> None:
    """prune deletes the oldest beyond ``keep`` that this daemon wrote and that hold every module
    they list; one missing a module, one with an unfinished journal and a bare folder stay."""
    jit, names = stale_tree.jit, []
    for day in range(1, 6):
        quarantines.install(jit, f"module_m{day}", b"m")
        names.append(
            quarantines.heal_modules(jit, stale_tree.state, [f"module_m{day}"], day=day).id
        )
    (jit / heal.QUARANTINE_DIR / names[1] / "module_m2.so").unlink()
    (jit / heal.QUARANTINE_DIR / names[2] / qj.JOURNAL).write_text("{}")
    (jit / heal.QUARANTINE_DIR / "20190101T000000Z").mkdir()
    pruned = heal.prune(jit, keep=2, book=_book(stale_tree))
    assert (names[0],) == pruned.removed
    reasons = dict(pruned.kept)
    assert ["20190101T000000Z", names[1], names[2]] == sorted(reasons)
    assert "missing: module_m2.so" in reasons[names[1]]
    assert "unfinished" in reasons[names[2]]
    assert "unverified" in reasons["20190101T000000Z"]
    book = json.loads((_book(stale_tree).state_dir / manifest_digest.BOOK_FILE).read_text())
    held = {qid for quarantines_of in book.values() for qid in quarantines_of}
    assert (False, True) == (names[0] in held, set(names[1:]) <= held), "a pruned one is forgotten"


def test_prune_without_quarantines_removes_and_keeps_nothing(stale_tree) -> None:
    pruned = heal.prune(stale_tree.jit, keep=0, book=_book(stale_tree))
    assert ((), ()) == (pruned.removed, pruned.kept)


def test_a_quarantine_whose_manifest_cannot_be_read_is_kept_with_why(stale_tree) -> None:
    """A manifest that is a link (or a FIFO, or too large) cannot be judged: never pruned."""
    jit = stale_tree.jit
    quarantines.install(jit, "module_m1", b"m")
    qid = quarantines.heal_modules(jit, stale_tree.state, ["module_m1"], day=1).id
    manifest = jit / heal.QUARANTINE_DIR / qid / heal.MANIFEST
    manifest.rename(manifest.with_name("elsewhere.json"))
    manifest.symlink_to("elsewhere.json")
    pruned = heal.prune(jit, keep=0, book=_book(stale_tree))
    assert ((), [qid]) == (pruned.removed, [k for k, _ in pruned.kept])
    assert pruned.kept[0][1].startswith("cannot be judged: ")
    assert (jit / heal.QUARANTINE_DIR / qid).is_dir()


def test_only_real_visible_folders_are_quarantines(stale_tree) -> None:
    """Hidden entries, stray files and links in .hal0-quarantine are not quarantines."""
    root = stale_tree.jit / heal.QUARANTINE_DIR
    (root / "20200101T000000Z").mkdir(parents=True)
    (root / ".tmp-folder").mkdir()
    (root / "notes.txt").write_text("x")
    (root / "20200102T000000Z").symlink_to(stale_tree.root)
    assert ["20200101T000000Z"] == [q.name for q in heal.list_quarantines(stale_tree.jit)]


def test_the_old_module_back_after_a_power_cut_is_healed_again(healed) -> None:
    """The very file quarantined back in place (same device, inode, size, mtime: a rename a
    power cut undid) is not 'not converging': it is healed again."""
    tree, qid = healed
    memory = heal.load_memory(tree.state / "aiter" / "heal-memory.json")
    assert {qid} == {e.quarantine for e in memory.values()}
    qdir = tree.jit / heal.QUARANTINE_DIR / qid
    for rel in (f"{BPS_CKTILE}.so", f"build/{BPS_CKTILE}"):
        os.rename(qdir / rel, tree.jit / rel)  # the renames the power cut lost
    shutil.rmtree(qdir)
    report = monitor.AiterMonitor(tree.settings()).check(heal=False)
    assert ("uncovered", str(plan.Action.HEAL)) == _verdict(report, BPS_CKTILE)


def test_a_rebuild_that_still_lacks_the_kernels_is_not_converging(healed, built_modules) -> None:
    """A new file (another inode) with the same gaps after a heal: not converging, as before."""
    tree, _ = healed
    tree.install(BPS_CKTILE, built_modules["stale_cktile"])
    report = monitor.AiterMonitor(tree.settings()).check(heal=False)
    assert ("uncovered", str(plan.Action.STUCK)) == _verdict(report, BPS_CKTILE)


def test_the_heal_memory_survives_a_round_trip_with_identities(tmp_path: Path) -> None:
    """The heal memory keeps each module's (device, inode, size, mtime_ns); a 0.1.0 entry
    without one reads as None."""
    path = tmp_path / "heal-memory.json"
    entry = plan.MemoryEntry("d", frozenset({"k"}), "healed", "q", (1, 2, 3, 4))
    heal.save_memory(path, {"/jit/module_x.so": entry})
    doc = json.loads(path.read_text())
    doc["/jit/module_y.so"] = {"digest": "d", "missing": [], "kind": "healed", "quarantine": "q"}
    path.write_text(json.dumps(doc))
    loaded = heal.load_memory(path)
    assert ((1, 2, 3, 4), None) == (
        loaded["/jit/module_x.so"].identity,
        loaded["/jit/module_y.so"].identity,
    )


class _Killed(BaseException):
    """Stops an operation where a SIGKILL would: nothing after it runs, no undo."""


def test_a_heal_stopped_between_renames_is_rolled_forward_by_the_next_and_said(
    stale_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heal stopped after its first rename (the manifest complete): the next heal (the
    daemon's first pass too) finishes it, logs that it rolled forward, and the module is whole
    in the quarantine."""

    def stop(n: int) -> None:
        if n == 1:
            raise _Killed

    monkeypatch.setattr(qfs, "rename_hook", stop)
    with pytest.raises(_Killed):
        monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    monkeypatch.setattr(qfs, "rename_hook", None)
    with capture_logs() as logs:
        monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    events = [e["event"] for e in logs]
    (qdir,) = heal.list_quarantines(stale_tree.jit)
    whole = [(qdir / f"{BPS_CKTILE}.so").is_file(), (qdir / "build" / BPS_CKTILE).is_dir()]
    assert (["aiter.interrupted_rolled_forward"], [True, True], False) == (
        [e for e in events if e.startswith("aiter.interrupted")],
        whole,
        (stale_tree.jit / f"{BPS_CKTILE}.so").exists(),
    )


def test_a_heal_stopped_before_its_manifest_is_rolled_back_by_the_next_and_said(
    stale_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heal stopped after its journal, before its manifest: the next heal undoes it (nothing
    had moved; its folder goes), says it rolled back, and then heals afresh."""
    real = qfs.write_file

    def stop(dir_fd: int, name: str, data: bytes, **kw: int) -> None:
        if name == heal.MANIFEST:
            raise _Killed
        real(dir_fd, name, data, **kw)

    monkeypatch.setattr(qfs, "write_file", stop)
    with pytest.raises(_Killed):
        monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    monkeypatch.setattr(qfs, "write_file", real)
    with capture_logs() as logs:
        report = monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    events = [e["event"] for e in logs]
    after = [q.name for q in heal.list_quarantines(stale_tree.jit)]
    assert ["aiter.interrupted_rolled_back"] == [e for e in events if e.startswith("aiter.interr")]
    (qdir,) = heal.list_quarantines(stale_tree.jit)
    assert ([report.heals[0].quarantine], True) == (
        after,
        (qdir / f"{BPS_CKTILE}.so").is_file(),
    )


def test_one_operation_at_a_time_across_processes(tmp_path: Path) -> None:
    """While another process holds the quarantine lock in root's state, a heal or restore waits
    its bound, then fails saying so (nothing done)."""
    book = quarantines.book_for(tmp_path)
    with book.locked():
        pass  # makes the lock file
    lock = tmp_path / "aiter" / manifest_digest.LOCK_FILE
    code = (
        "import fcntl, sys, time\n"
        f"f = open({str(lock)!r}, 'r+'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert b"held\n" == holder.stdout.readline()
        with pytest.raises(heal.HealFailed, match="another heal or restore"), book.locked(wait=0.2):
            pass
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with book.locked(wait=5):
        pass


def test_a_build_folder_a_restore_makes_belongs_to_the_tree_owner(tmp_path: Path) -> None:
    """A restore into a JIT folder whose ``build`` folder is gone makes it owned by the JIT
    folder's owner (aiter, running as that user, must still write its builds there)."""
    jit = tmp_path / "jit"
    quarantines.install(jit, "module_x", b"x")
    q = quarantines.heal_modules(jit, tmp_path / "state", ["module_x"])
    (jit / "build").rmdir()
    os.chown(jit, 65534, 65534)
    heal.restore(jit, q.id, book=quarantines.book_for(tmp_path / "state"))
    st = (jit / "build").stat()
    assert ((65534, 65534), b"x") == ((st.st_uid, st.st_gid), (jit / "module_x.so").read_bytes())


def test_a_journal_this_daemon_did_not_write_is_left_alone_and_said(
    stale_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heal stopped mid-way whose journal was then changed: the next heal neither finishes nor
    undoes it (it moves nothing of that quarantine), and says so once."""

    def stop(n: int) -> None:
        if n == 1:
            raise _Killed

    monkeypatch.setattr(qfs, "rename_hook", stop)
    with pytest.raises(_Killed):
        monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    monkeypatch.setattr(qfs, "rename_hook", None)
    (qdir,) = heal.list_quarantines(stale_tree.jit)
    journal = qdir / qj.JOURNAL
    journal.write_bytes(journal.read_bytes() + b" ")
    before = quarantines.snapshot(qdir)
    mon = monitor.AiterMonitor(stale_tree.settings())
    with capture_logs() as logs:
        mon.check(heal=True)
        mon.check(heal=True)
    said = [e["event"] for e in logs if e["event"].startswith("aiter.interrupted")]
    assert (["aiter.interrupted_left_alone"], before) == (said, quarantines.snapshot(qdir))


def test_prune_stops_at_a_mount_inside_a_quarantine_and_keeps_it(stale_tree) -> None:
    """A filesystem mounted inside the oldest quarantine: pruning does not cross into it (its
    files stay), keeps that quarantine with the reason, and prunes the next one as usual."""
    jit, names = stale_tree.jit, []
    for day in range(1, 4):
        quarantines.install(jit, f"module_m{day}", b"m")
        names.append(
            quarantines.heal_modules(jit, stale_tree.state, [f"module_m{day}"], day=day).id
        )
    mount_point = jit / heal.QUARANTINE_DIR / names[0] / "mnt"
    mount_point.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)]
    if subprocess.run(mount, capture_output=True, timeout=30, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN)")
    try:
        (mount_point / "other-filesystem").write_bytes(b"kept")
        pruned = heal.prune(jit, keep=1, book=_book(stale_tree))
        assert (names[1],) == pruned.removed
        reasons = dict(pruned.kept)
        assert "another filesystem is mounted" in reasons[names[0]], reasons
        assert b"kept" == (mount_point / "other-filesystem").read_bytes()
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30, check=False)


@pytest.mark.parametrize("change", ["mode", "owner"])
def test_a_key_others_could_read_or_own_is_refused(tmp_path: Path, change: str) -> None:
    """The signing key must be private to root: one readable by others (0644) or owned by
    another user is refused, never used to sign or check a manifest (a tree's owner who could
    read it could forge journals that look written by the daemon)."""
    manifest_digest.DigestBook(tmp_path).record("/jit", "q1", "manifest", b"m", (1, 2))
    key = tmp_path / manifest_digest.KEY_FILE
    if change == "mode":
        key.chmod(0o644)
    else:
        os.chown(key, 65534, -1)
    fresh = manifest_digest.DigestBook(tmp_path)
    with pytest.raises(manifest_digest.DigestUnavailable, match="not private"):
        fresh.record("/jit", "q2", "manifest", b"m", (1, 2))
    assert not fresh.verify("/jit", "q1", "manifest", b"m", (1, 2))
