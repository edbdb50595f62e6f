"""Module file → which kernel names it registered, cached by the file's identity.

A name-keyed module holds each registered name as a NUL-terminated literal. A name is registered
when its bytes followed by a NUL occur in the file: the end must match exactly (``..._1`` is not
in ``..._1_aqrm``), the start need not (linkers merge a string into the tail of a longer one).

One pass over the file collects every printable NUL-terminated run; each queried name is then a
set lookup (exact) or a bisect over the reversed runs (tail). Answers are remembered per file
identity ``(dev, inode, size, mtime_ns, ctime_ns)`` in a JSON file in the state directory, so an
unchanged tree costs one ``stat`` per module (the ctime, which no one can set, shows a rewrite
that kept size and mtime); a file is read again only when it changed or when names it
was never asked about appear (the tables changed).
"""

from __future__ import annotations

import bisect
import json
import mmap
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hal0_reconciler import boundedread, fsio
from hal0_reconciler.aiter import namescan, treeio

_RUN = re.compile(rb"[\x20-\x7e]+\x00")
_PRINTABLE = re.compile(r"[\x20-\x7e]+")
_CACHE_VERSION = 2

Identity = tuple[int, int, int, int, int]
"""(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): a file is re-read only when this
changes."""


def identity_of(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class ModuleScan:
    """What one module registered, for the names asked about."""

    path: Path
    identity: Identity
    registered: dict[str, bool]
    read: bool  # the file was read for this answer (False: from the cache)


def registered_in(data: bytes | mmap.mmap, names: Iterable[str]) -> dict[str, bool]:
    """The NUL-terminated exact-suffix rule for each name over ``data``: a ``find`` pass per
    group of names sharing a prefix (``namescan``), else one pass over every run."""
    return namescan.registered_in(data, names, fallback=registered_in_runs)


def registered_in_runs(data: bytes | mmap.mmap, names: Iterable[str]) -> dict[str, bool]:
    """The NUL-terminated exact-suffix rule for each name over ``data`` (one pass)."""
    wanted = set(names)
    if not wanted:
        return {}
    runs = set(_RUN.findall(data))
    answer: dict[str, bool] = {}
    reversed_runs: list[bytes] | None = None
    for name in wanted:
        raw = name.encode("utf-8", "surrogateescape")
        if not raw:
            answer[name] = False
        elif not _PRINTABLE.fullmatch(name):
            answer[name] = data.find(raw + b"\x00") != -1
        elif raw + b"\x00" in runs:
            answer[name] = True
        else:
            if reversed_runs is None:
                reversed_runs = sorted(r[-2::-1] for r in runs)  # drop the NUL, reverse
            key = raw[::-1]
            i = bisect.bisect_left(reversed_runs, key)
            answer[name] = i < len(reversed_runs) and reversed_runs[i].startswith(key)
    return answer


def _identity(st: treeio.Stat) -> Identity:
    return (st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns)


class Registry:
    """The registry cache, one per process, persisted in ``cache_file`` (None: memory only)."""

    def __init__(self, cache_file: Path | None) -> None:
        self._file = cache_file
        self._entries: dict[str, tuple[Identity, dict[str, bool]]] = {}
        self._dirty = False
        self.reads = 0  # files read since start (tests and the benchmark count these)
        self.load_error: str | None = None
        if cache_file is not None:
            self._load(cache_file)

    def scan(
        self, path: Path, names: Iterable[str], *, io: treeio.TreeIO | None = None
    ) -> ModuleScan | None:
        """What ``path`` registered among ``names``; None when the module does not exist.

        The module is looked at through ``io`` (its tree; None: a root-owned tree at its
        folder): never through a link, only a regular file, mapped. Raises OSError or
        ``boundedread.ReadRefused`` when the file exists but cannot be read.
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
        fd, _ = io.open_regular(path)
        try:
            self.reads += 1
            size = os.fstat(fd).st_size
            if size == 0:
                answer = registered_in(b"", unknown)
            else:
                with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                    answer = registered_in(mm, unknown)
            after = identity_of(os.fstat(fd))
        finally:
            os.close(fd)
        again = io.lstat(path)
        if after == ident and again is not None and _identity(again) == ident:
            known.update(answer)
            self._entries[key] = (ident, known)
            self._dirty = True
        else:  # rewritten while we read it: answer now, remember nothing
            known.update(answer)
        return ModuleScan(path, ident, {n: known[n] for n in wanted}, read=True)

    def forget_missing(self, keep: Iterable[Path]) -> None:
        """Drop entries for modules not in ``keep`` (deleted or quarantined)."""
        alive = {str(p) for p in keep}
        for key in [k for k in self._entries if k not in alive]:
            del self._entries[key]
            self._dirty = True

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
