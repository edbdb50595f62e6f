"""Each configured tree's ``TreeIO``, kept between surveys, and the checks that use it.

Per survey, the way to each tree's JIT and configs folders is walked again (``treeowner``): a
tree that is refused is not read at all; an accepted one keeps its ``TreeIO`` (the owner's child
for a tree root does not own) while its owner and roots stay the same, and gets a new one when
they change or the child died.

A slot's ``[server].env`` names the container's paths: ``AITER_JIT_DIR`` and ``AITER_CONFIG_*``
count only when literally beneath a configured tree's package or JIT folder (``outside``).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.trees import owner as treeowner
from hal0_reconciler.aiter.trees import owner_io as treeio
from hal0_reconciler.aiter.trees import whose
from hal0_reconciler.settings import AiterTree

HEADER_BYTES = 65536
"""How much of an untuned table is read for its header line."""

OUTSIDE = "not checked: path outside configured trees"


@dataclass(frozen=True)
class Access:
    """A tree's I/O and whose credentials it runs with, or why the tree is refused."""

    io: treeio.TreeIO | None
    owner: treeowner.TreeOwner
    handled_as: str
    refused_way: str | None = None

    @property
    def refused(self) -> str | None:
        return self.owner.refused or self.refused_way


class Trees:
    """The ``TreeIO`` of every tree, by its label."""

    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self._open: dict[str, tuple[tuple[object, ...], treeio.TreeIO]] = {}

    def access(self, label: str, tree: AiterTree, base_jit: Path) -> Access:
        """Judge the tree's owner again and give its I/O (the same child while nothing
        changed)."""
        owner = treeowner.owner_of(base_jit, tree.package_dir / "configs")
        if owner.refused is not None:
            self._drop(label)
            return Access(None, owner, f"refused: {owner.refused}")
        package = treeowner.walk(tree.package_dir)
        roots = [
            treeio.Root(PurePosixPath(base_jit), owner.verdict.jit.real),
            treeio.Root(PurePosixPath(tree.package_dir), package.real),
        ]
        for folder in configured_folders(tree.base_env):  # the operator's own pins
            way = treeowner.walk(folder)
            problem = whose.way_problem(
                way,
                owner.verdict.uid,
                what="a folder the base environment names",
                include_last=False,
            )
            if problem is not None:
                self._drop(label)
                return Access(None, owner, f"refused: {problem}", problem)
            roots.append(treeio.Root(PurePosixPath(folder), way.real))
        c = owner.credentials
        key: tuple[object, ...] = (c.uid, c.gid, c.groups, tuple(roots))
        held = self._open.get(label)
        if held is not None and held[0] == key and not _dead(held[1]):
            io = held[1]
        else:
            self._drop(label)
            io = treeio.open_tree(tuple(roots), c, timeout=self.timeout)
            if isinstance(io, treeio.ChildTree):
                io, why = _unreadable_configs(io, tree, owner, package)
                if why is not None:
                    io.close()
                    return Access(None, owner, f"refused: {why}", why)
            self._open[label] = (key, io)
        dead = getattr(io, "dead", None)
        handled = owner.describe() if dead is None else f"{owner.describe()}; {dead}"
        if isinstance(io, treeio.SplitTree):
            handled += "; its tables read by root (the owner cannot read the configs folder)"
        return Access(io, owner, handled)

    def io_for(self, path: PurePath | str) -> treeio.TreeIO | None:
        """The ``TreeIO`` of the tree ``path`` is literally beneath (for the heal, restore and
        prune to route their moves through); None when no open tree holds it."""
        for _, io in self._open.values():
            if not _dead(io) and io.beneath(path):
                return io
        return None

    def _drop(self, label: str) -> None:
        held = self._open.pop(label, None)
        if held is not None:
            held[1].close()

    def close(self) -> None:
        for label in list(self._open):
            self._drop(label)


