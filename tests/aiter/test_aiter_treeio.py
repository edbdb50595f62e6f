"""The owner's child: a tree root does not own is handled with its owner's credentials only."""

from __future__ import annotations

import dataclasses
import errno
import os
import pwd
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from hal0_reconciler import boundedread, held_signals
from hal0_reconciler.aiter.trees import fs as treefs
from hal0_reconciler.aiter.trees import owner as treeowner
from hal0_reconciler.aiter.trees import owner_io as treeio
from helpers import devnodes, sigmask


@pytest.fixture
def owner() -> Iterator[tuple[str, int, int]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the owner is a user this test makes")
    with devnodes.system_user() as name:
        entry = pwd.getpwnam(name)
        yield name, entry.pw_uid, entry.pw_gid


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder every user can reach (pytest's own is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hal0-tree-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["openat2", "walk"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """With openat2 where the kernel has it, and with the per-component walk (child too)."""
    if request.param == "openat2" and not treefs.OPENAT2:
        pytest.skip("this kernel has no openat2")
    if request.param == "walk":
        monkeypatch.setattr(treefs, "OPENAT2", False)
    return str(request.param)


def _tree(
    open_tmp: Path, owner: tuple[str, int, int], timeout: float = 10.0
) -> tuple[Path, treeio.TreeIO]:
    _, uid, gid = owner
    jit = open_tmp / "jit"
    jit.mkdir()
    os.chown(jit, uid, gid)
    found = treeowner.owner_of(jit, open_tmp)
    assert None is found.refused
    roots = (treeio.Root(PurePosixPath(jit), PurePosixPath(jit)),)
    return jit, treeio.open_tree(roots, found.credentials, timeout=timeout)


def test_the_child_runs_as_the_owner_and_reads_only_what_the_owner_can(
    impl: str, open_tmp: Path, owner: tuple[str, int, int]
) -> None:
    """A 0600 root file in the owner's JIT folder is refused to the child; the owner's is read."""
    jit, io = _tree(open_tmp, owner)
    try:
        assert isinstance(io, treeio.ChildTree)
        assert owner[1] == io.child_uid
        (jit / "root_only.so").write_bytes(b"secret")
        (jit / "root_only.so").chmod(0o600)
        (jit / "mine.so").write_bytes(b"module")
        os.chown(jit / "mine.so", owner[1], owner[2])
        assert b"module" == io.read(jit / "mine.so", max_bytes=100)
        with pytest.raises(PermissionError):
            io.read(jit / "root_only.so", max_bytes=100)
    finally:
        io.close()


def test_a_link_in_the_tree_is_refused_by_the_child(
    impl: str, open_tmp: Path, owner: tuple[str, int, int]
) -> None:
    """A module that is a link to a file outside is never opened, even one the owner can read."""
    jit, io = _tree(open_tmp, owner)
    try:
        (open_tmp / "public").write_bytes(b"public")
        (jit / "module_x.so").symlink_to(open_tmp / "public")
        with pytest.raises(OSError) as caught:
            io.open_regular(jit / "module_x.so")
        assert errno.ELOOP == caught.value.errno
        os.mkfifo(jit / "module_f.so")
        with pytest.raises(boundedread.ReadRefused) as fifo:
            io.open_regular(jit / "module_f.so")
        assert "a FIFO, not a regular file" == fifo.value.reason
    finally:
        io.close()


def test_paths_outside_the_tree_are_refused_before_the_child_is_asked(
    open_tmp: Path, owner: tuple[str, int, int]
) -> None:
    """/etc/passwd and a '..' path are outside every root: refused by the parent."""
    jit, io = _tree(open_tmp, owner)
    try:
        for path in ("/etc/passwd", f"{jit}/../x"):
            with pytest.raises(treefs.OutsideTree):
                io.lstat(path)
    finally:
        io.close()


def test_heal_operations_run_as_the_owner(
    impl: str, open_tmp: Path, owner: tuple[str, int, int]
) -> None:
    """mkdir, an atomic write, a rename, fsync and rmtree by the child leave owner-owned files."""
    jit, io = _tree(open_tmp, owner)
    try:
        io.mkdir(jit / ".hal0-quarantine", 0o755)
        io.write_atomic(jit / ".hal0-quarantine" / "manifest.json", b"{}", 0o644)
        io.rename(jit / ".hal0-quarantine" / "manifest.json", jit / "moved.json")
        io.fsync_dir(jit)
        st = (jit / "moved.json").stat()
        assert (owner[1], b"{}") == (st.st_uid, (jit / "moved.json").read_bytes())
        assert ["moved.json"] == [n for n in io.listdir(jit) if not n.startswith(".")]
        io.rmtree(jit / ".hal0-quarantine")
        assert not (jit / ".hal0-quarantine").exists()
    finally:
        io.close()


def test_a_child_that_does_not_answer_is_killed_and_the_tree_fails(
    open_tmp: Path, owner: tuple[str, int, int]
) -> None:
    """A stopped child: the exchange times out, the child is killed, later calls fail at once."""
    jit, io = _tree(open_tmp, owner, timeout=1.0)
    assert isinstance(io, treeio.ChildTree)
    assert io._server is not None
    pid = io._server.pid
    os.kill(pid, signal.SIGSTOP)
    with pytest.raises(treeio.TreeUnavailable):
        io.lstat(jit)
    with pytest.raises(treeio.TreeUnavailable):
        io.lstat(jit)
    assert not io._server.alive()
    assert "did not answer in 1.0s" in str(io.dead)


def test_a_child_started_while_the_stop_signals_are_held_ends_at_a_sigterm(
    open_tmp: Path, owner: tuple[str, int, int]
) -> None:
    """The daemon holds SIGTERM, SIGHUP and SIGINT from its first instant until its handlers are
    in place; a child started from a thread that still holds them inherits the mask through exec.
    The owner's child clears it, so systemd's SIGTERM at a stop ends it at once (not the stop
    timeout's SIGKILL)."""
    started: list[tuple[Path, treeio.TreeIO]] = []

    def start() -> None:
        held_signals.hold()  # this thread's mask only, as a thread started before READY
        started.append(_tree(open_tmp, owner))

    starter = threading.Thread(target=start, name="held-signals")
    starter.start()
    starter.join(30)
    assert not starter.is_alive()
    assert started, "the tree was not opened"
    _, io = started[0]
    try:
        assert isinstance(io, treeio.ChildTree)
        assert io._server is not None
        assert set() == sigmask.blocked(io._server.pid) & set(held_signals.HELD)
        os.kill(io._server.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while io._server.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not io._server.alive(), "the child held SIGTERM"
    finally:
        io.close()


def test_a_dead_child_is_an_error_for_the_tree_never_a_hang(
    open_tmp: Path, owner: tuple[str, int, int]
) -> None:
    """A child killed under the parent: the next call says it died."""
    jit, io = _tree(open_tmp, owner)
    assert isinstance(io, treeio.ChildTree)
    assert io._server is not None
    os.kill(io._server.pid, signal.SIGKILL)
    with pytest.raises(treeio.TreeUnavailable):
        io.lstat(jit)
    assert "died" in str(io.dead)


def test_a_stat_crosses_from_the_child_field_for_field(tmp_path: Path) -> None:
    """The child's wire form of a stat and root's ``Stat`` name the same fields in one order."""
    assert treefs.STAT_FIELDS == tuple(f.name for f in dataclasses.fields(treeio.Stat))
    st = os.lstat(tmp_path)
    assert st.st_ino == treeio.Stat(*treefs.stat_values(st)).ino
    assert st.st_mtime_ns == treeio.Stat.of(st).mtime_ns
