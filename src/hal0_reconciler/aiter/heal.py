"""Quarantine and restore: the only writer in a JIT folder.

Invalidating a module moves exactly ``<jit>/module_<name>.so`` and ``<jit>/build/module_<name>/``
into ``<jit>/.hal0-quarantine/<UTC time>/`` (same filesystem, so every move is a rename), all or
nothing: on any error the moves already made are undone. A manifest written before the first
move lets ``restore`` put a quarantine back. Also here: finding builds in progress and the
processes that have a module mapped (psutil), and the heal memory of the convergence guard.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hal0_reconciler import fsio
from hal0_reconciler.aiter import plan
from hal0_reconciler.errors import ReconcilerError

if TYPE_CHECKING:
    import psutil

QUARANTINE_DIR = ".hal0-quarantine"
MANIFEST = "manifest.json"
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


class HealFailed(ReconcilerError):
    """A quarantine or restore failed; every move it made was undone (the message says so)."""


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


# --- quarantine and restore ----------------------------------------------------------------------


def quarantine(
    jit_dir: Path, modules: Mapping[str, plan.ModulePlan], *, now: dt.datetime | None = None
) -> Quarantine:
    """Move each module's ``.so`` and ``build/<module>/`` (nothing else) into a new quarantine.

    All or nothing: raises HealFailed after undoing every move when one fails.
    """
    pairs: list[Move] = []
    qdir = _new_quarantine_dir(jit_dir, now)
    for module in sorted(modules):
        for src, rel in (
            (jit_dir / f"{module}.so", f"{module}.so"),
            (jit_dir / "build" / module, f"build/{module}"),
        ):
            if src.exists() or src.is_symlink():
                pairs.append(Move(src, qdir / rel))
    manifest = {
        "id": qdir.name,
        "kind": "heal",
        "created": _utc(now).isoformat(),
        "jit_dir": str(jit_dir),
        "moves": [{"src": str(m.src), "dst": str(m.dst)} for m in pairs],
        "modules": {
            name: {
                "digest": mp.digest,
                "missing": [m.name for m in mp.missing],
                "reason": mp.reason,
            }
            for name, mp in sorted(modules.items())
        },
    }
    return _execute(qdir, pairs, manifest, tuple(sorted(modules)))


def restore(
    jit_dir: Path, qid: str, *, now: dt.datetime | None = None
) -> tuple[Quarantine, Quarantine | None]:
    """Put quarantine ``qid`` back. What now sits in its place is quarantined first (nothing lost).

    Returns (the restored quarantine, the quarantine of displaced files or None). Raises HealFailed.
    """
    qdir = jit_dir / QUARANTINE_DIR / qid
    if "/" in qid or qid in {"", ".", ".."} or not (qdir / MANIFEST).is_file():
        known = ", ".join(q.name for q in list_quarantines(jit_dir)) or "none"
        raise HealFailed(f"no quarantine {qid!r} in {jit_dir / QUARANTINE_DIR} (known: {known})")
    try:
        manifest = json.loads((qdir / MANIFEST).read_text(encoding="utf-8"))
        recorded_jit = Path(manifest["jit_dir"])
        relatives = [_inside(Path(m["src"]), recorded_jit) for m in manifest["moves"]]
        modules = tuple(manifest.get("modules", {}))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HealFailed(f"quarantine {qid}: unreadable manifest: {exc}") from None
    # paths are taken relative to the quarantine and the JIT folder as they are now, so a JIT
    # folder that moved still restores, and a manifest can never name a file outside them
    moves = [Move(qdir / rel, jit_dir / rel) for rel in relatives]
    missing = [str(m.src) for m in moves if not (m.src.exists() or m.src.is_symlink())]
    if missing:
        raise HealFailed(
            f"quarantine {qid} is incomplete (missing: {', '.join(missing)}); nothing was moved"
        )
    displaced: Quarantine | None = None
    occupied = [m.dst for m in moves if m.dst.exists() or m.dst.is_symlink()]
    if occupied:
        ddir = _new_quarantine_dir(jit_dir, now)
        pairs = [Move(p, ddir / p.relative_to(jit_dir)) for p in occupied]
        displaced = _execute(
            ddir,
            pairs,
            {
                "id": ddir.name,
                "kind": "displaced-by-restore",
                "restored": qid,
                "created": _utc(now).isoformat(),
                "jit_dir": str(jit_dir),
                "moves": [{"src": str(m.src), "dst": str(m.dst)} for m in pairs],
                "modules": {m: {} for m in modules},
            },
            modules,
        )
    try:
        _move_all(moves)
    except HealFailed:
        if displaced is not None:
            _move_all([Move(m.dst, m.src) for m in displaced.moves])
            shutil.rmtree(displaced.path, ignore_errors=True)
        raise
    _remove_emptied(qdir)
    return Quarantine(qid, qdir, tuple(moves), modules), displaced


def _inside(path: Path, root: Path) -> Path:
    """``path`` relative to ``root``; refuses anything that would leave it."""
    rel = path.relative_to(root)  # ValueError when outside
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"{path} is not inside {root}")
    return rel


def _remove_emptied(qdir: Path) -> None:
    """Remove a restored quarantine: its manifest and the folders left empty, nothing else."""
    with contextlib.suppress(FileNotFoundError):
        (qdir / MANIFEST).unlink()
    for folder in sorted((p for p in qdir.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        qdir.rmdir()


def list_quarantines(jit_dir: Path) -> list[Path]:
    """Quarantine folders, oldest first."""
    root = jit_dir / QUARANTINE_DIR
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def prune(jit_dir: Path, *, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` quarantines; returns the ids deleted."""
    old = list_quarantines(jit_dir)
    doomed = old[: max(0, len(old) - max(keep, 0))]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in doomed]