def _unreadable_configs(
    io: treeio.ChildTree, tree: AiterTree, owner: treeowner.TreeOwner, package: whose.Way
) -> tuple[treeio.TreeIO, str | None]:
    """A configs folder the owner cannot read: root reads the tables itself only when the
    whole way to them is root's; else the tree is refused."""
    configs = tree.package_dir / "configs"
    try:
        io.listdir(configs)
    except PermissionError:
        if whose.root_only(owner.verdict.configs) and whose.root_only(package):
            return treeio.SplitTree(io, package_root=1), None
        return io, (
            f"configs folder {configs} cannot be read by {owner.credentials.user} and is not "
            "wholly root's"
        )
    except (OSError, boundedread.ReadRefused):
        pass
    return io, None


def configured_folders(base_env: dict[str, str]) -> list[Path]:
    """The folders of the absolute paths a tree's base environment (the operator's settings)
    pins: ``AITER_JIT_DIR`` itself, each ``AITER_CONFIG_*`` file's folder."""
    found: list[Path] = []
    for var, value in sorted(base_env.items()):
        if var == "AITER_JIT_DIR" and value.strip():
            found.append(Path(value))
        elif var.startswith("AITER_CONFIG_"):
            found.extend(
                Path(p.strip()).parent
                for p in value.split(":")
                if p.strip() and PurePosixPath(p.strip()).is_absolute()
            )
    return list(dict.fromkeys(found))


def _dead(io: treeio.TreeIO) -> bool:
    return getattr(io, "dead", None) is not None


def outside(io: treeio.TreeIO, env: dict[str, str], *, jit_from_env: bool) -> list[tuple[str, str]]:
    """The (variable, path) pairs of a slot's env that name paths outside the tree's roots.

    ``AITER_JIT_DIR`` counts only when it chooses the JIT folder (``jit_from_env``); each
    ``:``-separated part of an ``AITER_CONFIG_*`` value is checked (empty parts name nothing).
    A relative path is outside too: the container's working folder is unknown."""
    found: list[tuple[str, str]] = []
    for var, value in sorted(env.items()):
        if var == "AITER_JIT_DIR" and jit_from_env and value:
            parts = [value]
        elif var.startswith("AITER_CONFIG_"):
            parts = [p.strip() for p in value.split(":") if p.strip()]
        else:
            continue
        found.extend(
            (var, part)
            for part in parts
            if not PurePosixPath(part).is_absolute() or not io.beneath(part)
        )
    return found


def listdir(io: treeio.TreeIO, folder: PurePath) -> list[str]:
    """The names in a folder of the tree; none when it cannot be listed."""
    try:
        return io.listdir(folder)
    except (OSError, boundedread.ReadRefused):
        return []


def fixed_files(io: treeio.TreeIO, configs: PurePath, patterns: tuple[str, ...]) -> list[Path]:
    """The regular files fixed globs under ``configs/`` name (sorted, as aiter's generator globs
    them): each pattern's folder is listed through the tree, never through a link."""
    found: list[Path] = []
    for pattern in patterns:
        sub, _, glob = pattern.rpartition("/")
        folder = configs / sub if sub else configs
        found.extend(
            Path(folder / name)
            for name in sorted(listdir(io, folder))
            if fnmatch.fnmatchcase(name, glob) and io.is_file(folder / name)
        )
    return list(dict.fromkeys(found))


def header_line(io: treeio.TreeIO, path: PurePath) -> str | None:
    """The first line of a regular file of the tree (at most ``HEADER_BYTES``); None when it
    cannot be read."""
    try:
        fd, _ = io.open_regular(path)
    except (OSError, boundedread.ReadRefused):
        return None
    try:
        head = os.pread(fd, HEADER_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return head.split(b"\n", 1)[0].decode("utf-8-sig", errors="replace")


def within(tree: AiterTree, base_jit: Path, path: Path) -> bool:
    """Whether ``path`` is literally beneath the tree's package or base JIT folder."""
    p = PurePosixPath(path)
    if ".." in p.parts:
        return False
    return any(p == r or r in p.parents for r in map(PurePosixPath, (tree.package_dir, base_jit)))
