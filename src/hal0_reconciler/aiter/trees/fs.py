"""Tree-relative path operations that never follow a link: the only way into an aiter tree.

A tree root is opened once as a directory fd; every path inside it is a relative path resolved
*beneath* that fd. Where the kernel has ``openat2`` (Linux 5.6+) the resolution is one call with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`` (through ``ctypes``); elsewhere
each component is opened with ``O_PATH | O_DIRECTORY | O_NOFOLLOW`` relative to the last. Either
way a symlink anywhere inside the tree is an ``ELOOP`` error and ``..`` or an absolute path is
refused before any call.

Reads go through ``boundedread`` (regular files only, never blocking, capped); a module is opened
as an fd of a regular file (``O_NONBLOCK``, ``S_ISREG`` after ``fstat``) for bounded reads, never
through a link. Renames, mkdir, atomic writes and ``rmtree`` act on names in folders held by fd;
``rmtree`` never follows a link and never crosses into another filesystem.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import secrets
import stat
from pathlib import PurePosixPath

from hal0_reconciler import boundedread

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
_RENAME_NOREPLACE = 1
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


STAT_FIELDS = ("mode", "uid", "gid", "size", "dev", "ino", "mtime_ns", "ctime_ns")
"""What of a file's ``stat`` crosses from the owner's child to root, in this order."""


def stat_values(st: os.stat_result) -> list[int]:
    """``st``'s ``STAT_FIELDS``, in order: the wire form of a stat (``treeio.Stat`` reads it)."""
    return [getattr(st, f"st_{name}") for name in STAT_FIELDS]


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - a libc is always there on Linux
        return None


_LIBC = _libc()


def _probe_openat2() -> bool:
    if _LIBC is None or _SYS_OPENAT2 is None:
        return False
    try:
        fd = _openat2_raw(os.open("/", _DIR), ".", _DIR, close_dir=True)
    except OSError:
        return False
    os.close(fd)
    return True


