"""The one reader for files this daemon does not own: regular files only, never blocking, capped.

Every file another user may write or replace (hal0's ``api.env``, ``hal0.toml``, manifest and
Python sources, slot files, aiter's tables, the status and state files read back) is read here:
the open never follows a final symlink (unless the caller asks, for a path whose every component
root owns), never blocks on a FIFO or a device (``O_NONBLOCK``, then ``S_ISREG`` after
``fstat``), and never reads more than the cap (a file that grows after the ``fstat`` is refused
too). A refusal is a ``ReadRefused`` whose message says why in words, never the file's bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from hal0_reconciler.errors import ReconcilerError

_CHUNK = 1 << 16
_BASE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class ReadRefused(ReconcilerError):
    """A file was not read: not a regular file, a symlink, over its cap, or unreadable.

    ``reason`` is the short cause (no path), ``str()`` the whole line with the path.
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def read_bounded(
    path: Path | str,
    *,
    max_bytes: int,
    follow_links: bool = False,
    missing_ok: bool = False,
    dir_fd: int | None = None,
) -> bytes | None:
    """The bytes of a regular file of at most ``max_bytes``; None when missing and allowed.

    With ``dir_fd`` the path is opened relative to that folder (a bare name, never followed).
    Raises ``ReadRefused`` for anything else; a missing file without ``missing_ok`` too.
    """
    try:
        fd = _open_regular(path, follow_links=follow_links, dir_fd=dir_fd)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise ReadRefused(path, "missing") from None
    except NotADirectoryError:
        if missing_ok:
            return None
        raise ReadRefused(path, "missing (a parent is not a folder)") from None
    except OSError as exc:
        raise ReadRefused(path, _open_failure(exc)) from None
    try:
        return _read_fd(fd, path, max_bytes=max_bytes)
    finally:
        os.close(fd)


def _open_regular(path: Path | str, *, follow_links: bool, dir_fd: int | None) -> int:
    """Open for reading only what is a regular file at the instant of the open.

    An ``O_PATH`` fd pins the inode without opening it (a device's open may act, a FIFO's may
    block); only when ``fstat`` says it is a regular file is that very inode opened for reading
    through ``/proc/self/fd``. Without ``/proc`` the plain open is ``O_NONBLOCK`` and checked after.
    """
    nofollow = 0 if follow_links else os.O_NOFOLLOW
    pinned = os.open(path, os.O_PATH | os.O_CLOEXEC | nofollow, dir_fd=dir_fd)
    try:
        mode = os.fstat(pinned).st_mode
        if stat.S_ISLNK(mode):
            raise OSError(errno.ELOOP, "a symlink")
        if not stat.S_ISREG(mode):
            raise ReadRefused(path, f"{kind_of_mode(mode)}, not a regular file")
        try:
            return os.open(f"/proc/self/fd/{pinned}", _BASE_FLAGS)
        except FileNotFoundError:  # no /proc: open by name, checked again after
            return os.open(path, _BASE_FLAGS | nofollow, dir_fd=dir_fd)
    finally:
        os.close(pinned)


def read_bounded_text(
    path: Path | str,
    *,
    max_bytes: int,
    follow_links: bool = False,
    missing_ok: bool = False,
    dir_fd: int | None = None,
    encoding: str = "utf-8",
) -> str | None:
    """``read_bounded`` decoded; undecodable bytes are a ``ReadRefused`` naming the offset."""
    data = read_bounded(
        path, max_bytes=max_bytes, follow_links=follow_links, missing_ok=missing_ok, dir_fd=dir_fd
    )
    if data is None:
        return None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ReadRefused(path, f"not {encoding} text (byte {exc.start} is not valid)") from None


def read_fd(fd: int, path: Path | str, *, max_bytes: int) -> bytes:
    """The bytes behind an already opened fd (checked regular, capped); the fd stays open."""
    return _read_fd(fd, path, max_bytes=max_bytes)


def _read_fd(fd: int, path: Path | str, *, max_bytes: int) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ReadRefused(path, f"{kind_of_mode(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise ReadRefused(path, f"larger than the {max_bytes}-byte limit ({st.st_size} bytes)")
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := os.read(fd, min(_CHUNK, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # it grew after the fstat
                raise ReadRefused(path, f"larger than the {max_bytes}-byte limit (it grew)")
    except BlockingIOError:  # a regular file never blocks; a swapped-in one is refused
        raise ReadRefused(path, "would block") from None
    except OSError as exc:
        raise ReadRefused(path, f"cannot be read ({_words(exc)})") from None
    return b"".join(chunks)


def kind_of_mode(mode: int) -> str:
    """What a mode says a file is, in words."""
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _open_failure(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:  # pinned as a link, or swapped for one before the plain open
        return "a symlink (never followed)"
    return f"cannot be opened ({_words(exc)})"  # a folder or a socket is refused once pinned


def _words(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()
