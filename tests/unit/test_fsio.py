"""fsio: an atomic replace is old or new, never torn, and leaves no temp file; a group of
replaces is fsynced together (several at once) and each write's failure is its own."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from hal0_reconciler import fsio


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if fsio.is_own_temp(p.name))


def _targets(folder: Path, count: int) -> list[Path]:
    paths = []
    for n in range(count):
        path = folder / f"f{n}"
        path.write_bytes(b"old\n")
        paths.append(path)
    return paths


def test_a_replace_keeps_mode_and_owner_and_syncs_the_folder_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(fsio, "fsync_directory", synced.append)
    (path,) = _targets(tmp_path, 1)
    fsio.write_atomically(path, [b"ne", b"w\n"], mode=0o640, uid=12345, gid=23456)
    st = path.stat()
    assert (b"new\n", 0o640, 12345, 23456) == (
        path.read_bytes(),
        st.st_mode & 0o777,
        st.st_uid,
        st.st_gid,
    )
    assert [tmp_path] == synced
    fsio.write_atomically(path, b"newer\n", mode=0o600, sync_dir=False)
    assert [tmp_path] == synced
    assert (b"newer\n", []) == (path.read_bytes(), _temps(tmp_path))


@pytest.mark.parametrize(("uid", "gid"), [(12345, None), (None, 23456)])
def test_an_owner_given_in_part_keeps_the_other_part(
    tmp_path: Path, uid: int | None, gid: int | None
) -> None:
    (path,) = _targets(tmp_path, 1)
    fsio.write_atomically(path, b"x", mode=0o644, uid=uid, gid=gid)
    st = path.stat()
    assert (uid or os.getuid(), gid or os.getgid()) == (st.st_uid, st.st_gid)


def test_a_replace_that_fails_raises_and_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (path,) = _targets(tmp_path, 1)

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output"):
        fsio.write_atomically(path, b"new\n", sync_dir=False)
    assert (b"old\n", []) == (path.read_bytes(), _temps(tmp_path))


def test_a_temp_that_cannot_be_written_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (path,) = _targets(tmp_path, 1)

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        fsio.begin_write(path, b"new\n", mode=0o644)
    assert (b"old\n", []) == (path.read_bytes(), _temps(tmp_path))


def test_an_abandoned_write_closes_and_removes_its_temp(tmp_path: Path) -> None:
    (path,) = _targets(tmp_path, 1)
    pending = fsio.begin_write(path, b"new\n", mode=0o644)
    assert [pending.tmp.name] == _temps(tmp_path)
    fsio.abandon(pending)
    assert (b"old\n", []) == (path.read_bytes(), _temps(tmp_path))
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(pending.fd)


def test_a_group_commits_each_write_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second file's fsync fails, the fourth's rename and the fifth's close: those keep their old bytes,
    the others are replaced; each error is in its place; no temp is left."""
    paths = _targets(tmp_path, 5)
    (tmp_path / "f3").unlink()
    (tmp_path / "f3").mkdir()  # a rename of a file over a folder fails
    pending = [fsio.begin_write(p, f"new {n}\n".encode(), mode=0o644) for n, p in enumerate(paths)]
    bad_sync, bad_close = pending[1].fd, pending[4].fd
    real_fsync, real_close = os.fsync, os.close

    def fsync(fd: int) -> None:
        if fd == bad_sync:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    def close(fd: int) -> None:
        real_close(fd)
        if fd == bad_close:
            raise OSError(errno.EIO, "close failed")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "close", close)
    results = fsio.commit_writes(pending)
    assert [None, errno.EIO, None, errno.EISDIR, errno.EIO] == [
        None if r is None else r.errno for r in results
    ]
    assert [b"new 0\n", b"old\n", b"new 2\n", b"old\n"] == [
        p.read_bytes() for p in (paths[0], paths[1], paths[2], paths[4])
    ]
    assert [] == _temps(tmp_path)


