"""Quarantine and restore: the only writer in a JIT folder.

Invalidating a module moves exactly ``<jit>/module_<name>.so`` and ``<jit>/build/module_<name>/``
into ``<jit>/.hal0-quarantine/<UTC time>/`` (same filesystem, so every move is a rename), all or
nothing. Each heal and restore journals its moves first and signs its manifest (a keyed digest
in root's state); a kill is rolled forward or back by the next heal, restore or daemon start
(``quarantine_ops``). Every file operation is relative to the JIT folder's fd and never follows
a link. Also here: finding builds in progress and the
processes that have a module mapped (psutil), and the heal memory of the convergence guard.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hal0_reconciler import boundedread, fsio
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import folder as qfs
from hal0_reconciler.aiter.quarantine import journal as qj
from hal0_reconciler.aiter.quarantine import ops as qops
from hal0_reconciler.aiter.quarantine import prune as quarantine_prune
from hal0_reconciler.errors import ReconcilerError

if TYPE_CHECKING:
    import psutil

QUARANTINE_DIR = qops.QUARANTINE_DIR
MANIFEST = qops.MANIFEST
JIT = qops.JIT
HealFailed = qfs.HealFailed
Move = qops.Move
Quarantine = qops.Quarantine
COMPILERS = frozenset(
    {
        "hipcc",
        "hipcc.bin",
        "clang",
        "clang++",
        "amdclang",
        "amdclang++",
        "clang-offload-bundler",
        "cc1",
        "cc1plus",
        "ld",
        "ld.lld",
        "lld",
        "ninja",
        "gcc",
        "g++",
        "cc",
        "c++",
        "make",
    }
)
_SLOT_CGROUP = re.compile(r"hal0-slot@([^/\s]+)\.service")


class ProcessScanUnavailable(ReconcilerError):
    """The process table cannot be read here, so no build in progress can be ruled out.

    psutil needs ``/proc/stat`` (boot time) to describe any process: a sandbox with
    ``ProcSubset=pid`` hides it. A heal must never run blind, so the check cannot run.
    """


def _processes(attrs: list[str]) -> list[psutil.Process]:
    """Every process psutil can see, with ``attrs`` fetched (unreadable ones are None)."""
    import psutil  # noqa: PLC0415 - only a heal looks at processes (a plan never does)

    try:
        return list(psutil.process_iter(attrs))
    except (OSError, psutil.Error) as exc:
        raise ProcessScanUnavailable(
            f"cannot list processes ({type(exc).__name__}: {exc}); is /proc restricted "
            "(ProcSubset=pid) for this service?"
        ) from None


# --- builds in progress, processes holding modules ----------------------------------------------


def build_activity(jit_dir: Path, package_dir: Path, modules: Iterable[str]) -> list[str]:
    """Why healing must wait: aiter build locks for ``modules``, compilers working in the tree."""
    busy = [
        f"build lock {lock}"
        for m in sorted(set(modules))
        if (lock := jit_dir / "build" / f"lock_{m}").exists()
    ]
    roots = tuple(str(p) for p in {jit_dir, package_dir})
    for proc in _processes(["pid", "name", "cmdline", "cwd"]):
        info = proc.info
        name = info.get("name") or ""
        cmdline = info.get("cmdline") or []
        argv0 = Path(cmdline[0]).name if cmdline else ""
        if name not in COMPILERS and argv0 not in COMPILERS:
            continue
        cwd = info.get("cwd") or ""
        if any(_under(cwd, r) for r in roots) or any(r in arg for arg in cmdline for r in roots):
            busy.append(f"compiler pid {info['pid']} ({' '.join(cmdline)[:120] or name})")
    return busy


def mapped_by(paths: Iterable[Path]) -> dict[str, list[str]]:
    """module path → who has it mapped: ``slot <token>`` from the cgroup, else pid + cmdline."""
    wanted = {str(p) for p in paths}
    holders: dict[str, list[str]] = {}
    if not wanted:
        return holders
    import psutil  # noqa: PLC0415 - see _processes

    for proc in _processes(["pid", "cmdline"]):
        try:
            maps = {m.path for m in proc.memory_maps(grouped=True)}
        except (psutil.Error, OSError):
            continue
        for path in wanted & maps:
            holders.setdefault(path, []).append(_describe(proc.info["pid"], proc.info["cmdline"]))
    return holders


def _describe(pid: int, cmdline: list[str] | None) -> str:
    try:
        cgroup = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cgroup = ""
    match = _SLOT_CGROUP.search(cgroup)
    who = f"pid {pid} ({' '.join(cmdline or [])[:120]})"
    return f"slot {match[1]}: {who}" if match else who


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


# --- quarantine, restore, roll, prune (every file operation by fd, in quarantine_ops) ---------


@contextlib.contextmanager
def _tree(jit_dir: Path, book: manifest_digest.Book) -> Iterator[qops.Tree]:
    fd = qfs.open_jit(jit_dir)
    try:
        with qops.Tree(fd, path=jit_dir, book=book) as tree:
            yield tree
    finally:
        os.close(fd)


def quarantine(
    jit_dir: Path,
    modules: Mapping[str, plan.ModulePlan],
    *,
    book: manifest_digest.Book,
    now: dt.datetime | None = None,
) -> Quarantine:
    """Move each module's ``.so`` and ``build/<module>/`` (nothing else) into a new quarantine.

    All or nothing: raises HealFailed after undoing every move when one fails."""
    with _tree(jit_dir, book) as tree:
        return quarantine_at(tree, modules, now=now)


def quarantine_at(
    tree: qops.Tree, modules: Mapping[str, plan.ModulePlan], *, now: dt.datetime | None = None
) -> Quarantine:
    """``quarantine`` on an open tree: journal and manifest (signed) first, then the renames."""
    return quarantine_entries(tree, {m: qops.plan_entry(mp) for m, mp in modules.items()}, now=now)


def quarantine_entries(
    tree: qops.Tree, modules: Mapping[str, object], *, now: dt.datetime | None = None
) -> Quarantine:
    """``quarantine_at`` with each module's manifest entry already made (what the owner's child
    is sent: data, not plans)."""
    bad = [m for m in modules if not qj.is_module_name(m)]
    if bad:
        raise HealFailed(f"not module names: {', '.join(map(repr, bad))}; nothing was moved")
    try:
        build: int | None = tree.place(JIT, "build")
    except FileNotFoundError:
        build = None
    rels: list[str] = []
    identities: dict[str, qops.Identity] = {}
    for module in sorted(modules):
        st = qfs.lstat_at(tree.jit_fd, f"{module}.so")
        if st is not None:
            rels.append(f"{module}.so")
            identities[module] = qfs.identity(st)
        if build is not None and qfs.lstat_at(build, module) is not None:
            rels.append(f"build/{module}")
    qid = qops.new_quarantine(tree, now)
    journal = qj.Journal(qj.Op.HEAL, qid, qid, (qid,), tuple(qj.Step(r, JIT, qid) for r in rels))
    entries = dict(sorted(modules.items()))
    try:
        qops.write_signed(tree, qid, qj.JOURNAL, "journal", journal.encode())
        doc = qops.manifest_doc(
            qid, kind="heal", now=now, jit=tree.path, rels=rels, modules=entries
        )
        qops.write_signed(tree, qid, MANIFEST, "manifest", doc)
    except (OSError, manifest_digest.DigestUnavailable) as exc:
        raise qops.abandon(tree, qid, exc) from None
    qops.run(tree, journal)
    return Quarantine(
        qid, _qpath(tree, qid), _moves(tree, journal), tuple(sorted(modules)), identities
    )


def restore(
    jit_dir: Path, qid: str, *, book: manifest_digest.Book, now: dt.datetime | None = None
) -> tuple[Quarantine, Quarantine | None]:
    """Put quarantine ``qid`` back. What now sits in its place is quarantined first (nothing lost).

    Returns (the restored quarantine, the quarantine of displaced files or None). Raises HealFailed.
    """
    with _tree(jit_dir, book) as tree:
        return restore_at(tree, qid, now=now)


def restore_at(
    tree: qops.Tree, qid: str, *, now: dt.datetime | None = None
) -> tuple[Quarantine, Quarantine | None]:
    """``restore`` on an open tree. An unverified quarantine (0.1.0, or no valid digest) is
    restorable too; in the tree owner's child it can then only move what that owner could."""

    def unknown() -> HealFailed:
        known = ", ".join(qops.ids(tree)) or "none"
        return HealFailed(f"no quarantine {qid!r} in {tree.path / QUARANTINE_DIR} (known: {known})")

    if not qfs.is_component(qid) or qid.startswith("."):
        raise unknown()
    try:
        tree.root()
        data, verified = qops.read_signed(tree, qid, MANIFEST, "manifest")
        pending = qfs.lstat_at(tree.place(qid), qj.JOURNAL) is not None
    except FileNotFoundError:
        raise unknown() from None
    except boundedread.ReadRefused as exc:
        raise HealFailed(f"quarantine {qid}: manifest refused: {exc}") from None
    if data is None:
        raise unknown()
    if pending:
        raise HealFailed(f"quarantine {qid} has an unfinished operation; nothing was moved")
    try:
        rels, modules = qops.parse_manifest(data)
    except qj.JournalInvalid as exc:
        raise HealFailed(f"quarantine {qid}: unreadable manifest: {exc}") from None
    missing = [tree.label(qid, r) for r in rels if not tree.present(qid, r)]
    if missing:
        raise HealFailed(
            f"quarantine {qid} is incomplete (missing: {', '.join(missing)}); nothing was moved"
        )
    occupied = [r for r in rels if tree.present(JIT, r)]
    did = qops.new_quarantine(tree, now) if occupied else None
    steps = [qj.Step(r, JIT, did) for r in occupied if did is not None]
    steps += [qj.Step(r, qid, JIT) for r in rels]
    journal = qj.Journal(qj.Op.RESTORE, qid, did, (did,) if did else (), tuple(steps))
    try:
        qops.write_signed(tree, qid, qj.JOURNAL, "journal", journal.encode())
        if did is not None:
            doc = qops.manifest_doc(
                did,
                kind="displaced-by-restore",
                now=now,
                jit=tree.path,
                rels=occupied,
                modules={m: {} for m in modules},
            )
            qops.write_signed(tree, did, MANIFEST, "manifest", doc)
    except (OSError, manifest_digest.DigestUnavailable) as exc:
        qfs.unlink_if_present(tree.place(qid), qj.JOURNAL)
        if did is None:
            raise HealFailed(
                f"cannot journal the restore of {qid}: {exc}; nothing was moved"
            ) from None
        raise qops.abandon(tree, did, exc) from None
    qops.run(tree, journal)
    moves = _moves(tree, journal)
    displaced = None
    if did is not None:
        displaced = Quarantine(
            did, _qpath(tree, did), tuple(m for m in moves if m.dst.parent.name == did), modules
        )
    restored = tuple(m for m in moves if did is None or m.dst.parent.name != did)
    return Quarantine(qid, _qpath(tree, qid), restored, modules, verified=verified), displaced


