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
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hal0_reconciler import threadname

TEMP_MARKER = ".hal0-reconciler."
TEMP_SUFFIX = ".tmp"


def identity_of(st: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime_ns): when it is unchanged, the file's bytes are too."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def full_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """``identity_of`` and the ctime: a rewrite in place that keeps size and mtime changes it."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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
"""How many fsyncs ``fsync_all`` has in flight at once (the caller's own and its helpers')."""
FSYNC_IDLE = 0.5
"""Seconds a helper thread waits for more fsyncs before it ends (a burst's groups come
back to back: its threads are started once, not for every group)."""
FSYNC_STOP_WAIT = 0.5
"""Seconds ``stop_fsync_helpers`` waits for the helpers to end (idle ones end at once)."""


class _Fsyncs:
    """One ``fsync_all`` call: its file descriptors, handed out one at a time to whichever
    thread is free (the caller and the helpers), and each one's error in its place."""

    def __init__(self, fds: Sequence[int]) -> None:
        self.fds = fds
        self.results: list[OSError | None] = [None] * len(fds)
        self._next = 0
        self._left = len(fds)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)

    def work(self) -> None:
        while True:
            with self._lock:
                at = self._next
                if at >= len(self.fds):
                    return
                self._next = at + 1
            try:
                os.fsync(self.fds[at])
            except OSError as exc:
                self.results[at] = exc
            finally:
                with self._lock:
                    self._left -= 1
                    if not self._left:
                        self._done.notify_all()

    def wait(self) -> None:
        with self._lock:
            while self._left:
                self._done.wait()


class _FsyncHelpers:
    """Threads that fsync for ``fsync_all`` callers, kept between calls: starting a thread
    waits for it to run, which under a burst's load (the worker and watchdog's threads share
    the interpreter) cost milliseconds per thread, 15 threads per group of 32 files. An idle
    helper ends after ``FSYNC_IDLE`` seconds; ``stop`` ends them all (the daemon's stop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Fsyncs | None] = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()

    def run(self, job: _Fsyncs) -> None:
        helpers = min(len(job.fds), FSYNC_THREADS) - 1  # the caller is one of them
        with self._lock:
            for _ in range(helpers):
                self._jobs.put(job)
            for _ in range(helpers - len(self._threads)):
                thread = threadname.NamedThread(target=self._serve, name="hal0-fsync", daemon=True)
                self._threads.add(thread)
                thread.start()
        job.work()
        job.wait()  # the helpers' fsyncs of this job: a helper busy elsewhere takes none

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                job = self._jobs.get(timeout=FSYNC_IDLE)
            except queue.Empty:
                with self._lock:  # a job put meanwhile finds this thread still counted
                    if self._jobs.empty():
                        self._threads.discard(me)
                        return
                continue
            if job is None:
                return
            job.work()

    def threads(self) -> int:
        with self._lock:
            return len(self._threads)

    def stop(self, timeout: float = FSYNC_STOP_WAIT) -> None:
        """End every helper (waits up to ``timeout`` in all; an fsync in flight finishes)."""
        with self._lock:
            threads, self._threads = self._threads, set()
            for _ in threads:
                self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


_HELPERS = _FsyncHelpers()


def fsync_all(fds: Sequence[int]) -> list[OSError | None]:
    """``os.fsync`` each file descriptor, several at once (threads: fsync releases the GIL), so
    the file system can commit them together instead of one journal commit after another.
    Each one's error in its place (None: synced)."""
    job = _Fsyncs(fds)
    if len(fds) <= 1:
        job.work()
    else:
        _HELPERS.run(job)
    return job.results


def fsync_helpers() -> int:
    """How many helper threads ``fsync_all`` keeps now (for tests and the daemon's stop)."""
    return _HELPERS.threads()


def stop_fsync_helpers(timeout: float = FSYNC_STOP_WAIT) -> None:
    """End ``fsync_all``'s helper threads (the daemon's stop; a later call starts new ones)."""
    _HELPERS.stop(timeout)


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
