"""Folder operations of the quarantine code, each relative to an open folder fd, never following.

No call here hands the kernel a path of more than one component: every name is opened beside a
folder fd with ``O_NOFOLLOW`` (a symlink is refused, never followed), folders the quarantine code
made are checked to be real folders owned by the identity that made them and writable by no one
else, and renames never replace what is there (``renameat2(RENAME_NOREPLACE)``). Written so the
same calls can later run unchanged in a child holding the tree owner's credentials.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable

from hal0_reconciler import boundedread, fsio
from hal0_reconciler.aiter.trees import fs as treefs
from hal0_reconciler.errors import ReconcilerError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

rename_hook: Callable[[int], None] | None = None
"""Called with the rename's number (0, 1, …) before every rename of a heal, restore or roll;
``None`` in the daemon. Tests set it to stop a real process at a chosen rename."""


class HealFailed(ReconcilerError):
    """A quarantine, restore, roll or prune failed or was refused (the message says what was
    undone and what was left)."""


class FolderRefused(HealFailed):
    """A folder is not what it must be (a link, a file, someone else's, writable by others)."""


def is_component(name: str) -> bool:
    """One plain path component: not empty, no ``/`` or NUL, not ``.`` or ``..``."""
    return bool(name) and name not in {".", ".."} and "/" not in name and "\0" not in name


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The entry itself (a link is not followed), or None when there is none."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_dir(dir_fd: int, name: str, *, label: str) -> int:
    """Open folder ``name`` beside ``dir_fd``; a link or a non-folder is refused (FolderRefused).
    Raises FileNotFoundError when there is no such entry."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
            st = lstat_at(dir_fd, name)
            kind = boundedread.kind_of_mode(st.st_mode) if st is not None else "not a folder"
            raise FolderRefused(f"{label} is {kind}, not a real folder: refused") from None
        raise


def open_owned_dir(
    dir_fd: int, name: str, *, uid: int, label: str, create: bool = False, mode: int = 0o700
) -> int:
    """Open (or first make) a folder the quarantine code owns: a real folder, owned by ``uid``,
    writable by neither group nor others; anything else is refused loudly (FolderRefused)."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=dir_fd)
    fd = open_dir(dir_fd, name, label=label)
    st = os.fstat(fd)
    problem = ""
    if st.st_uid != uid:
        problem = f"owned by uid {st.st_uid}, not by uid {uid} who made it"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        os.close(fd)
        raise FolderRefused(f"{label} is {problem}: refused")
    return fd


def make_dir(dir_fd: int, name: str, *, mode: int = 0o700) -> bool:
    """Make a folder; False when the name is taken (never reused)."""
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        return False
    return True


def rename_noreplace(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """Rename ``src`` beside ``src_fd`` to ``dst`` beside ``dst_fd``; FileExistsError when the
    destination exists (never replaced). Links are renamed, never followed."""
    treefs.renameat2_noreplace(src_fd, src, dst_fd, dst)


def write_file(dir_fd: int, name: str, data: bytes, *, mode: int = 0o600) -> None:
    """Write one of the quarantine's own files durably in its own folder (``treefs``'s atomic
    write: temp file, fsync, rename, folder fsync)."""
    treefs.write_atomic_in(dir_fd, name, data, mode)


def read_file(dir_fd: int, name: str, *, max_bytes: int) -> bytes | None:
    """A regular file beside ``dir_fd`` (never a link, never blocking, capped: ReadRefused);
    None when there is none."""
    return boundedread.read_bounded(name, max_bytes=max_bytes, missing_ok=True, dir_fd=dir_fd)


def unlink_if_present(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def entries(dir_fd: int) -> list[str]:
    """The names in the open folder (the fd's offset is left alone: a dup is listed)."""
    dup = os.dup(dir_fd)
    try:
        return sorted(os.listdir(dup))
    finally:
        os.close(dup)


def rmtree(dir_fd: int, name: str, *, label: str) -> None:
    """Remove folder ``name`` beside ``dir_fd`` and all it holds (``treefs.rmtree_in``: by
    folder fds, links removed, never followed). A link or a non-folder where a folder was, and a
    mount inside (another filesystem), stop the removal: FolderRefused, what is left stays."""
    try:
        treefs.rmtree_in(dir_fd, name)
    except OSError as exc:
        where = label if exc.filename in {None, name} else f"{label}/.../{exc.filename}"
        if exc.errno == errno.EXDEV:
            raise FolderRefused(
                f"{where}: another filesystem is mounted there: not removed"
            ) from None
        if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
            raise FolderRefused(f"{where} is not a real folder (a link?): not removed") from None
        raise


def fsync_dirs(fds: list[int]) -> None:
    """Make the renames in these folders durable."""
    for fd in dict.fromkeys(fds):
        os.fsync(fd)


def open_jit(path: os.PathLike[str] | str) -> int:
    """The JIT folder as a folder fd (a link as its last component is refused)."""
    try:
        return os.open(path, DIR_FLAGS)
    except OSError as exc:
        if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
            raise FolderRefused(f"{path} is not a real folder: refused") from None
        raise


identity = fsio.identity_of  # (device, inode, size, mtime_ns): a rebuild, not the file put back
