"""Module file → which kernel names it registered, cached by the file's identity.

A name-keyed module holds each registered name as a NUL-terminated literal. A name is registered
when its bytes followed by a NUL occur in the file: the end must match exactly (``..._1`` is not
in ``..._1_aqrm``), the start need not (linkers merge a string into the tail of a longer one).

The file is never mapped: it is read in bounded ``pread`` chunks (``modulescan``), inside the
owner's child for a tree root does not own (only the names found come back), in this process
for root's own. A module over ``max_bytes`` or with holes is not read ("not checked", degraded,
never healed); one rewritten while it was read is judged again at the next check, and after
``KEEPS_CHANGING_AFTER`` checks in a row is "not checked: keeps changing". Answers are
remembered per file identity ``(dev, inode, size, mtime_ns, ctime_ns)`` in a JSON file in the
state directory (kept across starts), so an unchanged tree costs one ``stat`` per module (the
ctime, which no one can set, shows a rewrite that kept size and mtime); a file is read again
only when it changed or when names it was never asked about appear (the tables changed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hal0_reconciler import boundedread, fsio
from hal0_reconciler.aiter.registry import names as namescan
from hal0_reconciler.aiter.registry import scan as modulescan
from hal0_reconciler.aiter.trees import owner_io as treeio

_CACHE_VERSION = 2
DEFAULT_MAX_BYTES = 1 << 30
"""``[aiter] module_max_bytes``'s default: real aiter modules are some MiB to a few hundred."""
KEEPS_CHANGING_AFTER = 3
"""Checks in a row that found a module rewritten while it was read before it is "keeps
changing" (degraded) rather than judged again at the next check."""

TOO_LARGE = "not checked: module too large"
SPARSE = "not checked: sparse module"
KEEPS_CHANGING = "not checked: keeps changing"
OVER_BUDGET = "not checked: the check ran past its time budget"
REWRITTEN = "rewritten while read; judged again at the next check"

Identity = tuple[int, int, int, int, int]
"""(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): a file is re-read only when this
changes."""


@dataclass(frozen=True)
class ModuleScan:
    """What one module registered, for the names asked about."""

    path: Path
    identity: Identity
    registered: dict[str, bool]
    read: bool  # the file was read for this answer (False: from the cache)


def registered_in(data: bytes, names: Iterable[str]) -> dict[str, bool]:
    """The NUL-terminated exact-suffix rule for each name over ``data``: a ``find`` pass per
    group of names sharing a prefix (``namescan``), else one pass over every run."""
    return namescan.registered_in(data, names, fallback=registered_in_runs)


def registered_in_runs(data: bytes, names: Iterable[str]) -> dict[str, bool]:
    """The NUL-terminated exact-suffix rule for each name over ``data`` (one pass)."""
    return namescan.registered_in_runs(data, names)


def _identity(st: treeio.Stat) -> Identity:
    return (st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns)