def _qpath(tree: qops.Tree, qid: str) -> Path:
    return tree.path / QUARANTINE_DIR / qid


def _moves(tree: qops.Tree, journal: qj.Journal) -> tuple[Move, ...]:
    def where(place: str, rel: str) -> Path:
        return tree.path / rel if place == JIT else _qpath(tree, place) / rel

    return tuple(Move(where(s.src, s.rel), where(s.dst, s.rel)) for s in journal.steps)


def recover(jit_dir: Path, *, book: manifest_digest.Book) -> list[qops.Rolled]:
    """Roll every operation a kill interrupted in this JIT folder forward or back (say which)."""
    try:
        with _tree(jit_dir, book) as tree:
            return qops.recover_at(tree)
    except FileNotFoundError:
        return []


def list_quarantines(jit_dir: Path) -> list[Path]:
    """Quarantine folders (real folders, never through a link), oldest first."""
    try:
        fd = qfs.open_jit(jit_dir)
    except (OSError, HealFailed):
        return []
    try:
        with qops.Tree(fd, path=jit_dir, book=manifest_digest.NO_BOOK) as tree:
            return [_qpath(tree, q) for q in qops.ids(tree)]
    except (OSError, HealFailed):
        return []
    finally:
        os.close(fd)


def prune(jit_dir: Path, *, keep: int, book: manifest_digest.Book) -> qops.Pruned:
    """Delete all but the newest ``keep`` quarantines that can go (see ``prune_at``)."""
    with _tree(jit_dir, book) as tree:
        return quarantine_prune.prune_at(tree, keep=keep)


