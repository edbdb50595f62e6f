"""The moves under every heal and restore: never onto an existing file, never through a link,
undone on failure (a failed undo keeps the journal), folders that must be the daemon's own, the
journal's rules, and quarantine ids that never collide."""

from __future__ import annotations

import datetime as dt
import errno
import os
from pathlib import Path

import pytest

from hal0_reconciler.aiter.quarantine import folder as qfs
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.quarantine import journal as qj
from hal0_reconciler.aiter.quarantine import ops as qops
from helpers import quarantines

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _dir(path: Path) -> int:
    return os.open(path, qfs.DIR_FLAGS)


def test_a_rename_never_replaces_what_is_already_there(tmp_path: Path) -> None:
    """A destination that exists (a file, or a dangling symlink) is never replaced: the rename
    fails and both keep their bytes."""
    (tmp_path / "a.so").write_bytes(b"A")
    (tmp_path / "taken.so").write_bytes(b"theirs")
    (tmp_path / "dangling.so").symlink_to(tmp_path / "nowhere")
    fd = _dir(tmp_path)
    try:
        for dst in ("taken.so", "dangling.so"):
            with pytest.raises(FileExistsError):
                qfs.rename_noreplace(fd, "a.so", fd, dst)
    finally:
        os.close(fd)
    assert (b"A", b"theirs") == (
        (tmp_path / "a.so").read_bytes(),
        (tmp_path / "taken.so").read_bytes(),
    )
    assert str(tmp_path / "nowhere") == os.readlink(tmp_path / "dangling.so")


@pytest.mark.parametrize("kind", ["symlink", "file", "foreign", "group-writable"])
def test_a_folder_the_daemon_must_own_is_refused_when_it_is_not(tmp_path: Path, kind: str) -> None:
    """``.hal0-quarantine`` (and each quarantine) must be a real folder owned by whoever made it,
    writable by no one else: a link, a file, another owner's or a group-writable one is refused
    loudly, and nothing is made through it."""
    victim = tmp_path / "victim"
    victim.mkdir()
    path = tmp_path / heal.QUARANTINE_DIR
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "file":
        path.write_bytes(b"")
    else:
        path.mkdir()
        if kind == "foreign":
            os.chown(path, 65534, 65534)
        else:
            path.chmod(0o770)
    fd = _dir(tmp_path)
    try:
        with pytest.raises(qfs.FolderRefused, match="refused"):
            qfs.open_owned_dir(fd, heal.QUARANTINE_DIR, uid=os.geteuid(), label="q", create=True)
    finally:
        os.close(fd)
    assert [] == list(victim.iterdir())


def test_rmtree_removes_a_link_as_a_link(tmp_path: Path) -> None:
    """A link inside a removed folder is removed itself; the folder it points at keeps its
    subfolders and files."""
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "f").write_bytes(b"v")
    doomed = tmp_path / "doomed"
    (doomed / "build").mkdir(parents=True)
    (doomed / "build" / "link").symlink_to(victim)
    (doomed / "link-file").symlink_to(victim / "keep" / "f")
    fd = _dir(tmp_path)
    try:
        qfs.rmtree(fd, "doomed", label="doomed")
    finally:
        os.close(fd)
    assert (False, b"v") == (doomed.exists(), (victim / "keep" / "f").read_bytes())


@pytest.mark.parametrize(
    ("direction", "src", "dst", "action"),
    [
        ("forward", True, False, "move"),
        ("forward", False, True, "skip"),
        ("forward", True, True, "skip"),  # moved, and a rebuild took the old place
        ("forward", False, False, "lost"),
        ("back", False, True, "undo"),
        ("back", True, False, "skip"),
        ("back", True, True, "skip"),
        ("back", False, False, "lost"),
    ],
)
def test_rolling_one_step(direction: str, src: bool, dst: bool, action: str) -> None:
    """The decision table of a roll: forward moves what is still at its source, back moves back
    what reached its destination, and a file at neither end is said to be lost."""
    got = qj.next_action(qj.Direction(direction), src_present=src, dst_present=dst)
    assert action == got


@pytest.mark.parametrize(
    "rel", ["../x.so", "/etc/passwd", "build/../../etc", "build/module_x/blob", "passwd", "build"]
)
def test_a_journal_moves_only_module_files(rel: str) -> None:
    """A journal naming anything but ``module_<name>.so`` or ``build/module_<name>`` is refused."""
    journal = qj.Journal(qj.Op.HEAL, "q1", "q1", ("q1",), (qj.Step(rel, qj.JIT, "q1"),))
    with pytest.raises(qj.JournalInvalid):
        qj.decode(journal.encode(), home="q1")


