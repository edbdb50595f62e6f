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
from collections.abc import Sequence
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
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            for chunk in [data] if isinstance(data, bytes) else data:  # pieces: not joined
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            if uid is not None or gid is not None:
                os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_dir:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
