"""Quarantine folders on a real tree: restore's refusals and its all-or-nothing undo, what a
restore leaves behind, which folders are quarantines, and pruning."""

from __future__ import annotations

import errno
import os
import shutil

import pytest
from aiter_support import BPS_CK, BPS_CKTILE

from hal0_reconciler import fsio
from hal0_reconciler.aiter import heal, monitor

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


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("qid", ["../jit", "a/b", ".", "..", "", "20990101T000000Z"])
def test_restore_refuses_an_id_that_is_not_a_quarantine(healed, qid: str) -> None:
    """Only the name of an existing quarantine is restored; anything else (a path, a name
    that leaves the folder, an unknown id) is refused, naming the known ids, moving nothing."""
    tree, known = healed
    before = _files(tree.jit)
    with pytest.raises(heal.HealFailed, match=rf"no quarantine .*\(known: {known}\)"):
        heal.restore(tree.jit, qid)
    assert before == _files(tree.jit), "a refused restore moved files"


def test_restore_with_no_quarantine_says_none_are_known(stale_tree) -> None:
    """With no quarantine at all, the refusal says so."""
    with pytest.raises(heal.HealFailed, match=r"\(known: none\)"):
        heal.restore(stale_tree.jit, "20990101T000000Z")


def test_an_incomplete_quarantine_is_refused_before_anything_moves(healed) -> None:
    """A quarantined file gone missing: refused up front with the missing path, nothing moved."""
    tree, qid = healed
    qdir = tree.jit / heal.QUARANTINE_DIR / qid
    shutil.rmtree(qdir / "build")
    before = _files(tree.jit)
    with pytest.raises(heal.HealFailed, match=r"is incomplete \(missing: .*build"):
        heal.restore(tree.jit, qid)
    assert before == _files(tree.jit)


def test_a_restore_leaves_no_empty_quarantine_folder(healed) -> None:
    """After a restore its quarantine folder is gone entirely (nested build folders too)."""
    tree, qid = healed
    heal.restore(tree.jit, qid)
    assert [] == heal.list_quarantines(tree.jit), "an emptied quarantine folder was left"


def test_a_restore_that_fails_puts_the_displaced_files_back(
    healed, built_modules, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuilt module was set aside to make room, then moving the old one back failed:
    the rebuilt module returns to its place, the set-aside folder goes, the quarantine stays."""
    tree, qid = healed
    tree.install(BPS_CKTILE, built_modules[BPS_CKTILE])  # aiter rebuilt it
    before = _files(tree.jit)
    real = os.rename

    def failing(src, dst) -> None:  # type: ignore[no-untyped-def]
        if f"{heal.QUARANTINE_DIR}/{qid}/build" in str(src):
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(heal.os, "rename", failing)
    with pytest.raises(heal.HealFailed, match="Input/output error"):
        heal.restore(tree.jit, qid)
    assert before == _files(tree.jit), "a failed restore left files moved"
    assert (tree.jit / f"{BPS_CKTILE}.so").read_bytes() == built_modules[BPS_CKTILE].read_bytes()
    assert [qid] == [q.name for q in heal.list_quarantines(tree.jit)]


def test_a_quarantine_whose_manifest_cannot_be_written_moves_nothing(
    stale_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No manifest, no move: the heal fails, every module stays, no empty folder is left."""

    def disk_full(*_a, **_k) -> None:  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    before = _files(stale_tree.jit)
    monkeypatch.setattr(fsio, "write_json", disk_full)
    monitor.AiterMonitor(stale_tree.settings()).check(heal=True)
    after = _files(stale_tree.jit) - {heal.QUARANTINE_DIR}
    assert before == after, f"files moved without a manifest: {before ^ after}"
    assert not any(p.is_dir() for p in (stale_tree.jit / heal.QUARANTINE_DIR).glob("*")), (
        "an empty quarantine folder was left"
    )


def test_only_visible_folders_are_quarantines(stale_tree) -> None:
    """Hidden entries and stray files in .hal0-quarantine are not quarantines."""
    root = stale_tree.jit / heal.QUARANTINE_DIR
    (root / "20200101T000000Z").mkdir(parents=True)
    (root / ".tmp-folder").mkdir()
    (root / "notes.txt").write_text("x")
    assert ["20200101T000000Z"] == [q.name for q in heal.list_quarantines(stale_tree.jit)]


@pytest.mark.parametrize(("count", "keep", "deleted"), [(3, 5, 0), (3, 3, 0), (3, 1, 2), (2, 0, 2)])
def test_prune_deletes_the_oldest_beyond_keep(stale_tree, count, keep, deleted) -> None:
    """prune keeps the newest ``keep`` quarantines, deletes the older ones, and says which."""
    root = stale_tree.jit / heal.QUARANTINE_DIR
    names = [f"2020010{i}T000000Z" for i in range(count)]
    for name in names:
        (root / name / "build").mkdir(parents=True)
    assert names[:deleted] == heal.prune(stale_tree.jit, keep=keep)
    assert names[deleted:] == [q.name for q in heal.list_quarantines(stale_tree.jit)]
