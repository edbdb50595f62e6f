"""Quarantine, restore, roll and prune, each relative to an open JIT-folder fd.

Every operation writes its journal (and the manifest of any quarantine it makes) before the first
rename, records their keyed digests in root's state first, fsyncs every folder it renamed in, and
then clears the journal. A kill anywhere leaves a journal the next heal, restore or daemon start
rolls forward (the manifests it names are complete) or back (they are not): each module ends in
exactly one place. Quarantine folders are real folders owned by the identity that made them and
writable by no one else; nothing is ever followed. ``Tree`` holds the fds; the functions take it,
so they can run unchanged in a child with the tree owner's credentials (the digest book is then
the parent's, over the pipe).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Self

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import folder as qfs
from hal0_reconciler.aiter.quarantine import journal as qj

HealFailed = qfs.HealFailed
QUARANTINE_DIR = ".hal0-quarantine"
MANIFEST = "manifest.json"
MANIFEST_MAX = 1 << 20
JIT = qj.JIT
Identity = tuple[int, int, int, int]


@dataclass(frozen=True)
class Move:
    src: Path
    dst: Path


@dataclass(frozen=True)
class Quarantine:
    id: str
    path: Path
    moves: tuple[Move, ...]
    modules: tuple[str, ...]
    identities: Mapping[str, Identity] = field(default_factory=dict)  # module → its .so's
    verified: bool = True  # False: a 0.1.0 quarantine or one with no valid digest


@dataclass(frozen=True)
class Rolled:
    """What the start of a heal or restore did with one interrupted operation."""

    quarantine: str
    op: str
    outcome: str  # "forward" | "back" | "cleared" | "refused"
    detail: str


@dataclass(frozen=True)
class Pruned:
    removed: tuple[str, ...] = ()
    kept: tuple[tuple[str, str], ...] = ()  # (id, why it was not removed)


class Tree:
    """One JIT folder by fd, the identity its quarantines belong to, and root's digest book."""

    def __init__(
        self, jit_fd: int, *, path: Path, book: manifest_digest.Book, uid: int | None = None
    ) -> None:
        self.jit_fd = jit_fd
        self.path = path
        self.key = str(path)
        self.book = book
        self.uid = os.geteuid() if uid is None else uid
        self._fds: dict[tuple[str, str], int] = {}
        self.renames = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def label(self, place: str, sub: str | None = None) -> str:
        where = self.path if place == JIT else self.path / QUARANTINE_DIR / place
        return str(where / sub) if sub else str(where)

    def root(self, *, create: bool = False) -> int:
        """``.hal0-quarantine`` (FileNotFoundError when absent, FolderRefused when not ours)."""
        key = ("", "")
        if key not in self._fds:
            self._fds[key] = qfs.open_owned_dir(
                self.jit_fd,
                QUARANTINE_DIR,
                uid=self.uid,
                label=str(self.path / QUARANTINE_DIR),
                create=create,
            )
        return self._fds[key]

    def place(self, place: str, sub: str | None = None, *, create: bool = False) -> int:
        """The folder fd of a place (``jit`` or a quarantine id) or its ``build`` subfolder."""
        key = (place, sub or "")
        if key in self._fds:
            return self._fds[key]
        if sub is not None:
            base = self.place(place)
            if place == JIT:
                if create and qfs.make_dir(base, sub, mode=0o755):
                    owner = os.fstat(base)  # the tree's folder: its owner's, as aiter made it
                    os.chown(sub, owner.st_uid, owner.st_gid, dir_fd=base, follow_symlinks=False)
                fd = qfs.open_dir(base, sub, label=self.label(place, sub))
            else:
                fd = qfs.open_owned_dir(
                    base, sub, uid=self.uid, label=self.label(place, sub), create=create
                )
        elif place == JIT:
            return self.jit_fd
        else:
            fd = qfs.open_owned_dir(self.root(), place, uid=self.uid, label=self.label(place))
        self._fds[key] = fd
        return fd

    def forget_place(self, place: str) -> None:
        for key in [k for k in self._fds if k[0] == place]:
            os.close(self._fds.pop(key))

    def present(self, place: str, rel: str) -> bool:
        sub, name = _split(rel)
        try:
            fd = self.place(place, sub)
        except FileNotFoundError:
            return False
        return qfs.lstat_at(fd, name) is not None

    def sync(self) -> None:
        """fsync every folder this tree has open: the JIT folder and the quarantines."""
        qfs.fsync_dirs([self.jit_fd, *self._fds.values()])


def _split(rel: str) -> tuple[str | None, str]:
    head, _, tail = rel.partition("/")
    return (head, tail) if tail else (None, head)


