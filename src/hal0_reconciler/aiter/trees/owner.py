"""The walk to a tree's folders and the credentials of its owner (the I/O side of ``whose``).

Each component from ``/`` down is ``lstat``-ed; a symlink is read and its target walked in turn
(at most 40, as the kernel does), so every link and folder the path goes through is judged by
``whose.judge``. Nothing here opens a file: the walk only looks.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hal0_reconciler.aiter.trees import whose
from hal0_reconciler.model import Credentials

_MAX_LINKS = 40


def walk(path: os.PathLike[str] | str) -> whose.Way:
    """Every step on the way to ``path`` (absolute), links followed and recorded."""
    steps: list[whose.Step] = []
    cur = PurePosixPath("/")
    try:
        st = os.lstat(cur)
    except OSError as exc:  # pragma: no cover - "/" is always there
        return whose.Way((), cur, exists=False, error=_words(exc))
    steps.append(whose.Step(cur, st.st_uid, st.st_gid, st.st_mode))
    todo = list(PurePosixPath(os.fspath(path)).parts)
    if not todo or todo[0] != "/":
        return whose.Way((), PurePosixPath(os.fspath(path)), exists=False, error="not absolute")
    todo.pop(0)
    links = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = cur.parent
            continue
        nxt = cur / name
        try:
            st = os.lstat(nxt)
        except (FileNotFoundError, NotADirectoryError):
            return whose.Way(tuple(steps), nxt, exists=False)
        except OSError as exc:
            return whose.Way(tuple(steps), nxt, exists=False, error=_words(exc))
        steps.append(whose.Step(nxt, st.st_uid, st.st_gid, st.st_mode))
        if steps[-1].is_link:
            links += 1
            if links > _MAX_LINKS:
                return whose.Way(tuple(steps), nxt, exists=False, error="too many symlinks")
            try:
                target = PurePosixPath(os.readlink(nxt))
            except OSError as exc:
                return whose.Way(tuple(steps), nxt, exists=False, error=_words(exc))
            parts = list(target.parts)
            if target.is_absolute():
                cur = PurePosixPath("/")
                parts.pop(0)
            todo[:0] = parts
            continue
        cur = nxt
    return whose.Way(tuple(steps), cur, exists=True)


def credentials_of(uid: int, gid_hint: int) -> Credentials:
    """``uid``'s primary gid and groups from the user database; a uid it does not know keeps
    only ``gid_hint`` (the folder's group)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return Credentials(str(uid), uid, gid_hint, (gid_hint,), why="no user database entry")
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return Credentials(
        entry.pw_name,
        uid,
        entry.pw_gid,
        tuple(dict.fromkeys([entry.pw_gid, *groups])),
        why="owner of the JIT folder",
    )


@dataclass(frozen=True)
class TreeOwner:
    """A tree's verdict and, when accepted, the credentials its files are handled with."""

    verdict: whose.Verdict
    credentials: Credentials

    @property
    def refused(self) -> str | None:
        return self.verdict.refused

    @property
    def as_root(self) -> bool:
        return self.verdict.as_root

    def describe(self) -> str:
        """Whose credentials, in words (``aiter plan`` and the journal)."""
        c = self.credentials
        if self.refused is not None:
            return f"refused: {self.refused}"
        if c.uid == 0:
            return "root (the tree is root's)"
        return f"{c.user} (uid {c.uid}, gid {c.gid}; the JIT folder's owner)"


def owner_of(jit_dir: Path, configs_dir: Path) -> TreeOwner:
    """Walk to both folders and judge whose tree it is."""
    jit, configs = walk(jit_dir), walk(configs_dir)
    verdict = whose.judge(jit, configs)
    folders = [s for s in jit.steps if not s.is_link]
    gid = folders[-1].gid if folders else 0
    return TreeOwner(verdict, credentials_of(verdict.uid, gid))


def _words(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()