# --- heal memory (the convergence guard's) ------------------------------------------------------


def load_memory(path: Path) -> dict[str, plan.MemoryEntry]:
    """so path → what was healed or restored; an unreadable file reads as empty."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    memory: dict[str, plan.MemoryEntry] = {}
    if isinstance(raw, dict):
        for key, e in raw.items():
            with contextlib.suppress(KeyError, TypeError, AttributeError):
                ident = e.get("identity")
                memory[str(key)] = plan.MemoryEntry(
                    str(e["digest"]),
                    frozenset(str(n) for n in e["missing"]),
                    str(e["kind"]),
                    str(e["quarantine"]),
                    _identity(ident),
                )
    return memory


def save_memory(path: Path, memory: Mapping[str, plan.MemoryEntry]) -> None:
    """Write the heal memory atomically. Raises OSError."""
    fsio.write_json(
        path,
        {
            k: {
                "digest": e.digest,
                "missing": sorted(e.missing),
                "kind": e.kind,
                "quarantine": e.quarantine,
                "identity": list(e.identity) if e.identity is not None else None,
            }
            for k, e in sorted(memory.items())
        },
        indent=1,
    )


def _identity(raw: object) -> tuple[int, int, int, int] | None:
    """A recorded (device, inode, size, mtime_ns), or None (0.1.0 memory, or not four ints)."""
    if isinstance(raw, list) and len(raw) == 4 and all(type(v) is int for v in raw):
        return (raw[0], raw[1], raw[2], raw[3])
    return None
