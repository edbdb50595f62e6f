"""File operations inside one aiter tree, with the credentials of the tree's owner.

A ``TreeIO`` knows the tree's roots (its JIT and package folders, as configured and as resolved)
and names every file relative to one of them. A tree root owns runs in this process through
``treefs`` (``LocalTree``); any other tree is handled by the owner's child (``ChildTree``): a
process that drops to the owner's credentials and answers over a socket, each exchange with a
timeout — a child that does not answer in time is killed, and from then on every operation on
that tree fails with ``TreeUnavailable`` (an error for that tree, never a hang).

Paths outside every root are ``treefs.OutsideTree``: nothing outside a tree is ever touched.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import hal0_reconciler
from hal0_reconciler import boundedread, errors
from hal0_reconciler.aiter.quarantine import as_owner_child as owner_heal_child
from hal0_reconciler.aiter.registry import scan as modulescan
from hal0_reconciler.aiter.trees import child as treechild
from hal0_reconciler.aiter.trees import fs as treefs
from hal0_reconciler.host import proc
from hal0_reconciler.model import Credentials

_CHILD_ENV = {"LC_ALL": "C"}
_PACKAGE_PARENT = str(Path(hal0_reconciler.__file__).resolve().parents[1])
_Answer = tuple[dict[str, Any], int | None]
ROOT = Credentials("root", 0, 0, (0,), why="the tree is root's")


class TreeUnavailable(OSError):
    """The owner's child is gone (it died, timed out, or could not start): nothing was done."""


@dataclass(frozen=True)
class Root:
    """A tree root as configured (the path plans name) and as resolved (the path opened)."""

    configured: PurePosixPath
    real: PurePosixPath


@dataclass(frozen=True)
class Stat:
    """What ``lstat`` says of a file inside a tree."""

    mode: int
    uid: int
    gid: int
    size: int
    dev: int
    ino: int
    mtime_ns: int
    ctime_ns: int

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @classmethod
    def of(cls, st: os.stat_result) -> Stat:
        return cls(*treefs.stat_values(st))


def locate(roots: tuple[Root, ...], path: PurePath | str) -> tuple[int, str]:
    """The root index and relative path of ``path``, literally beneath one root (no ``..``)."""
    p = PurePosixPath(path)
    if ".." in p.parts:
        raise treefs.OutsideTree(0, "'..' in a path inside a tree", str(path))
    best: tuple[int, int, str] | None = None
    for i, root in enumerate(roots):
        for base in (root.configured, root.real):
            if p == base or base in p.parents:
                rel = str(p.relative_to(base))
                depth = len(base.parts)
                if best is None or depth > best[0]:
                    best = (depth, i, rel)
    if best is None:
        raise treefs.OutsideTree(0, "outside every configured tree", str(path))
    return best[1], best[2]


class TreeIO:
    """The operations; subclasses run them here or in the owner's child."""

    def __init__(self, roots: tuple[Root, ...], credentials: Credentials) -> None:
        self.roots = roots
        self.credentials = credentials

    def beneath(self, path: PurePath | str) -> bool:
        """Whether ``path`` is literally beneath one of this tree's roots."""
        try:
            locate(self.roots, path)
        except treefs.OutsideTree:
            return False
        return True

    def call(self, op: str, path: PurePath | str, **args: Any) -> _Answer:
        raise NotImplementedError

    def lstat(self, path: PurePath | str) -> Stat | None:
        """``lstat`` beneath the tree; None when missing. Raises OSError."""
        try:
            answer, _ = self.call("lstat", path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # the tree root itself is missing
        raw = answer.get("stat")
        return None if raw is None else Stat(*(int(x) for x in raw))

    def is_file(self, path: PurePath | str) -> bool:
        """A regular file (not through a link); False for anything else or when unreachable."""
        try:
            st = self.lstat(path)
        except OSError:
            return False
        return st is not None and st.is_file

    def listdir(self, path: PurePath | str) -> list[str]:
        """The names in a folder of the tree (sorted). Raises OSError."""
        answer, _ = self.call("list", path)
        return [str(n) for n in answer.get("names", [])]

    def open_regular(self, path: PurePath | str) -> tuple[int, Stat]:
        """An fd for reading the regular file ``path`` (the caller closes it) and its stat.

        Raises ``boundedread.ReadRefused`` (not regular, a link) or OSError."""
        answer, fd = self.call("open", path)
        if fd is None:
            raise TreeUnavailable(0, "no descriptor in the answer", str(path))
        return fd, Stat(*(int(x) for x in answer["stat"]))

    def read(self, path: PurePath | str, *, max_bytes: int) -> bytes:
        """The bytes of a regular file of the tree, capped. Raises ReadRefused or OSError."""
        fd, _ = self.open_regular(path)
        try:
            return boundedread.read_fd(fd, str(path), max_bytes=max_bytes)
        finally:
            os.close(fd)

    def scan(
        self,
        path: PurePath | str,
        names: list[str],
        *,
        max_bytes: int,
        budget: float | None = None,
    ) -> tuple[Stat, modulescan.Outcome, frozenset[str]]:
        """Which of ``names`` the module ``path`` registered (``modulescan``, bounded reads), as
        the tree's owner: its stat at open, the outcome, the names found. Raises ReadRefused
        (not regular, a link) or OSError."""
        data = json.dumps(names).encode()
        answer, fd = self.call("scan", path, data=data, max_bytes=max_bytes, budget=budget)
        if fd is not None:
            os.close(fd)
        try:
            outcome = modulescan.Outcome(answer["outcome"])
            found = frozenset(names[int(i)] for i in answer["found"])
            st = Stat(*(int(x) for x in answer["stat"]))
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise boundedread.ReadRefused(str(path), f"a scan answered garbage: {exc}") from None
        return st, outcome, found

    def mkdir(self, path: PurePath | str, mode: int = 0o755) -> None:
        self.call("mkdir", path, mode=mode)

    def rename(self, src: PurePath | str, dst: PurePath | str, *, noreplace: bool = True) -> None:
        """Rename inside one root of the tree (never replacing, unless asked)."""
        src_root, _ = locate(self.roots, src)
        dst_root, dst_rel = locate(self.roots, dst)
        if src_root != dst_root:
            raise treefs.OutsideTree(18, "a rename between two tree roots", str(dst))
        self.call("rename", src, dst=dst_rel, noreplace=noreplace)

    def rmtree(self, path: PurePath | str) -> None:
        self.call("rmtree", path)

    def fsync_dir(self, path: PurePath | str) -> None:
        self.call("fsync", path)

    def write_atomic(self, path: PurePath | str, data: bytes, mode: int = 0o644) -> None:
        """Replace a small file (at most ``treechild.MAX_WRITE`` bytes) atomically."""
        if len(data) > treechild.MAX_WRITE:
            raise boundedread.ReadRefused(str(path), "too large to write through the tree")
        self.call("write", path, data=data, mode=mode)

    def close(self) -> None:
        """Release what this tree holds (the owner's child)."""

    def describe(self) -> str:
        c = self.credentials
        return "root" if c.uid == 0 else f"{c.user} (uid {c.uid}, gid {c.gid})"


class LocalTree(TreeIO):
    """A tree root owns, in this process, with the same primitives."""

    def call(self, op: str, path: PurePath | str, **args: Any) -> _Answer:
        index, rel = locate(self.roots, path)
        worker = treechild.Child([str(r.real) for r in self.roots])
        fds: list[int] = []
        try:
            if "data" in args:  # bulk input (a file to write, names to look for) goes by fd
                fds = [_memfd(args.pop("data"))]
            answer, out = worker.handle({"op": op, "root": index, "path": rel, **args}, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return _checked(answer, path), (out[0] if out else None)


class ChildTree(TreeIO):
    """A tree handled by the owner's child."""

    def __init__(
        self, roots: tuple[Root, ...], credentials: Credentials, *, timeout: float
    ) -> None:
        super().__init__(roots, credentials)
        self.timeout = timeout
        self.dead: str | None = None
        self._sock: socket.socket | None = None
        self._server: proc.Server | None = None
        self.child_uid: int | None = None
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c = self.credentials
        spec = {
            "uid": c.uid,
            "gid": c.gid,
            "groups": list(c.groups),
            "roots": [str(r.real) for r in self.roots],
            "fd": theirs.fileno(),
            "openat2": treefs.OPENAT2,
        }
        # -s -P: no user site, not the working folder; the package is found where this one is
        argv = [sys.executable, "-s", "-P", "-m", "hal0_reconciler.aiter.trees.child"]
        env = {**_CHILD_ENV, "PYTHONPATH": _PACKAGE_PARENT}
        try:
            self._server = proc.spawn(
                [*argv, json.dumps(spec)], pass_fds=[theirs.fileno()], env=env
            )
        except errors.ProcFailed as exc:
            ours.close()
            self.dead = str(exc)
            return
        finally:
            theirs.close()
        self._sock = ours
        ours.settimeout(self.timeout)
        try:
            hello = self._receive()[0]
        except TreeUnavailable:
            return
        if "error" in hello or hello.get("uid") != c.uid:
            self._kill(f"the owner's child as {self.describe()}: {hello.get('error', hello)}")
            return
        self.child_uid = int(hello["uid"])

    def _receive(self) -> tuple[dict[str, Any], list[int]]:
        assert self._sock is not None  # noqa: S101 - set before any exchange
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self._sock, treechild.MAX_MESSAGE, 2)
        except TimeoutError:
            self._kill(f"the owner's child as {self.describe()} did not answer in {self.timeout}s")
            raise TreeUnavailable(0, str(self.dead)) from None
        except OSError as exc:
            self._kill(f"the owner's child as {self.describe()} died ({exc.strerror or exc})")
            raise TreeUnavailable(0, str(self.dead)) from None
        if not msg:
            self._kill(f"the owner's child as {self.describe()} died")
            raise TreeUnavailable(0, str(self.dead))
        try:
            answer = json.loads(msg)
            if not isinstance(answer, dict):
                raise ValueError("not an object")  # noqa: TRY301, TRY004
        except ValueError:
            for fd in fds:
                os.close(fd)
            self._kill(f"the owner's child as {self.describe()} answered garbage")
            raise TreeUnavailable(0, str(self.dead)) from None
        return answer, fds

    def _kill(self, why: str) -> None:
        self.dead = self.dead or why
        if self._server is not None:
            self._server.close()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, op: str, path: PurePath | str, **args: Any) -> _Answer:
        index, rel = locate(self.roots, path)
        if self.dead is not None or self._sock is None:
            raise TreeUnavailable(0, self.dead or "the owner's child is gone", str(path))
        fds: list[int] = []
        try:
            if "data" in args:  # bulk input (a file to write, names to look for) goes by fd
                fds = [_memfd(args.pop("data"))]
            self._send({"op": op, "root": index, "path": rel, **args}, fds, path)
        finally:
            for fd in fds:
                os.close(fd)
        answer, got = self._receive()
        for extra in got[1:]:
            os.close(extra)
        try:
            checked = _checked(answer, path)
        except BaseException:
            for fd in got[:1]:
                os.close(fd)
            raise
        return checked, (got[0] if got else None)

    def _send(self, message: dict[str, Any], fds: list[int], path: PurePath | str) -> None:
        if self._sock is None:
            raise TreeUnavailable(0, self.dead or "the owner's child is gone", str(path))
        data = json.dumps(message).encode()
        try:
            if fds:
                socket.send_fds(self._sock, [data], fds)
            else:
                self._sock.send(data)
        except OSError as exc:
            self._kill(f"the owner's child as {self.describe()} died ({exc.strerror or exc})")
            raise TreeUnavailable(0, str(self.dead), str(path)) from None

    def converse(
        self,
        op: str,
        path: PurePath | str,
        answer: Callable[[dict[str, Any], list[int]], dict[str, Any]],
        **args: Any,
    ) -> dict[str, Any]:
        """One request during which the child asks questions back (``owner_heal_child.ASK``),
        each answered here by ``answer`` (which closes the fds it is given). Every message from
        the child waits at most ``timeout``: a hung or dead child is killed, TreeUnavailable."""
        index, rel = locate(self.roots, path)
        if self.dead is not None or self._sock is None:
            raise TreeUnavailable(0, self.dead or "the owner's child is gone", str(path))
        self._send({"op": op, "root": index, "path": rel, **args}, [], path)
        while True:
            message, got = self._receive()
            if owner_heal_child.ASK not in message:
                for fd in got:
                    os.close(fd)
                return _checked(message, path)
            self._send(answer(message, got), [], path)

    def close(self) -> None:
        self._kill("closed")


class SplitTree(TreeIO):
    """The owner's child for everything but the package folder, which root reads itself: only
    when the owner cannot read it and the whole way to it is root's."""

    def __init__(self, child: ChildTree, package_root: int) -> None:
        super().__init__(child.roots, child.credentials)
        self.child = child
        self.package_root = package_root
        self.local = LocalTree(child.roots, ROOT)

    @property
    def dead(self) -> str | None:
        return self.child.dead

    def call(self, op: str, path: PurePath | str, **args: Any) -> _Answer:
        index, _ = locate(self.roots, path)
        if index == self.package_root and op in ("lstat", "list", "open"):
            return self.local.call(op, path, **args)
        return self.child.call(op, path, **args)

    def close(self) -> None:
        self.child.close()


def _checked(answer: dict[str, Any], path: PurePath | str) -> dict[str, Any]:
    if "refused" in answer:
        raise boundedread.ReadRefused(str(path), str(answer["refused"]))
    if "errno" in answer:
        err = int(answer["errno"])
        exc_type = {2: FileNotFoundError, 17: FileExistsError, 20: NotADirectoryError}.get(
            err, OSError
        )
        raise exc_type(err, str(answer.get("message", "")), str(path))
    return answer


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("hal0-tree-write", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def open_tree(roots: tuple[Root, ...], credentials: Credentials, *, timeout: float) -> TreeIO:
    """Root's tree in-process, anyone else's through the owner's child."""
    if credentials.uid == 0:
        return LocalTree(roots, credentials)
    return ChildTree(roots, credentials, timeout=timeout)


def local_at(folder: PurePath | str) -> TreeIO:
    """A root-owned tree rooted at ``folder``, handled in this process."""
    p = PurePosixPath(folder)
    return LocalTree((Root(p, p),), ROOT)
