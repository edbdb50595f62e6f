"""The slots directory on disk: list, read, lock and replace slot files. The only slot writer.

Reads never follow symlinks and never block on a FIFO. Writes happen under hal0's slot write
lock (an exclusive ``flock`` on ``<slots_dir>.lock``), keep the replaced file's owner, group
and mode, and are atomic (``fsio.write_atomically``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import boundedread, errors, fsio
from hal0_reconciler.errors import LockTimeout, OverLimit, WriteRefused
from hal0_reconciler.model import Catalog
from hal0_reconciler.slots import limits, runtime

_EDITOR_LITTER = ("~", ".swp", ".swx", ".tmp")


def is_slot_file_name(name: str) -> bool:
    """``*.toml`` files are slots; hidden files and editor/writer temp files are not."""
    return name.endswith(".toml") and not name.startswith(".") and not name.endswith(_EDITOR_LITTER)


def list_slot_paths(slots_dir: Path) -> list[Path]:
    """Every slot file name in the directory (whatever kind of file it is), sorted."""
    return [slots_dir / n for n in list_slot_names(slots_dir)]


def list_slot_names(slots_dir: Path) -> list[str]:
    """``list_slot_paths`` as bare names (no Path objects: a full pass over 10k files)."""
    return slot_names(list_folder(slots_dir))


def list_folder(slots_dir: Path) -> list[str]:
    """Every name in the folder, as the kernel lists them (empty when it is not there)."""
    try:
        return os.listdir(slots_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []


def slot_names(names: list[str]) -> list[str]:
    """The slot file names among ``names``, sorted."""
    # is_slot_file_name, spelled out for the 10k names of a full pass (a name that ends with
    # ".toml" ends with none of the litter suffixes)
    slots = [n for n in names if n.endswith(".toml") and not n.startswith(".")]
    slots.sort()
    return slots


@dataclass(frozen=True)
class SlotFile:
    """A slot file's bytes and the stat they were read with."""

    data: bytes
    stat: os.stat_result


def read_slot(path: Path, *, max_bytes: int | None = None) -> SlotFile:
    """Read a regular slot file without following a symlink or blocking on a FIFO.

    Raises FileNotFoundError when it is gone, WriteRefused when it is not a regular file, and
    OverLimit when it is larger than ``max_bytes`` (never reading more than that).
    """
    before = os.lstat(path)  # never open a device node, FIFO or socket that sits in the folder
    if not stat.S_ISREG(before.st_mode):
        what = boundedread.kind_of_mode(before.st_mode)
        raise WriteRefused(f"{path}: {what}, not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WriteRefused(f"{path}: is a symlink; slot files are never followed") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise WriteRefused(f"{path}: {_kind(path)}, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = boundedread.kind_of_mode(st.st_mode)
            raise WriteRefused(f"{path}: {what}, not a regular file")
        cap = None if max_bytes is None else max_bytes + 1
        if cap is not None:
            limits.check_size(st.st_size, limits.Limits(max_bytes=cap - 1))
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 16 if cap is None else min(1 << 16, cap - size)):
            chunks.append(chunk)
            size += len(chunk)
            if cap is not None and size >= cap:  # it grew after the fstat
                raise OverLimit(f"over the size limit: more than {max_bytes} bytes")
        return SlotFile(b"".join(chunks), st)
    finally:
        os.close(fd)


def replace_slot(path: Path, data: bytes, *, like: os.stat_result, sync_dir: bool = True) -> None:
    """Atomically replace a slot file, keeping the owner, group and mode of ``like``.

    ``sync_dir=False``: the caller fsyncs the slots folder once for its whole batch.

    Refuses when the path is no longer the regular file that was read (a symlink or other
    kind of file was put there meanwhile).
    """
    (error,) = fsio.commit_writes([begin_replace(path, data, like=like)])
    if error is not None:
        raise error
    if sync_dir:
        fsio.fsync_directory(path.parent)


def begin_replace(path: Path, data: bytes, *, like: os.stat_result) -> fsio.PendingWrite:
    """``replace_slot``'s first half, for a group of files: the temp file beside ``path`` with
    ``data`` and the owner, group and mode of ``like``; ``fsio.commit_writes`` syncs and renames
    the group's temp files together. Refuses as ``replace_slot`` does."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        raise WriteRefused(f"{path}: vanished before it could be replaced") from None
    if not stat.S_ISREG(now.st_mode):
        raise WriteRefused(f"{path}: {boundedread.kind_of_mode(now.st_mode)}, not a regular file")
    return fsio.begin_write(
        path, data, mode=stat.S_IMODE(like.st_mode), uid=like.st_uid, gid=like.st_gid
    )


@contextmanager
def slot_write_lock(
    lock_file: Path,
    *,
    timeout: float,
    group_of: Path | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[None]:
    """Hold hal0's slot write lock (exclusive flock), waiting at most ``timeout`` seconds.

    A lock file we create gets hal0's mode 0664 whatever our umask, and the group of
    ``group_of`` (the slots directory), so hal0's own writers can still open it. The wait
    ends early, with LockTimeout, once ``cancelled()`` is true (the daemon is stopping).
    """
    fd = _open_lock_file(lock_file, group_of=group_of)
    try:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancelled is not None and cancelled():
                    raise LockTimeout(f"{lock_file}: gave up waiting, stopping") from None
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"{lock_file}: slot write lock still held by another writer after "
                        f"{timeout:g}s"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open_lock_file(lock_file: Path, *, group_of: Path | None) -> int:
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(lock_file, flags | os.O_CREAT | os.O_EXCL, 0o664)
    except FileExistsError:
        return os.open(lock_file, flags)
    try:
        os.fchmod(fd, 0o664)
        if group_of is not None:
            gid = os.stat(group_of).st_gid
            if gid != os.fstat(fd).st_gid:
                os.fchown(fd, -1, gid)
    except OSError:
        os.close(fd)
        raise
    return fd


PROFILES_MAX_BYTES = 1 << 20  # a catalog of many profiles; still bounded


def read_catalog(profiles_file: Path, *, bounds: limits.Limits | None = None) -> Catalog:
    """hal0's profile catalog: built-ins, overlaid by the profiles file when it exists.

    Whatever is wrong with the file (unreadable, over a limit, not TOML, not UTF-8, values
    Python refuses, nesting too deep) gives the built-ins and an error naming it.
    """
    bounds = bounds or limits.Limits(max_bytes=PROFILES_MAX_BYTES)
    try:
        fd = os.open(profiles_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):  # a FIFO would block every pass
                raise WriteRefused(f"{boundedread.kind_of_mode(mode)}, not a regular file")
            with os.fdopen(os.dup(fd), "rb") as fh:
                raw = fh.read(bounds.max_bytes + 1)  # one byte past the limit, never more
            if len(raw) > bounds.max_bytes:  # how much more was never read: not said
                raise OverLimit(f"over the size limit: more than {bounds.max_bytes} bytes")
        finally:
            os.close(fd)
        text = raw.decode("utf-8")
        limits.check_text(text, bounds)
        data = tomllib.loads(text)
        limits.check_depth(data, bounds)
        return runtime.catalog_from_profiles(data)
    except FileNotFoundError:
        return runtime.catalog_from_profiles({})
    except Exception as exc:  # one bad file must not stop the passes: say what is wrong
        error = f"{profiles_file}: {errors.describe(exc)}"
        return Catalog(dict(runtime.BUILTIN_PROFILES), error=error)


def _kind(path: Path) -> str:
    try:
        return boundedread.kind_of_mode(os.lstat(path).st_mode)
    except OSError:
        return "unreadable"