class Registry:
    """The registry cache, one per process, persisted in ``cache_file`` (None: memory only)."""

    def __init__(self, cache_file: Path | None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._file = cache_file
        self.max_bytes = max_bytes
        self._entries: dict[str, tuple[Identity, dict[str, bool]]] = {}
        self._changing: dict[str, int] = {}  # checks in a row a module changed while read
        self._dirty = False
        self.reads = 0  # files read since start (tests and the benchmark count these)
        self.load_error: str | None = None
        if cache_file is not None:
            self._load(cache_file)

    def scan(
        self,
        path: Path,
        names: Iterable[str],
        *,
        io: treeio.TreeIO | None = None,
        deadline: float | None = None,
    ) -> ModuleScan | None:
        """What ``path`` registered among ``names``; None when the module does not exist.

        The module is looked at through ``io`` (its tree; None: a root-owned tree at its
        folder): never through a link, only a regular file, read in bounded chunks by the
        tree's owner. ``deadline`` (``time.monotonic``) bounds the read. Raises OSError or
        ``boundedread.ReadRefused`` when the file exists but cannot be read or is not checked
        (the reason says which).
        """
        wanted = set(names)
        if io is None:
            io = treeio.local_at(path.parent)
        st = io.lstat(path)
        if st is None:
            return None
        ident = _identity(st)
        key = str(path)
        cached = self._entries.get(key)
        known: dict[str, bool] = (
            dict(cached[1]) if cached is not None and cached[0] == ident else {}
        )
        unknown = wanted - known.keys()
        if not unknown:
            return ModuleScan(path, ident, {n: known[n] for n in wanted}, read=False)
        if not st.is_file:
            raise boundedread.ReadRefused(
                path, f"{boundedread.kind_of_mode(st.mode)}, not a module"
            )
        if st.size > self.max_bytes:
            raise boundedread.ReadRefused(path, self._too_large(st.size))
        if deadline is not None and time.monotonic() > deadline:
            raise boundedread.ReadRefused(path, OVER_BUDGET)
        budget = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.reads += 1
        opened, outcome, found = io.scan(
            path, sorted(unknown), max_bytes=self.max_bytes, budget=budget
        )
        if outcome is modulescan.Outcome.TOO_LARGE:
            raise boundedread.ReadRefused(path, self._too_large(opened.size))
        if outcome is modulescan.Outcome.SPARSE:
            raise boundedread.ReadRefused(
                path, f"{SPARSE} (holes before its end; {opened.size} bytes apparent)"
            )
        if outcome is modulescan.Outcome.OVER_BUDGET:
            raise boundedread.ReadRefused(path, OVER_BUDGET)
        again = io.lstat(path) if outcome is modulescan.Outcome.SCANNED else None
        if again is None or ident != _identity(opened) or ident != _identity(again):
            times = self._changing[key] = self._changing.get(key, 0) + 1
            if times >= KEEPS_CHANGING_AFTER:
                raise boundedread.ReadRefused(
                    path, f"{KEEPS_CHANGING} (rewritten while read at {times} checks in a row)"
                )
            raise boundedread.ReadRefused(path, REWRITTEN)
        self._changing.pop(key, None)
        known.update({n: n in found for n in unknown})
        self._entries[key] = (ident, known)
        self._dirty = True
        return ModuleScan(path, ident, {n: known[n] for n in wanted}, read=True)

    def _too_large(self, size: int) -> str:
        return f"{TOO_LARGE} ({size} bytes, over module_max_bytes = {self.max_bytes})"

    def forget_missing(self, keep: Iterable[Path]) -> None:
        """Drop entries for modules not in ``keep`` (deleted or quarantined)."""
        alive = {str(p) for p in keep}
        for key in [k for k in self._entries if k not in alive]:
            del self._entries[key]
            self._dirty = True
        for key in [k for k in self._changing if k not in alive]:
            del self._changing[key]

    def save(self) -> None:
        """Write the cache atomically when it changed. Raises OSError."""
        if self._file is None or not self._dirty:
            return
        payload = {
            "version": _CACHE_VERSION,
            "modules": {
                k: {"identity": list(ident), "names": names}
                for k, (ident, names) in sorted(self._entries.items())
            },
        }
        fsio.write_json(self._file, payload, separators=(",", ":"))
        self._dirty = False

    def _load(self, cache_file: Path) -> None:
        try:
            raw: Any = json.loads(cache_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self.load_error = f"{cache_file}: {exc}"
            return
        if not isinstance(raw, dict) or raw.get("version") != _CACHE_VERSION:
            self.load_error = f"{cache_file}: unknown cache version"
            return
        modules = raw.get("modules")
        if not isinstance(modules, dict):
            return
        for key, entry in modules.items():
            try:
                a, b, c, d, e = (int(x) for x in entry["identity"])
                names = {str(n): bool(v) for n, v in entry["names"].items()}
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            self._entries[str(key)] = ((a, b, c, d, e), names)