def _utc(now: dt.datetime | None) -> dt.datetime:
    return now if now is not None else dt.datetime.now(dt.UTC)


def new_quarantine(tree: Tree, now: dt.datetime | None) -> str:
    """Make a new quarantine folder (0700) under an id never used before in this JIT folder."""
    root = tree.root(create=True)
    base = _utc(now).strftime("%Y%m%dT%H%M%SZ")
    qid, n = base, 1
    while not qfs.make_dir(root, qid):
        n += 1
        qid = f"{base}-{n}"
    os.fsync(root)
    return qid


def _folder(tree: Tree, qid: str) -> tuple[int, int]:
    st = os.fstat(tree.place(qid))
    return (st.st_dev, st.st_ino)


def write_signed(tree: Tree, qid: str, name: str, kind: str, data: bytes) -> None:
    """Record the digest first (a kill then leaves a digest without a file, never the reverse),
    then write the file durably."""
    tree.book.record(tree.key, qid, kind, data, _folder(tree, qid))
    qfs.write_file(tree.place(qid), name, data)


def read_signed(tree: Tree, qid: str, name: str, kind: str) -> tuple[bytes | None, bool]:
    """(the file's bytes or None, whether this daemon wrote them for this very folder)."""
    data = qfs.read_file(tree.place(qid), name, max_bytes=MANIFEST_MAX)
    if data is None:
        return None, False
    return data, tree.book.verify(tree.key, qid, kind, data, _folder(tree, qid))


def parse_manifest(data: bytes) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(relative paths it holds, modules). 0.1.0 manifests name absolute paths: made relative to
    their recorded JIT folder. Anything else than module files is JournalInvalid."""
    try:
        raw = json.loads(data)
        modules = tuple(str(m) for m in raw.get("modules", {}))
        if "entries" in raw:
            rels = tuple(str(r) for r in raw["entries"])
        else:
            jit = PurePosixPath(raw["jit_dir"])
            rels = tuple(str(PurePosixPath(m["src"]).relative_to(jit)) for m in raw["moves"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise qj.JournalInvalid(f"{type(exc).__name__}: {exc}") from None
    for rel in rels:
        if qj.module_of(rel) not in modules:
            raise qj.JournalInvalid(f"{rel} belongs to no module the manifest names")
    if not all(qj.is_module_name(m) for m in modules):
        raise qj.JournalInvalid("a module name is not module_<name>")
    return rels, modules


def roll(tree: Tree, journal: qj.Journal, direction: qj.Direction) -> None:
    """Make the journal's moves (forward) or undo them (back), then fsync every folder."""
    for step in qj.ordered(journal, direction):
        action = qj.next_action(
            direction,
            src_present=tree.present(step.src, step.rel),
            dst_present=tree.present(step.dst, step.rel),
        )
        if action == "lost":
            raise HealFailed(
                f"{step.rel} is neither in {tree.label(step.src)} nor in {tree.label(step.dst)}"
            )
        if action == "skip":
            continue
        src, dst = (step.src, step.dst) if action == "move" else (step.dst, step.src)
        sub, name = _split(step.rel)
        if qfs.rename_hook is not None:
            qfs.rename_hook(tree.renames)
        tree.renames += 1
        try:
            qfs.rename_noreplace(
                tree.place(src, sub), name, tree.place(dst, sub, create=True), name
            )
        except OSError as exc:
            raise HealFailed(f"moving {tree.label(src, step.rel)} failed ({exc})") from None
    tree.sync()


def remove_own(tree: Tree, qid: str) -> None:
    """Remove a quarantine that holds no module any more: its manifest, temp files, empty build
    folder, then its journal, then the folder. Anything else in it stops this (HealFailed)."""
    try:
        fd = tree.place(qid)
    except FileNotFoundError:
        return
    qfs.unlink_if_present(fd, MANIFEST)
    for name in qfs.entries(fd):
        st = qfs.lstat_at(fd, name)
        if name == "build" and st is not None and stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError as exc:
                raise HealFailed(f"{tree.label(qid, name)} still holds files ({exc})") from None
        elif name.startswith(".") and name.endswith(".tmp"):
            qfs.unlink_if_present(fd, name)
    qfs.unlink_if_present(fd, qj.JOURNAL)
    tree.forget_place(qid)
    try:
        os.rmdir(qid, dir_fd=tree.root())
    except OSError as exc:
        raise HealFailed(f"{tree.label(qid)} still holds files ({exc})") from None
    os.fsync(tree.root())
    tree.book.forget(tree.key, qid)


