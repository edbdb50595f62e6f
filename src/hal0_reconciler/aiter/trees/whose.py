"""Whose tree is it: the credentials an aiter tree is handled with, or why it is refused.

A tree is handled with the credentials of its JIT folder's owner. That is safe only when no one
else can change the way to the tree: every ancestor of the JIT and configs folders must be owned
by root or by that owner and writable by no one else (systemd-tmpfiles' "unsafe path transition"
rule; a root-owned sticky folder such as ``/tmp`` is writable by others but lets no one replace
an entry they do not own, so it passes as an ancestor). The JIT and configs folders themselves
must be writable by their owner alone, sticky or not: a folder others can write is nobody's tree
(anyone could plant modules, tables or a ``.hal0-quarantine`` there). A symlink on the way is
followed only when it is owned by root or by that owner. A JIT folder that does not exist yet
belongs to whoever owns the deepest folder that does (that user would create it): nothing is
there to heal.

Pure: the walk (``treeowner``) gathers ``Step`` facts; this module only judges them.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import PurePosixPath

ROOT_UID = 0


@dataclass(frozen=True)
class Step:
    """One component met on the way to a folder, as ``lstat`` saw it."""

    path: PurePosixPath
    uid: int
    gid: int
    mode: int

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


@dataclass(frozen=True)
class Way:
    """The steps to a folder (links included, in the order met) and where they led."""

    steps: tuple[Step, ...]
    real: PurePosixPath  # the folder with every link resolved
    exists: bool  # False: the last step is the deepest folder that exists
    error: str | None = None  # the walk itself failed (a loop, an unreadable folder)


def owner_uid(jit: Way) -> int:
    """The uid the tree is handled as: the JIT folder's owner, else the deepest existing
    folder's."""
    folders = [s for s in jit.steps if not s.is_link]
    return folders[-1].uid if folders else ROOT_UID


def step_problem(step: Step, owner: int) -> str | None:
    """Why ``step`` lets someone other than root or ``owner`` change the way; None: it does not."""
    who = "root" if owner == ROOT_UID else f"root or uid {owner}"
    if step.uid not in (ROOT_UID, owner):
        kind = "a symlink" if step.is_link else "a folder"
        return f"{step.path} is {kind} owned by uid {step.uid}, not {who}"
    if step.is_link or not step.is_dir:
        return None
    sticky_root = bool(step.mode & stat.S_ISVTX) and step.uid == ROOT_UID
    if step.mode & stat.S_IWOTH and not sticky_root:
        return f"{step.path} is writable by every user"
    if step.mode & stat.S_IWGRP and not sticky_root:
        return f"{step.path} is writable by group {step.gid}"
    return None


def way_problem(way: Way, owner: int, *, what: str, include_last: bool) -> str | None:
    """The first unsafe step on the way to a folder (its ancestors, links; the folder itself
    with ``include_last``), worded for the operator."""
    if way.error is not None:
        return f"{what} {way.real}: {way.error}"
    last_folder = max((i for i, s in enumerate(way.steps) if not s.is_link), default=-1)
    for i, step in enumerate(way.steps):
        if i == last_folder and way.exists and not include_last:
            continue
        problem = step_problem(step, owner)
        if problem is not None:
            return f"{what}: {problem}; refused (the way to a tree must be root's or its owner's)"
    return None


def root_only(way: Way) -> bool:
    """Whether every step of ``way``, the folder included, is root's and safe for root."""
    return way.exists and all(step_problem(s, ROOT_UID) is None for s in way.steps)


@dataclass(frozen=True)
class Verdict:
    """Whose credentials handle a tree, or why it is refused."""

    uid: int
    jit: Way
    configs: Way
    refused: str | None = None

    @property
    def as_root(self) -> bool:
        return self.uid == ROOT_UID


def judge(jit: Way, configs: Way) -> Verdict:
    """The verdict for a tree from the ways to its JIT and configs folders."""
    uid = owner_uid(jit)
    refused = (
        way_problem(jit, uid, what="JIT folder", include_last=False)
        or way_problem(configs, uid, what="configs folder", include_last=False)
        or shared_folder(jit, what="JIT folder")
        or shared_folder(configs, what="configs folder")
    )
    return Verdict(uid, jit, configs, refused)


def shared_folder(way: Way, *, what: str) -> str | None:
    """The folder itself (an existing one, links resolved) writable by its group or every
    user, sticky or not: nobody's tree; how to fix it is said."""
    last = way.steps[-1] if way.steps else None
    if not way.exists or last is None or last.is_link or not last.is_dir:
        return None
    mode = last.mode & 0o7777
    if mode & stat.S_IWOTH:
        who = "every user"
    elif mode & stat.S_IWGRP:
        who = f"group {last.gid}"
    else:
        return None
    owner = "root's" if last.uid == ROOT_UID else f"uid {last.uid}'s"
    return (
        f"{what} {last.path} is {owner} but writable by {who} (mode {mode:o}, sticky or not); "
        "refused: a folder others can write is nobody's tree (chmod go-w it, or give each "
        "user a tree of their own with its own jit_dir)"
    )