def _execute(
    qdir: Path, pairs: list[Move], manifest: dict[str, Any], modules: tuple[str, ...]
) -> Quarantine:
    try:
        qdir.mkdir(parents=True)  # never into a folder that exists (another heal's): not ours
    except OSError as exc:
        raise HealFailed(f"cannot create quarantine {qdir}: {exc}; nothing was moved") from None
    try:
        fsio.write_json(qdir / MANIFEST, manifest, indent=1)
    except OSError as exc:
        shutil.rmtree(qdir, ignore_errors=True)
        raise HealFailed(f"cannot create quarantine {qdir}: {exc}; nothing was moved") from None
    try:
        _move_all(pairs)
    except HealFailed:
        shutil.rmtree(qdir, ignore_errors=True)
        raise
    return Quarantine(qdir.name, qdir, tuple(pairs), modules)


def _move_all(pairs: list[Move]) -> None:
    done: list[Move] = []
    for move in pairs:
        try:
            move.dst.parent.mkdir(parents=True, exist_ok=True)
            if move.dst.exists() or move.dst.is_symlink():
                raise FileExistsError(f"{move.dst} exists")
            os.rename(move.src, move.dst)
        except OSError as exc:
            undo_errors = []
            for prev in reversed(done):
                try:
                    os.rename(prev.dst, prev.src)
                except OSError as undo_exc:
                    undo_errors.append(f"{prev.dst} -> {prev.src}: {undo_exc}")
            if undo_errors:
                raise HealFailed(
                    f"moving {move.src} failed ({exc}); undo FAILED for: {'; '.join(undo_errors)}"
                ) from None
            raise HealFailed(
                f"moving {move.src} failed ({exc}); all {len(done)} earlier "
                "move(s) undone, nothing changed"
            ) from None
        done.append(move)


def _new_quarantine_dir(jit_dir: Path, now: dt.datetime | None) -> Path:
    base = _utc(now).strftime("%Y%m%dT%H%M%SZ")
    root = jit_dir / QUARANTINE_DIR
    candidate, n = root / base, 1
    while candidate.exists():
        n += 1
        candidate = root / f"{base}-{n}"
    return candidate


def _utc(now: dt.datetime | None) -> dt.datetime:
    return now if now is not None else dt.datetime.now(dt.UTC)


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
                memory[str(key)] = plan.MemoryEntry(
                    str(e["digest"]),
                    frozenset(str(n) for n in e["missing"]),
                    str(e["kind"]),
                    str(e["quarantine"]),
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
            }
            for k, e in sorted(memory.items())
        },
        indent=1,
    )