def finish(tree: Tree, journal: qj.Journal, direction: qj.Direction) -> None:
    """After a roll: remove what is now empty and the journal, so nothing is left half done."""
    if direction is qj.Direction.FORWARD and journal.op is qj.Op.RESTORE:
        remove_own(tree, journal.home)
        return
    if direction is qj.Direction.BACK and journal.creates is not None:
        remove_own(tree, journal.creates)
        if journal.creates == journal.home:
            return
    qfs.unlink_if_present(tree.place(journal.home), qj.JOURNAL)
    os.fsync(tree.place(journal.home))
    tree.book.forget(tree.key, journal.home, "journal")


def run(tree: Tree, journal: qj.Journal) -> None:
    """A live operation: roll forward; on any failure roll back. Raises HealFailed."""
    try:
        roll(tree, journal, qj.Direction.FORWARD)
    except (OSError, HealFailed) as exc:
        try:
            roll(tree, journal, qj.Direction.BACK)
            finish(tree, journal, qj.Direction.BACK)
        except (OSError, HealFailed) as undo:
            raise HealFailed(
                f"{exc}; undo FAILED ({undo}): the journal in {tree.label(journal.home)} is "
                "kept, and the next heal or restore finishes or undoes it"
            ) from None
        raise HealFailed(f"{exc}; every move made was undone, nothing changed") from None
    try:
        finish(tree, journal, qj.Direction.FORWARD)
    except (OSError, HealFailed) as exc:
        raise HealFailed(f"the moves are done, but clearing the journal failed: {exc}") from None


def abandon(tree: Tree, qid: str, exc: BaseException) -> HealFailed:
    """A journal or manifest could not be written: nothing moved; remove the new folder."""
    with contextlib.suppress(OSError, HealFailed):
        remove_own(tree, qid)
    return HealFailed(f"cannot create quarantine {tree.label(qid)}: {exc}; nothing was moved")


def ids(tree: Tree) -> list[str]:
    """Quarantine ids (real folders, not hidden), oldest first."""
    try:
        root = tree.root()
    except FileNotFoundError:
        return []
    found = []
    for name in qfs.entries(root):
        st = qfs.lstat_at(root, name)
        if not name.startswith(".") and st is not None and stat.S_ISDIR(st.st_mode):
            found.append(name)
    return found


def recover_at(tree: Tree) -> list[Rolled]:
    """``recover`` on an open tree: forward when every manifest the journal names is complete
    (present, written by this daemon), back otherwise; an unverified journal is left alone."""
    done: list[Rolled] = []
    for qid in ids(tree):
        op = ""
        try:
            data, ok = read_signed(tree, qid, qj.JOURNAL, "journal")
            if data is None:
                if _leftover(tree, qid):
                    remove_own(tree, qid)
                    done.append(Rolled(qid, op, "cleared", "an empty quarantine a kill left"))
                continue
            if not ok:
                done.append(Rolled(qid, op, "refused", "journal not written by this daemon"))
                continue
            journal = qj.decode(data, home=qid)
            op = str(journal.op)
            complete = all(
                _exists(tree, m) and read_signed(tree, m, MANIFEST, "manifest")[1]
                for m in journal.manifests
            )
            direction = qj.Direction.FORWARD if complete else qj.Direction.BACK
            roll(tree, journal, direction)
            finish(tree, journal, direction)
        except (OSError, HealFailed, qj.JournalInvalid, boundedread.ReadRefused) as exc:
            done.append(Rolled(qid, op, "refused", f"left as it is: {exc}"))
            continue
        done.append(Rolled(qid, op, str(direction), f"{len(journal.steps)} move(s)"))
    return done


def _exists(tree: Tree, qid: str) -> bool:
    try:
        tree.place(qid)
    except FileNotFoundError:
        return False
    return True


def _leftover(tree: Tree, qid: str) -> bool:
    """A folder a kill left before its journal: nothing in it but this code's temp files."""
    names = qfs.entries(tree.place(qid))
    return all(n.startswith(".") and n.endswith(".tmp") for n in names)


def manifest_doc(
    qid: str,
    *,
    kind: str,
    now: dt.datetime | None,
    jit: Path,
    rels: list[str],
    modules: Mapping[str, Any],
) -> bytes:
    return json.dumps(
        {
            "id": qid,
            "kind": kind,
            "created": _utc(now).isoformat(),
            "jit_dir": str(jit),
            "entries": rels,
            "modules": dict(modules),
        },
        indent=1,
    ).encode("utf-8")


def plan_entry(mp: plan.ModulePlan) -> dict[str, Any]:
    return {"digest": mp.digest, "missing": [m.name for m in mp.missing], "reason": mp.reason}