def test_a_journal_for_another_quarantine_is_refused() -> None:
    """A journal copied into another quarantine folder (or moving between two quarantines) is
    refused."""
    moved = qj.Journal(qj.Op.HEAL, "q1", "q1", ("q1",), (qj.Step("module_x.so", qj.JIT, "q1"),))
    with pytest.raises(qj.JournalInvalid, match="another quarantine"):
        qj.decode(moved.encode(), home="q2")
    between = qj.Journal(qj.Op.HEAL, "q1", "q1", (), (qj.Step("module_x.so", "q2", "q1"),))
    with pytest.raises(qj.JournalInvalid, match="not between"):
        qj.decode(between.encode(), home="q1")


def test_quarantines_made_in_the_same_second_get_their_own_ids(tmp_path: Path) -> None:
    """Two heals within one second: the second id gets -2, the third -3 (none reused)."""
    fd = _dir(tmp_path)
    try:
        with qops.Tree(fd, path=tmp_path, book=quarantines.book_for(tmp_path / "s")) as tree:
            ids = [qops.new_quarantine(tree, NOW) for _ in range(3)]
    finally:
        os.close(fd)
    assert ["20260102T030405Z", "20260102T030405Z-2", "20260102T030405Z-3"] == ids


def test_no_module_to_look_for_means_no_holder() -> None:
    """mapped_by of no path is an empty answer (the process table is not even read)."""
    assert {} == heal.mapped_by([])


def test_a_quarantine_folder_that_already_exists_is_left_alone(tmp_path: Path) -> None:
    """Another heal took the same id a moment ago: this one takes the next id, and the other
    quarantine (holding its modules) is not touched."""
    jit = tmp_path / "jit"
    quarantines.install(jit, "module_x", b"X")
    other = jit / heal.QUARANTINE_DIR / "20260102T030405Z"
    other.mkdir(parents=True, mode=0o700)
    (other / heal.MANIFEST).write_text("{}")
    (other / "module_y.so").write_bytes(b"Y")
    q = heal.quarantine(
        jit,
        {"module_x": quarantines.module_plan(jit, "module_x")},
        book=quarantines.book_for(tmp_path / "state"),
        now=NOW,
    )
    assert "20260102T030405Z-2" == q.id
    assert {"manifest.json": b"{}", "module_y.so": b"Y"} == quarantines.snapshot(other)


def test_a_failed_undo_keeps_the_journal_and_the_next_run_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second move fails and undoing the first fails too: the error says so, the journal
    stays, and the next roll puts every module in exactly one place (forward: the manifest is
    complete)."""
    jit = tmp_path / "jit"
    for m in ("module_a", "module_b"):
        quarantines.install(jit, m, m.encode())
    before = quarantines.snapshot(jit)
    real, calls = qfs.rename_noreplace, []

    def failing(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
        calls.append(src)
        if len(calls) in {2, 3}:  # the second move, then the undo of the first
            raise OSError(errno.EIO, "Input/output error")
        real(src_fd, src, dst_fd, dst)

    monkeypatch.setattr(qfs, "rename_noreplace", failing)
    book = quarantines.book_for(tmp_path / "state")
    plans = {m: quarantines.module_plan(jit, m) for m in ("module_a", "module_b")}
    with pytest.raises(heal.HealFailed, match=r"undo FAILED .*journal .* is kept"):
        heal.quarantine(jit, plans, book=book, now=NOW)
    (qdir,) = heal.list_quarantines(jit)
    assert (qdir / qj.JOURNAL).is_file()
    monkeypatch.setattr(qfs, "rename_noreplace", real)
    (rolled,) = heal.recover(jit, book=book)
    assert ("heal", "forward") == (rolled.op, rolled.outcome)
    after = quarantines.snapshot(jit)
    for rel in ("module_a.so", "module_b.so", "build/module_a/blob/gen.cpp"):
        inside = f"{heal.QUARANTINE_DIR}/{qdir.name}/{rel}"
        assert [before[rel]] == [v for k, v in after.items() if k in {rel, inside}]
    assert not (qdir / qj.JOURNAL).exists()


@pytest.mark.parametrize(
    "data",
    [
        b'{"op": "heal", "home": "q1"',  # torn
        b'{"op": "heal", "home": "q1", "creates": null, "manifests": []}',  # no moves
        b'{"op": "graft", "home": "q1", "creates": null, "manifests": [], "moves": []}',
        b'{"op": "heal", "home": "q1", "creates": null, "manifests": [], "moves": [1]}',
    ],
    ids=["torn", "no-moves", "unknown-op", "move-not-a-table"],
)
def test_a_journal_that_is_not_what_encode_writes_is_refused(data: bytes) -> None:
    """A torn or malformed journal is JournalInvalid (never another error a roll would not
    expect), and says it is unreadable."""
    with pytest.raises(qj.JournalInvalid, match="unreadable journal"):
        qj.decode(data, home="q1")