@pytest.mark.parametrize("where", ["fsync", "rename"])
def test_an_interrupted_group_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Interrupted while syncing, no file is replaced; while renaming, the files before the
    interruption are new, the rest old; no temp file either way, no descriptor left open."""
    paths = _targets(tmp_path, 3)
    pending = [fsio.begin_write(p, b"new\n", mode=0o644) for p in paths]
    real_rename = os.rename
    renamed: list[str] = []

    def stop(*_args: object) -> None:
        raise KeyboardInterrupt

    def rename(src: str, dst: str) -> None:
        if renamed:
            raise KeyboardInterrupt
        renamed.append(dst)
        real_rename(src, dst)

    if where == "fsync":
        monkeypatch.setattr(fsio, "fsync_all", stop)
    else:
        monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        fsio.commit_writes(pending)
    new = 0 if where == "fsync" else 1
    assert [b"new\n"] * new + [b"old\n"] * (3 - new) == [p.read_bytes() for p in paths]
    assert [] == _temps(tmp_path)
    for write in pending:
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(write.fd)


def test_a_group_is_fsynced_several_at_once_and_one_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync releases the GIL: several files' fsyncs are in flight together (the caller's and
    its helpers'), so the file system can commit them in one go; a single file is synced by
    the caller alone."""
    lock = threading.Lock()
    state = {"now": 0, "most": 0}
    threads: set[str] = set()
    slowest: list[int] = []  # the first fsync a helper does is slow: fsync_all waits for it

    def slow(fd: int) -> None:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            threads.add(threading.current_thread().name)
            late = threading.current_thread().name == "hal0-fsync" and not slowest
            if late:
                slowest.append(fd)
        time.sleep(0.3 if late else 0.05)
        with lock:
            state["now"] -= 1
        if fd < 0:
            raise OSError(errno.EBADF, "bad")

    me = threading.current_thread().name
    monkeypatch.setattr(os, "fsync", slow)
    try:
        results = fsio.fsync_all([1, -1, 2, 3, 4, 5, 6, 7])
        assert 0 == state["now"], "fsync_all returned with an fsync still in flight"
        assert [None, errno.EBADF, None, None, None, None, None, None] == [
            None if r is None else r.errno for r in results
        ]
        assert state["most"] > 1
        assert "hal0-fsync" in threads
        assert threads <= {"hal0-fsync", me}
        threads.clear()
        assert [None, None] == fsio.fsync_all([1, 2])  # two are already two at once
        assert {"hal0-fsync", me} == threads
        threads.clear()
        assert [None] == fsio.fsync_all([1])
        assert {me} == threads
        assert [] == fsio.fsync_all([])
    finally:
        fsio.stop_fsync_helpers()


def test_fsync_helpers_are_kept_between_groups_and_end_when_stopped_or_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst's groups reuse the same helper threads (none started per group); stopping ends
    them at once; idle helpers end by themselves; a group after a stop gets new ones."""
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(os, "fsync", lambda _fd: time.sleep(0.005))
    try:
        for _ in range(20):
            assert [None] * 32 == fsio.fsync_all(list(range(32)))
        helpers = fsio.FSYNC_THREADS - 1
        assert helpers == len(started), f"{len(started)} threads started for 20 groups"
        assert helpers == fsio.fsync_helpers()
        fsio.stop_fsync_helpers()
        assert (0, []) == (fsio.fsync_helpers(), [t for t in started if t.is_alive()])
        fsio.fsync_all(list(range(4)))
        assert 3 == fsio.fsync_helpers(), "a group after a stop has no helpers"
        deadline = time.monotonic() + fsio.FSYNC_IDLE + 5
        while fsio.fsync_helpers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0 == fsio.fsync_helpers(), "idle helpers did not end"
        assert [] == [t for t in started if t.is_alive()]
    finally:
        fsio.stop_fsync_helpers()
