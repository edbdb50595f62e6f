"""The moves under every heal and restore: never onto an existing file, undone on failure (and
a failed undo said path by path), and quarantine ids that never collide."""

from __future__ import annotations

import datetime as dt
import errno
import os
from pathlib import Path

import pytest

from hal0_reconciler.aiter import heal


def test_a_move_never_replaces_what_is_already_there(tmp_path: Path) -> None:
    """A destination that exists (a file, or a dangling symlink) stops the moves: the earlier
    ones are undone and both files keep their bytes."""
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    taken = tmp_path / "q" / "b.so"
    taken.parent.mkdir()
    taken.write_bytes(b"theirs")
    dangling = tmp_path / "q" / "c.so"
    dangling.symlink_to(tmp_path / "nowhere")
    for dst in (taken, dangling):
        moves = [heal.Move(a, tmp_path / "q" / "a.so"), heal.Move(b, dst)]
        with pytest.raises(heal.HealFailed, match="1 earlier move"):
            heal._move_all(moves)
        assert (b"A", b"B") == (a.read_bytes(), b.read_bytes()), "a move was not undone"
    assert b"theirs" == taken.read_bytes(), "a move replaced an existing file"


def test_a_failed_undo_is_said_path_by_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When putting an earlier move back fails too, the error names that move (an operator
    must put it back by hand)."""
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    q = tmp_path / "q"
    real = os.rename

    def rename(src, dst) -> None:  # type: ignore[no-untyped-def]
        if Path(src) == b or Path(dst) == a:  # the second move and the undo of the first
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(heal.os, "rename", rename)
    with pytest.raises(heal.HealFailed, match=rf"undo FAILED for: {q / 'a.so'} -> {a}: "):
        heal._move_all([heal.Move(a, q / "a.so"), heal.Move(b, q / "b.so")])


def test_quarantines_made_in_the_same_second_get_their_own_ids(tmp_path: Path) -> None:
    """Two heals within one second: the second id gets -2, the third -3 (none reused)."""
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    ids = []
    for _ in range(3):
        qdir = heal._new_quarantine_dir(tmp_path, now)
        qdir.mkdir(parents=True)
        ids.append(qdir.name)
    assert ["20260102T030405Z", "20260102T030405Z-2", "20260102T030405Z-3"] == ids


def test_no_module_to_look_for_means_no_holder() -> None:
    """mapped_by of no path is an empty answer (the process table is not even read)."""
    assert {} == heal.mapped_by([])


def test_a_quarantine_folder_that_already_exists_is_left_alone(tmp_path: Path) -> None:
    """Another heal took the same id a moment ago: this one fails and moves nothing, and the
    other quarantine (holding its modules) is not touched, let alone deleted."""
    so = tmp_path / "module_x.so"
    so.write_bytes(b"X")
    qdir = tmp_path / heal.QUARANTINE_DIR / "20260102T030405Z"
    qdir.mkdir(parents=True)
    (qdir / heal.MANIFEST).write_text("{}")
    (qdir / "module_y.so").write_bytes(b"Y")
    with pytest.raises(heal.HealFailed, match="cannot create quarantine"):
        heal._execute(qdir, [heal.Move(so, qdir / "module_x.so")], {"id": qdir.name}, ("x",))
    assert b"X" == so.read_bytes()
    assert {heal.MANIFEST, "module_y.so"} == {p.name for p in qdir.iterdir()}, (
        "another heal's quarantine was changed"
    )
    assert "{}" == (qdir / heal.MANIFEST).read_text()