def _openat2_raw(dir_fd: int, rel: str, flags: int, mode: int = 0, *, close_dir: bool) -> int:
    if _LIBC is None or _SYS_OPENAT2 is None:  # the probe then said no: OPENAT2 is False
        raise OSError(errno.ENOSYS, "openat2 is not available", rel)
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE)
    try:
        fd = int(
            _LIBC.syscall(
                ctypes.c_long(_SYS_OPENAT2),
                ctypes.c_int(dir_fd),
                ctypes.c_char_p(os.fsencode(rel)),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        err = ctypes.get_errno()
    finally:
        if close_dir:
            os.close(dir_fd)
    if fd < 0:
        raise OSError(err, os.strerror(err), rel)
    return fd


OPENAT2 = _probe_openat2()
"""Whether ``openat2`` resolves paths here (tests set it False to exercise the fallback)."""


class OutsideTree(OSError):
    """A path that is not a plain relative path beneath a tree root (absolute, ``..``, empty)."""


def parts_of(rel: str) -> tuple[str, ...]:
    """The components of a relative path beneath a root; ``OutsideTree`` for anything else.

    ``""`` and ``"."`` are the root itself (no components)."""
    if rel in ("", "."):
        return ()
    path = PurePosixPath(rel)
    if path.is_absolute() or "\x00" in rel:
        raise OutsideTree(errno.EXDEV, "not a relative path beneath the tree", rel)
    parts = tuple(p for p in path.parts if p != ".")
    if ".." in parts:
        raise OutsideTree(errno.EXDEV, "'..' leaves the tree", rel)
    return parts


def open_root(path: os.PathLike[str] | str) -> int:
    """The tree root as an ``O_PATH`` directory fd (the caller vetted the way to it)."""
    return os.open(path, _DIR)


def open_beneath(root_fd: int, rel: str, flags: int, mode: int = 0o600) -> int:
    """Open ``rel`` beneath ``root_fd`` with ``flags`` (``O_CLOEXEC`` added), no link followed.

    A symlink as any component, the last included, is ``ELOOP``; with ``O_PATH`` too."""
    parts = parts_of(rel)
    flags |= os.O_CLOEXEC
    if not parts:
        return os.open(".", flags, dir_fd=root_fd)
    if OPENAT2:
        fd = _openat2_raw(root_fd, "/".join(parts), flags, mode, close_dir=False)
    else:
        parent = _walk(root_fd, parts[:-1])
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW, mode, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ENOTDIR and _is_link(parent, parts[-1]):
                raise OSError(errno.ELOOP, "a symlink (never followed)", rel) from None
            raise
        finally:
            os.close(parent)
    if flags & os.O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.ELOOP, "a symlink (never followed)", rel)
    return fd


def _walk(root_fd: int, parts: tuple[str, ...]) -> int:
    """A new directory fd for ``parts`` beneath ``root_fd``, one ``O_NOFOLLOW`` step at a time."""
    fd = os.open(".", _DIR, dir_fd=root_fd)
    for part in parts:
        try:
            nxt = os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ENOTDIR and _is_link(fd, part):
                raise OSError(errno.ELOOP, "a symlink (never followed)", part) from None
            raise
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_dir(root_fd: int, rel: str) -> int:
    """A folder beneath the root as an ``O_PATH`` fd (``ENOTDIR``/``ELOOP`` otherwise)."""
    return open_beneath(root_fd, rel, _DIR)


def parent_of(root_fd: int, rel: str) -> tuple[int, str]:
    """The fd of ``rel``'s folder (the caller closes it) and ``rel``'s last name."""
    parts = parts_of(rel)
    if not parts:
        raise OutsideTree(errno.EINVAL, "the tree root has no name inside the tree", rel)
    return open_dir(root_fd, "/".join(parts[:-1])), parts[-1]


def lstat_at(root_fd: int, rel: str) -> os.stat_result | None:
    """``lstat`` of ``rel`` beneath the root; None when it (or a folder on the way) is missing."""
    try:
        if not parts_of(rel):
            return os.stat(root_fd)
        parent, name = parent_of(root_fd, rel)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    finally:
        os.close(parent)


def listdir_at(root_fd: int, rel: str) -> list[str]:
    """The names in a folder beneath the root (sorted). Raises OSError."""
    fd = open_beneath(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def open_regular(root_fd: int, rel: str) -> int:
    """An fd open for reading on the regular file ``rel`` (never a link, FIFO or device).

    The inode is pinned with ``O_PATH`` and opened only once ``fstat`` says it is regular;
    raises ``boundedread.ReadRefused`` for anything else, OSError when it cannot be opened."""
    pin = open_beneath(root_fd, rel, os.O_PATH)
    try:
        mode = os.fstat(pin).st_mode
        if not stat.S_ISREG(mode):
            raise boundedread.ReadRefused(
                rel, f"{boundedread.kind_of_mode(mode)}, not a regular file"
            )
        fd = os.open(f"/proc/self/fd/{pin}", _READ_FLAGS)
    finally:
        os.close(pin)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # pragma: no cover - the pinned inode
        os.close(fd)
        raise boundedread.ReadRefused(rel, "not a regular file")
    return fd


def read_at(root_fd: int, rel: str, *, max_bytes: int, missing_ok: bool = False) -> bytes | None:
    """The bytes of the regular file ``rel`` (``boundedread`` in its folder, capped)."""
    try:
        parent, name = parent_of(root_fd, rel)
    except (FileNotFoundError, NotADirectoryError):
        if missing_ok:
            return None
        raise boundedread.ReadRefused(rel, "missing") from None
    except OSError as exc:
        raise boundedread.ReadRefused(rel, _words(exc)) from None
    try:
        return boundedread.read_bounded(
            name, max_bytes=max_bytes, missing_ok=missing_ok, dir_fd=parent
        )
    finally:
        os.close(parent)


def mkdir_at(root_fd: int, rel: str, mode: int = 0o755) -> None:
    """Make the folder ``rel`` (its parent must exist). Raises FileExistsError and OSError."""
    parent, name = parent_of(root_fd, rel)
    try:
        os.mkdir(name, mode, dir_fd=parent)
    finally:
        os.close(parent)


def rename_at(root_fd: int, src: str, dst: str, *, noreplace: bool = True) -> None:
    """Rename ``src`` to ``dst`` inside the tree; with ``noreplace`` an existing ``dst`` is
    ``FileExistsError`` (``renameat2(RENAME_NOREPLACE)``, atomic)."""
    src_dir, src_name = parent_of(root_fd, src)
    try:
        dst_dir, dst_name = parent_of(root_fd, dst)
        try:
            if noreplace:
                renameat2_noreplace(src_dir, src_name, dst_dir, dst_name)
            else:
                os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        finally:
            os.close(dst_dir)
    finally:
        os.close(src_dir)


def renameat2_noreplace(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Rename the name ``src`` in ``src_dir`` to ``dst`` in ``dst_dir``; an existing ``dst`` is
    ``FileExistsError``, never replaced (``renameat2(RENAME_NOREPLACE)``, atomic). Where libc
    or the filesystem lacks it (ENOSYS, EINVAL): check, then rename (racy, but beneath)."""
    fn = getattr(_LIBC, "renameat2", None)
    if fn is not None:
        rc = fn(
            ctypes.c_int(src_dir),
            ctypes.c_char_p(os.fsencode(src)),
            ctypes.c_int(dst_dir),
            ctypes.c_char_p(os.fsencode(dst)),
            ctypes.c_uint(_RENAME_NOREPLACE),
        )
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in {errno.ENOSYS, errno.EINVAL}:
            raise OSError(err, os.strerror(err), dst)
    try:
        os.stat(dst, dir_fd=dst_dir, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        return
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)


def fsync_dir_at(root_fd: int, rel: str) -> None:
    """``fsync`` a folder beneath the root (a rename inside it is then durable)."""
    fd = open_beneath(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_at(root_fd: int, rel: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``rel`` beneath the root with ``data`` (see ``write_atomic_in``)."""
    parent, name = parent_of(root_fd, rel)
    try:
        write_atomic_in(parent, name, data, mode)
    finally:
        os.close(parent)


def write_atomic_in(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Replace ``name`` in the open folder ``dir_fd`` with ``data``: a fresh temp file beside it
    (``.NAME.HEX.tmp``, ``O_EXCL | O_NOFOLLOW``, ``mode`` whatever the umask), fsynced, renamed
    over it, the folder fsynced. A symlink at ``name`` is replaced, not followed."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        mode,
        dir_fd=dir_fd,
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def rmtree_at(root_fd: int, rel: str) -> None:
    """Remove the folder ``rel`` beneath the root and all in it (see ``rmtree_in``)."""
    parent, name = parent_of(root_fd, rel)
    try:
        rmtree_in(parent, name)
    finally:
        os.close(parent)


def rmtree_in(dir_fd: int, name: str) -> None:
    """Remove the folder ``name`` in the open folder ``dir_fd`` and all it holds, by folder fds:
    links are removed, never followed; a folder swapped for a link midway stops the removal
    (``ELOOP``), and so does a folder on another filesystem, a mount inside (``EXDEV``)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder (never followed)", name)
    _rmtree_in(dir_fd, name, os.fstat(dir_fd).st_dev)


def _rmtree_in(parent: int, name: str, dev: int) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        if os.fstat(fd).st_dev != dev:
            raise OSError(errno.EXDEV, "another filesystem is mounted here; not removed", name)
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _rmtree_in(fd, entry, dev)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def _words(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink on the way (never followed)"
    return f"cannot be opened ({(exc.strerror or type(exc).__name__).lower()})"
