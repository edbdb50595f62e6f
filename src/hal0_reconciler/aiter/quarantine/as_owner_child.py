"""The owner's child's half of a heal, restore, roll or prune: the file operations, as the owner.

The parent (root) asks its tree's child for one of ``OPS`` on a JIT folder named relative to a
tree root; the child opens that folder beneath the root (nothing followed) and runs the same
fd-relative functions root runs for its own trees (``heal.quarantine_at``, ``restore_at``,
``quarantine_ops.recover_at``, ``quarantine_prune.prune_at``), with a ``Book`` whose calls are
questions back to the parent over the same socket (``ASK``): the HMAC key and the digests stay in
root's state, the child only ever hears "recorded", "verified" or "not". The bytes to sign go by
a sealed memfd. The answer is the operation's result as data (``encode_*`` / ``decode_*``).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.quarantine import ops as qops
from hal0_reconciler.aiter.quarantine import prune as quarantine_prune
from hal0_reconciler.aiter.trees import fs as treefs

OPS = frozenset({"heal_quarantine", "heal_restore", "heal_recover", "heal_prune"})
ASK = "book"
"""The key of a child's question to the parent (its value: ``record``, ``verify``, ``forget``)."""
MAX_SIGNED = 1 << 20
"""Largest manifest or journal the parent signs or verifies for the child."""
MAX_QUESTION = 16 * 1024


class BookProxy:
    """A ``manifest_digest.Book`` whose every call is answered by root's parent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def _ask(self, req: dict[str, Any], data: bytes | None) -> dict[str, Any]:
        fds = [_sealed(data)] if data is not None else []
        try:
            msg = json.dumps(req).encode()
            if fds:
                socket.send_fds(self.sock, [msg], fds)
            else:
                self.sock.send(msg)
        finally:
            for fd in fds:
                os.close(fd)
        raw = self.sock.recv(MAX_QUESTION)
        if not raw:
            raise manifest_digest.DigestUnavailable("the digest book's owner went away")
        answer = json.loads(raw)
        if not isinstance(answer, dict):
            raise manifest_digest.DigestUnavailable("the digest book answered garbage")
        if "unavailable" in answer:
            raise manifest_digest.DigestUnavailable(str(answer["unavailable"]))
        if "errno" in answer:
            raise OSError(int(answer["errno"]), str(answer.get("message", "")))
        return answer

    def record(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> None:
        self._ask({ASK: "record", "jit": jit, "qid": qid, "kind": kind, "folder": folder}, data)

    def verify(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> bool:
        req = {ASK: "verify", "jit": jit, "qid": qid, "kind": kind, "folder": folder}
        try:
            return self._ask(req, data).get("verified") is True
        except manifest_digest.DigestUnavailable:
            return False

    def forget(self, jit: str, qid: str, kind: str | None = None) -> None:
        self._ask({ASK: "forget", "jit": jit, "qid": qid, "kind": kind}, None)


def answer_book(
    book: manifest_digest.Book, jit: str, req: dict[str, Any], fds: list[int]
) -> dict[str, Any]:
    """Root's answer to one question of the child about ``jit`` (any other folder is refused:
    the child never gets a digest for a tree it was not asked to work in)."""
    try:
        if req.get("jit") != jit:
            return {"unavailable": f"the digest book answers only for {jit}"}
        qid, kind, what = str(req.get("qid", "")), req.get("kind"), req.get(ASK)
        if what == "forget":
            book.forget(jit, qid, None if kind is None else str(kind))
            return {}
        folder_raw = req.get("folder")
        if (
            not isinstance(folder_raw, list)
            or len(folder_raw) != 2
            or not all(type(v) is int for v in folder_raw)
        ):
            return {"unavailable": "a question without a folder identity"}
        folder = (int(folder_raw[0]), int(folder_raw[1]))
        if len(fds) != 1:
            return {"unavailable": "a question without its bytes"}
        data = boundedread.read_fd(fds[0], "signed bytes", max_bytes=MAX_SIGNED)
        if what == "record":
            book.record(jit, qid, str(kind), data, folder)
            return {}
        if what == "verify":
            return {"verified": book.verify(jit, qid, str(kind), data, folder)}
        return {"unavailable": f"unknown question {what!r}"}  # noqa: TRY300
    except (manifest_digest.DigestUnavailable, boundedread.ReadRefused) as exc:
        return {"unavailable": str(exc)}
    except OSError as exc:
        return {"errno": exc.errno or 0, "message": exc.strerror or str(exc)}
    finally:
        for fd in fds:
            os.close(fd)


def serve(sock: socket.socket, root_fd: int, rel: str, req: dict[str, Any]) -> dict[str, Any]:
    """Run one operation on the JIT folder ``rel`` beneath ``root_fd``, as this process is."""
    path_fd = treefs.open_dir(root_fd, rel) if treefs.parts_of(rel) else os.dup(root_fd)
    try:
        jit_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=path_fd)
    finally:
        os.close(path_fd)
    now = dt.datetime.fromisoformat(str(req["now"])) if req.get("now") else None
    try:
        with qops.Tree(jit_fd, path=Path(str(req["jit"])), book=BookProxy(sock)) as tree:
            op = req["op"]
            if op == "heal_quarantine":
                entries = req.get("modules")
                if not isinstance(entries, dict):
                    return {"heal_failed": "no modules named; nothing was moved"}
                return {"quarantine": encode(heal.quarantine_entries(tree, entries, now=now))}
            if op == "heal_restore":
                restored, displaced = heal.restore_at(tree, str(req.get("qid", "")), now=now)
                return {
                    "quarantine": encode(restored),
                    "displaced": None if displaced is None else encode(displaced),
                }
            if op == "heal_recover":
                return {
                    "rolled": [[r.quarantine, r.op, r.outcome, r.detail] for r in _rolled(tree)]
                }
            pruned = quarantine_prune.prune_at(tree, keep=int(req.get("keep", 0)))
            return {"removed": list(pruned.removed), "kept": [list(k) for k in pruned.kept]}
    except heal.HealFailed as exc:
        return {"heal_failed": str(exc)}
    finally:
        os.close(jit_fd)


def _rolled(tree: qops.Tree) -> list[qops.Rolled]:
    try:
        return qops.recover_at(tree)
    except FileNotFoundError:
        return []


def encode(q: qops.Quarantine) -> dict[str, Any]:
    return {
        "id": q.id,
        "path": str(q.path),
        "moves": [[str(m.src), str(m.dst)] for m in q.moves],
        "modules": list(q.modules),
        "identities": {k: list(v) for k, v in q.identities.items()},
        "verified": q.verified,
    }


def decode(raw: Mapping[str, Any]) -> qops.Quarantine:
    """A quarantine the child reported (data: the parent re-derives nothing from its paths)."""
    identities = {
        str(k): (int(v[0]), int(v[1]), int(v[2]), int(v[3]))
        for k, v in dict(raw.get("identities", {})).items()
    }
    return qops.Quarantine(
        str(raw["id"]),
        Path(str(raw["path"])),
        tuple(qops.Move(Path(str(s)), Path(str(d))) for s, d in raw.get("moves", [])),
        tuple(str(m) for m in raw.get("modules", [])),
        identities,
        verified=bool(raw.get("verified", False)),
    )


def _sealed(data: bytes) -> int:
    fd = os.memfd_create("hal0-signed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd
