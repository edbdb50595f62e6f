"""Parsed tuned tables kept on disk, so a check in a new process parses only what changed.

An entry is keyed by the table's path and stamp ``(dev, inode, size, mtime_ns, ctime_ns)``
(the ctime: no one can set it, so an edit that restores size and mtime still shows), the route
it was read for (its full definition, hashed) and the targets; it holds exactly what
``tables.parse_table`` returned. Only *settled* reads are stored: a table whose ctime was less
than ``SETTLED_NS`` before the read could be rewritten within the same clock tick with an equal
stamp, so it is parsed again next time. The file carries this package's version: another
version's parser may read tables differently, so its entries are dropped.

The file is read only when an entry is first asked for: a check whose derived result is known
(``needscache``) never reads it, and its tables' rows are decoded only if someone looks at them
(``LazyTable``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import cachefile
from hal0_reconciler.aiter.tables import rows as tables

CACHE_VERSION = 2
SETTLED_NS = 1_000_000_000

Stamp = tuple[int, int, int, int, int]
"""(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)."""


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def key_of(
    path: Path,
    identity: Stamp,
    route: routing.TableRoute,
    targets: frozenset[tables.Target],
    key_columns: tuple[str, ...] = (),
) -> str:
    """The entry's key: the file as it is, and everything ``parse_table`` was asked."""
    asked = hashlib.sha256(repr((route, key_columns)).encode()).hexdigest()[:16]
    shown_targets = ",".join(str(t) for t in sorted(targets))
    return f"{path}|{':'.join(map(str, identity))}|{asked}|{shown_targets}"


def _fields(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


_SHAPE = (
    _fields(tables.Table),
    _fields(tables.KernelRow),
    _fields(tables.BrokenRow),
    _fields(tables.Shape),
)
_KNOWN = (
    ("rows", "digest", "data_rows", "other_target_rows", "uncompiled_rows", "quirks", "broken",
     "shapes"),
    ("name", "line", "module", "gfx", "cu_num"),
    ("line", "module", "reason"),
    ("line", "key", "us"),
)  # fmt: skip
ENABLED = _SHAPE == _KNOWN
"""False when ``tables`` grew a field this encoding does not carry: nothing is cached then
(never a table decoded without it)."""


def settled(st: os.stat_result, *, read_at_ns: int) -> bool:
    return st.st_ctime_ns < read_at_ns - SETTLED_NS


class LazyTable(tables.Table):
    """A table whose summary is known (digest, counts, quirks, broken rows) and whose rows and
    shapes are fetched by ``load`` when first looked at. ``load`` returns the whole table, or
    None when it cannot be had any more (the rows are then empty)."""

    def __init__(
        self,
        *,
        digest: str,
        data_rows: int,
        other_target_rows: int,
        uncompiled_rows: int,
        quirks: tuple[str, ...],
        broken: tuple[tables.BrokenRow, ...],
        load: Callable[[], tables.Table | None],
    ) -> None:
        for name, value in (
            ("digest", digest),
            ("data_rows", data_rows),
            ("other_target_rows", other_target_rows),
            ("uncompiled_rows", uncompiled_rows),
            ("quirks", quirks),
            ("broken", broken),
            ("_load", load),
            ("_heavy", None),
        ):
            object.__setattr__(self, name, value)

    @property  # a field of tables.Table, read-only here
    def rows(self) -> tuple[tables.KernelRow, ...]:
        return self._loaded()[0]

    @property
    def shapes(self) -> tuple[tables.Shape, ...]:
        return self._loaded()[1]

    @property
    def loaded(self) -> bool:
        """Whether the rows were fetched (tests and the benchmark look)."""
        return self.__dict__["_heavy"] is not None

    def _loaded(self) -> tuple[tuple[tables.KernelRow, ...], tuple[tables.Shape, ...]]:
        heavy: tuple[tuple[tables.KernelRow, ...], tuple[tables.Shape, ...]] | None
        heavy = self.__dict__["_heavy"]
        if heavy is None:
            full = self.__dict__["_load"]()
            heavy = ((), ()) if full is None else (full.rows, full.shapes)
            object.__setattr__(self, "_heavy", heavy)
        return heavy


class TableCache:
    """Entries from ``path`` (None: memory only); ``save`` writes them when they changed.

    The file is read at the first ``get`` or ``put``; ``keep`` marks an entry as still in use
    without reading it (its table's derived result was used instead)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: dict[str, Any] = {}
        self._used: set[str] = set()
        self._dirty = False
        self._loaded = path is None

    def keep(self, key: str) -> None:
        self._used.add(key)

    def get(self, key: str) -> tables.Table | None:
        if not ENABLED:
            return None
        self._load()
        raw = self._entries.get(key)
        if raw is None:
            return None
        try:
            table = _decode(raw)
        except (KeyError, TypeError, ValueError, IndexError):
            del self._entries[key]
            self._dirty = True
            return None
        self._used.add(key)
        return table

    def put(self, key: str, table: tables.Table) -> None:
        if not ENABLED:
            return
        self._load()
        self._entries[key] = _encode(table)
        self._used.add(key)
        self._dirty = True

    def save(self) -> None:
        """Keep the entries used since the last save; write when anything changed. OSError.

        Not read: nothing was added, and nothing is dropped (the entries kept are unknown)."""
        if not self._loaded:
            self._used = set()
            return
        stale = self._entries.keys() - self._used
        if stale:
            for key in stale:
                del self._entries[key]
            self._dirty = True
        self._used = set()
        if self._path is None or not self._dirty:
            return
        cachefile.write(self._path, CACHE_VERSION, "tables", self._entries)
        self._dirty = False

    def _load(self) -> None:
        if self._loaded or self._path is None:
            return
        self._loaded = True
        # absent or untrusted: every table is parsed again (and the file then replaced)
        self._entries, _ = cachefile.read(self._path, CACHE_VERSION, "tables")


def _encode(table: tables.Table) -> dict[str, Any]:
    names: dict[str, int] = {}
    modules: dict[str, int] = {}
    rows = [
        [
            names.setdefault(r.name, len(names)),
            r.line,
            modules.setdefault(r.module, len(modules)),
            r.gfx,
            r.cu_num,
        ]
        for r in table.rows
    ]
    return {
        "names": list(names),
        "modules": list(modules),
        "rows": rows,
        "digest": table.digest,
        "counts": [table.data_rows, table.other_target_rows, table.uncompiled_rows],
        "quirks": list(table.quirks),
        "broken": [[b.line, b.module, b.reason] for b in table.broken],
        "shapes": [[s.line, list(s.key), s.us] for s in table.shapes],
    }


def _decode(raw: dict[str, Any]) -> tables.Table:
    names = [str(n) for n in raw["names"]]
    modules = [str(m) for m in raw["modules"]]
    rows = tuple(
        tables.KernelRow(
            names[n],
            int(line),
            modules[m],
            None if gfx is None else str(gfx),
            None if cu is None else int(cu),
        )
        for n, line, m, gfx, cu in raw["rows"]
    )
    data_rows, other, uncompiled = (int(c) for c in raw["counts"])
    return tables.Table(
        rows,
        str(raw["digest"]),
        data_rows,
        other,
        uncompiled,
        tuple(map(str, raw["quirks"])),
        tuple(tables.BrokenRow(int(a), str(b), str(c)) for a, b, c in raw["broken"]),
        tuple(
            tables.Shape(int(line), tuple(map(str, key)), float(us))
            for line, key, us in raw["shapes"]
        ),
    )


def now_ns() -> int:
    return time.time_ns()
