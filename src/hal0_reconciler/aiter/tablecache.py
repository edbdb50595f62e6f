"""Parsed tuned tables kept on disk, so a check in a new process parses only what changed.

An entry is keyed by the table's path and identity ``(dev, inode, size, mtime_ns)``, the route
it was read for (its full definition, hashed) and the targets; it holds exactly what
``tables.parse_table`` returned. Only *settled* reads are stored: a table whose ctime was less
than ``SETTLED_NS`` before the read could be rewritten within the same clock tick with an equal
identity, so it is parsed again next time. The file carries this package's version: another
version's parser may read tables differently, so its entries are dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from hal0_reconciler import __version__, fsio
from hal0_reconciler.aiter import routing, tables

CACHE_VERSION = 1
SETTLED_NS = 1_000_000_000

Identity = tuple[int, int, int, int]


def key_of(
    path: Path, identity: Identity, route: routing.TableRoute, targets: frozenset[tables.Target]
) -> str:
    shown_route = hashlib.sha256(repr(route).encode()).hexdigest()[:16]
    shown_targets = ",".join(str(t) for t in sorted(targets))
    return f"{path}|{':'.join(map(str, identity))}|{shown_route}|{shown_targets}"


def settled(st: os.stat_result, *, read_at_ns: int) -> bool:
    return st.st_ctime_ns < read_at_ns - SETTLED_NS


class TableCache:
    """Entries from ``path`` (None: memory only); ``save`` writes them when they changed."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: dict[str, Any] = {}
        self._used: set[str] = set()
        self._dirty = False
        if path is not None:
            self._load(path)

    def get(self, key: str) -> tables.Table | None:
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
        self._entries[key] = _encode(table)
        self._used.add(key)
        self._dirty = True

    def save(self) -> None:
        """Keep the entries used since the last save; write when anything changed. OSError."""
        stale = self._entries.keys() - self._used
        if stale:
            for key in stale:
                del self._entries[key]
            self._dirty = True
        self._used = set()
        if self._path is None or not self._dirty:
            return
        payload = {"version": CACHE_VERSION, "package": __version__, "tables": self._entries}
        fsio.write_json(self._path, payload, separators=(",", ":"))
        self._dirty = False

    def _load(self, path: Path) -> None:
        try:
            raw = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return  # absent or unreadable: everything is parsed again
        if (
            isinstance(raw, dict)
            and raw.get("version") == CACHE_VERSION
            and raw.get("package") == __version__
            and isinstance(raw.get("tables"), dict)
        ):
            self._entries = raw["tables"]


def _encode(table: tables.Table) -> dict[str, Any]:
    names: dict[str, int] = {}
    modules: dict[str, int] = {}
    flat: list[int] = []
    for row in table.rows:
        flat += [
            names.setdefault(row.name, len(names)),
            row.line,
            modules.setdefault(row.module, len(modules)),
        ]
    return {
        "names": list(names),
        "modules": list(modules),
        "rows": flat,
        "digest": table.digest,
        "counts": [table.data_rows, table.other_target_rows, table.uncompiled_rows],
        "quirks": list(table.quirks),
    }


def _decode(raw: dict[str, Any]) -> tables.Table:
    names = [str(n) for n in raw["names"]]
    modules = [str(m) for m in raw["modules"]]
    flat = raw["rows"]
    if len(flat) % 3:
        raise ValueError("rows")
    row = tables.KernelRow
    rows = tuple(
        row(names[flat[i]], int(flat[i + 1]), modules[flat[i + 2]]) for i in range(0, len(flat), 3)
    )
    data_rows, other, uncompiled = (int(c) for c in raw["counts"])
    return tables.Table(
        rows, str(raw["digest"]), data_rows, other, uncompiled, tuple(map(str, raw["quirks"]))
    )


def now_ns() -> int:
    return time.time_ns()
