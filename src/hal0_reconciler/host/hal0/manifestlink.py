"""A symlinked ``manifest.json`` (hal0 follows links; root follows one only on root's ground).

hal0 reads its manifest with a plain ``open()``, so a link there is followed. Root does the
same only when nobody but root could have made or redirected it: every link on the way and the
file it reaches are root's, each in a folder root owns that no one else can change (not
writable by group or others, or sticky: others cannot replace root's entries there), and the
end is a regular file root owns that no one else may write. Anything else is refused, loudly,
by the caller (a manifest that cannot be read gives no pins: every slot is kept).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_HOPS = 8
"""Links followed at most (a longer chain is refused)."""


class LinkRefused(Exception):
    """The link is not followed; ``str()`` says why."""


def real_manifest(path: Path) -> Path:
    """``path`` itself when it is no link; else the regular file its links reach, when all is
    root's (see the module docstring); raises ``LinkRefused`` otherwise."""
    current = path
    for _hop in range(MAX_HOPS + 1):
        try:
            info = os.lstat(current)
        except OSError as exc:
            if current == path:
                return path  # missing or unreadable: the caller's read says so
            msg = f"a symbolic link to {current}, which cannot be read ({exc.strerror})"
            raise LinkRefused(msg) from None
        if current == path and not stat.S_ISLNK(info.st_mode):
            return path  # no link: read as any manifest
        _check_folders(current.parent)
        if not stat.S_ISLNK(info.st_mode):
            if not stat.S_ISREG(info.st_mode):
                raise LinkRefused(f"a symbolic link to {current}, which is not a regular file")
            if info.st_uid != 0 or info.st_mode & 0o022:
                msg = f"a symbolic link to {current}, which root does not own alone"
                raise LinkRefused(msg)
            return current
        if info.st_uid != 0:
            raise LinkRefused(f"a symbolic link ({current}) that is not root's")
        target = Path(os.readlink(current))
        current = target if target.is_absolute() else current.parent / target
    raise LinkRefused(f"a chain of more than {MAX_HOPS} symbolic links")


def _check_folders(folder: Path) -> None:
    """Every folder from ``folder`` up to ``/`` is root's and only root can change its
    entries; raises ``LinkRefused`` naming the first that is not."""
    for each in (folder, *folder.parents):
        try:
            info = os.lstat(each)
        except OSError as exc:
            raise LinkRefused(f"{each} cannot be read ({exc.strerror})") from None
        if stat.S_ISLNK(info.st_mode):
            each = each.resolve()  # noqa: PLW2901 - a linked folder is judged where it leads
            _check_folders(each)
            return
        if info.st_uid != 0:
            raise LinkRefused(f"a symbolic link in {each}, which is not root's")
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            raise LinkRefused(f"a symbolic link in {each}, which others may change")
