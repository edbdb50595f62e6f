"""Crash-safe file replacement: every file is either old or new, never torn.

The one way this package replaces a file it owns or edits: temp file in the same directory,
write, keep owner/group/mode, fsync, rename over the target, fsync the directory. A temp file
is removed on any error; a crash can leave one behind, named with TEMP_MARKER so that
``remove_stale_temps`` can clear it at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMP_MARKER = ".hal0-reconciler."
TEMP_SUFFIX = ".tmp"


def identity_of(st: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime_ns): when it is unchanged, the file's bytes are too."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def write_json(path: Path, payload: object, *, mode: int = 0o644, **dumps: Any) -> None:
    """``write_atomically`` for a JSON document (``dumps``: json.dumps options), making its
    folder when needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(payload, **dumps).encode("utf-8"), mode=mode)


def temp_path_for(path: Path) -> Path:
    """A temp name beside ``path``: hidden, marked and ending in .tmp (never a slot name)."""
    return path.with_name(f".{path.name}{TEMP_MARKER}{os.urandom(4).hex()}{TEMP_SUFFIX}")


def is_own_temp(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name and name.endswith(TEMP_SUFFIX)


def write_atomically(
    path: Path,
    data: bytes | Sequence[bytes],
    *,
    mode: int = 0o644,
    uid: int | None = None,
    gid: int | None = None,
    sync_dir: bool = True,
) -> None:
    """Replace ``path`` with ``data`` atomically and durably, with the given mode and owner.

    ``sync_dir=False`` leaves the folder's fsync to the caller, who does it once for a batch of
    files (``fsync_directory``) before anything depends on the new names being durable. The
    file's own bytes are always fsynced before the rename, so a crash leaves it old or new.
    """
    (error,) = commit_writes([begin_write(path, data, mode=mode, uid=uid, gid=gid)])
    if error is not None:
        raise error
    if sync_dir:
        fsync_directory(path.parent)


@dataclass(frozen=True)
class PendingWrite:
    """A temp file written beside its target, owner and mode set: not yet synced nor renamed."""

    path: Path
    tmp: Path
    fd: int
    stat: os.stat_result  # the temp file's, once written (its ctime moves at the rename)


def begin_write(
    path: Path,
    data: bytes | Sequence[bytes],
    *,
    mode: int,
    uid: int | None = None,
    gid: int | None = None,
) -> PendingWrite:
    """The first half of an atomic replace: the temp file with ``data`` (pieces: not joined),
    ``mode`` and owner. ``commit_writes`` finishes it; on any error here the temp is removed."""
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        for chunk in [data] if isinstance(data, bytes) else data:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        if uid is not None or gid is not None:
            os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
        os.fchmod(fd, mode)
        return PendingWrite(path, tmp, fd, os.fstat(fd))
    except BaseException:
        _discard(fd, tmp)
        raise


def abandon(pending: PendingWrite) -> None:
    """Give up a pending write: its temp file is closed and removed, the target untouched."""
    _discard(pending.fd, pending.tmp)


def _discard(fd: int, tmp: Path) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def commit_writes(pending: Sequence[PendingWrite]) -> list[OSError | None]:
    """The second half: fsync every temp file (all at once, so that one journal commit can
    carry them), then rename each over its target. Each write's error is returned in its place
    (None: done); a temp that failed is removed, the others' writes stand. The folder's fsync
    is the caller's (``fsync_directory``), once for the batch."""
    try:
        results = fsync_all([p.fd for p in pending])
    except BaseException:  # interrupted: no write is done
        for write in pending:
            abandon(write)
        raise
    for at, write in enumerate(pending):
        closed = _close(write.fd)
        results[at] = results[at] or closed
    finished = 0
    try:
        for write in pending:
            failure = results[finished]
            if failure is None:
                try:
                    os.rename(write.tmp, write.path)
                except OSError as exc:
                    failure = exc
            if failure is not None:
                with contextlib.suppress(OSError):
                    os.unlink(write.tmp)
            results[finished] = failure
            finished += 1
    except BaseException:  # interrupted: the writes not finished leave no temp behind
        for write in pending[finished:]:
            with contextlib.suppress(OSError):
                os.unlink(write.tmp)
        raise
    return results


def _close(fd: int) -> OSError | None:
    try:
        os.close(fd)
    except OSError as exc:
        return exc
    return None


FSYNC_THREADS = 16
"""How many fsyncs ``fsync_all`` has in flight at once."""


def fsync_all(fds: Sequence[int]) -> list[OSError | None]:
    """``os.fsync`` each file descriptor, several at once (threads: fsync releases the GIL), so
    the file system can commit them together instead of one journal commit after another.
    Each one's error in its place (None: synced)."""
    results: list[OSError | None] = [None] * len(fds)
    todo = iter(range(len(fds)))

    def work() -> None:
        for at in todo:  # shared: each index is taken once, by whichever thread is free
            try:
                os.fsync(fds[at])
            except OSError as exc:
                results[at] = exc

    if len(fds) <= 1:
        work()
        return results
    threads = [
        threading.Thread(target=work, name="hal0-fsync", daemon=True)
        for _ in range(min(len(fds), FSYNC_THREADS))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def has_own_temps(directory: Path) -> bool:
    """Whether ``directory`` holds a temp file of this package (a crash left it)."""
    try:
        with os.scandir(directory) as entries:
            return any(is_own_temp(entry.name) for entry in entries)
    except OSError:
        return False


def remove_stale_temps(directory: Path) -> list[Path]:
    """Remove temp files this package left behind in ``directory`` (after a crash)."""
    removed: list[Path] = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(directory):
            if is_own_temp(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed
