"""The owner's child: every file operation inside a tree root does not own, as the tree's owner.

Started by ``treeio`` as root (the interpreter may sit in a root-only virtualenv), with a
``SOCK_SEQPACKET`` socket inherited; it imports everything it needs, drops to the owner's groups,
gid and uid for good (checked with ``getresuid``/``getresgid``, and that root cannot be regained),
then answers one JSON request per message until the socket closes. Each request names a tree root
by index and a path relative to it; the path is resolved beneath the root with ``treefs`` (no
link followed). An opened file is answered with its fd (``SCM_RIGHTS``), so the parent reads
bytes the owner could read, through a descriptor, never by a path. A module is scanned here
(``scan``: ``modulescan``'s bounded reads) and only the names found go back: root never holds
the bytes of a file the owner can change. Bulk input (a file to write, the names to look for)
comes as a memfd the same way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from typing import Any

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.quarantine import as_owner_child as owner_heal_child
from hal0_reconciler.aiter.registry import scan as modulescan
from hal0_reconciler.aiter.trees import fs as treefs

MAX_MESSAGE = 160 * 1024
"""Largest request or answer, in bytes (a socket message; larger input goes by fd)."""
MAX_NAMES = 2000
"""A listing of more names than this is refused (its answer would not fit one message)."""
MAX_WRITE = 1 << 20
"""Largest file the child writes (manifests, journals)."""
MAX_SCAN_NAMES = 16 << 20
"""Largest list of names (JSON) a scan is asked about."""


def drop_to(uid: int, gid: int, groups: list[int]) -> str | None:
    """Become ``uid``/``gid``/``groups`` for good; None when done, else why not."""
    want = set(groups) | {gid}
    try:
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
    except OSError as exc:
        return f"cannot become uid {uid} gid {gid}: {exc.strerror}"
    if (
        os.getresuid() != (uid, uid, uid)
        or os.getresgid() != (gid, gid, gid)
        or set(os.getgroups()) | {os.getegid()} != want
    ):
        return f"credentials did not change to uid {uid} gid {gid}"
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            return f"could regain root after dropping to uid {uid}"
    return None


class Child:
    """The request loop over one socket, for the roots it was given."""

    def __init__(self, roots: list[str], sock: socket.socket | None = None) -> None:
        self.roots = roots
        self.sock = sock  # the heal's questions to the parent's digest book go back over it

    def root_fd(self, index: object) -> int:
        if not isinstance(index, int) or not 0 <= index < len(self.roots):
            raise treefs.OutsideTree(0, "no such tree root")
        return treefs.open_root(self.roots[index])

    def handle(self, req: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        op = req.get("op")
        rel = str(req.get("path", ""))
        root = self.root_fd(req.get("root"))
        try:
            if op == "lstat":
                st = treefs.lstat_at(root, rel)
                return {"stat": None if st is None else treefs.stat_values(st)}, []
            if op == "list":
                names = treefs.listdir_at(root, rel)
                if len(names) > MAX_NAMES:
                    return _refused(f"more than {MAX_NAMES} entries"), []
                return {"names": names}, []
            if op == "open":
                fd = treefs.open_regular(root, rel)
                return {"stat": treefs.stat_values(os.fstat(fd))}, [fd]
            if op == "scan":
                return scan(root, rel, req, fds), []
            if op == "mkdir":
                treefs.mkdir_at(root, rel, int(req.get("mode", 0o755)) & 0o7777)
                return {}, []
            if op == "rename":
                treefs.rename_at(
                    root, rel, str(req.get("dst", "")), noreplace=bool(req.get("noreplace", True))
                )
                return {}, []
            if op == "rmtree":
                treefs.rmtree_at(root, rel)
                return {}, []
            if op == "fsync":
                treefs.fsync_dir_at(root, rel)
                return {}, []
            if op in owner_heal_child.OPS:
                if self.sock is None:
                    return _refused("a heal runs only in the owner's child"), []
                return owner_heal_child.serve(self.sock, root, rel, req), []
            if op == "write":
                if len(fds) != 1:
                    return _refused("no data descriptor"), []
                data = boundedread.read_fd(fds[0], "data", max_bytes=MAX_WRITE)
                treefs.write_atomic_at(root, rel, data, int(req.get("mode", 0o644)) & 0o7777)
                return {}, []
            return _refused(f"unknown operation {op!r}"), []
        finally:
            os.close(root)

    def serve(self, sock: socket.socket) -> None:
        while True:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
            except OSError:
                return
            if not msg:
                return  # the parent closed its end
            try:
                req = json.loads(msg)
                if not isinstance(req, dict):
                    raise ValueError("not an object")  # noqa: TRY301, TRY004
                answer, out = self.handle(req, fds)
            except boundedread.ReadRefused as exc:
                answer, out = _refused(exc.reason), []
            except OSError as exc:
                answer, out = {"errno": exc.errno or 0, "message": exc.strerror or str(exc)}, []
            except (ValueError, TypeError) as exc:
                answer, out = _refused(f"bad request: {exc}"), []
            finally:
                for fd in fds:
                    os.close(fd)
            data = json.dumps(answer).encode()
            if len(data) > MAX_MESSAGE:
                for dropped in out:
                    os.close(dropped)
                out, data = [], json.dumps(_refused("answer too large")).encode()
            try:
                socket.send_fds(sock, [data], out) if out else sock.send(data)
            except OSError:
                return
            finally:
                for fd in out:
                    os.close(fd)


def scan(root: int, rel: str, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """Scan the module ``rel`` for the names in the descriptor; answer the indices of the names
    found, the outcome and the stat at open (``modulescan``)."""
    if len(fds) != 1:
        return _refused("no names descriptor")
    names = json.loads(boundedread.read_fd(fds[0], "names", max_bytes=MAX_SCAN_NAMES))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return _refused("bad request: names is not a list of strings")
    max_bytes = req.get("max_bytes")
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
        return _refused("bad request: no max_bytes")
    budget = req.get("budget")
    deadline = None if budget is None else time.monotonic() + float(budget)
    fd = treefs.open_regular(root, rel)
    try:
        st = os.fstat(fd)
        found = modulescan.scan_fd(fd, names, max_bytes=max_bytes, deadline=deadline)
    finally:
        os.close(fd)
    return {
        "stat": treefs.stat_values(st),
        "outcome": str(found.outcome),
        "found": [i for i, n in enumerate(names) if n in found.found],
    }


def _refused(reason: str) -> dict[str, Any]:
    return {"refused": reason}


def main() -> int:
    signal.pthread_sigmask(signal.SIG_SETMASK, ())  # a parent's held signals are not ours
    spec = json.loads(sys.argv[1])
    sock = socket.socket(fileno=int(spec["fd"]))
    treefs.OPENAT2 = treefs.OPENAT2 and bool(spec.get("openat2", True))
    why = drop_to(int(spec["uid"]), int(spec["gid"]), [int(g) for g in spec["groups"]])
    hello: dict[str, Any] = {"uid": os.geteuid(), "gid": os.getegid(), "pid": os.getpid()}
    if why is not None:
        hello = {"error": why}
    sock.send(json.dumps(hello).encode())
    if why is not None:
        return 2
    Child([str(r) for r in spec["roots"]], sock).serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
