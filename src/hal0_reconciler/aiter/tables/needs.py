"""What each environment's tables ask of each module, kept on disk: a check in a new process
with nothing changed reads this one small file and stats its inputs, instead of decoding every
cached table row and deriving the needs and the duplicate merge again.

An entry is keyed by a digest of every input of that derivation (``survey`` computes it): this
package's version and this format's, the target choice, the routing and the rule set in force
with the aiter version, and for every table read, in order, its path, its stamp ``(dev, inode,
size, mtime_ns, ctime_ns)``, the route and merge keys it was read with and its part in the plan.
Any change of any of them is another key, so a stale entry is never found, only left unused (and
dropped at the next save). Entries are stored only when every table read was *settled* (see
``tablecache``), the same rule the parsed tables follow.

An entry holds which reads are the plan's sources with each one's summary, the duplicate merge's
losing lines per merged resolution, and per module the needed names with their references
(encoded as text, decoded only when a name turns out missing). A file that is not JSON, of
another version or of another package version reads as empty and is rewritten; a bad entry is a
miss. Writes are atomic (``fsio.write_json``); at most ``MAX_ENTRIES`` entries are kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, overload

from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.tables import cachefile
from hal0_reconciler.aiter.tables import rows as tables

CACHE_VERSION = 1
MAX_ENTRIES = 32
"""Environments with distinct inputs remembered (the rest are derived again each check)."""

_RUNS = r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*"
_REFS = re.compile(rf"(?:\d+:{_RUNS}(?:;\d+:{_RUNS})*)?")
_READ_INDEX = re.compile(r"(?:^|;)(\d+):")


@dataclass(frozen=True)
class Summary:
    """A table's summary: all a plan shows of it besides its rows."""

    digest: str
    data_rows: int
    other_target_rows: int
    uncompiled_rows: int
    quirks: tuple[str, ...]
    broken: tuple[tables.BrokenRow, ...]

    @classmethod
    def of(cls, table: tables.Table) -> Summary:
        return cls(
            table.digest,
            table.data_rows,
            table.other_target_rows,
            table.uncompiled_rows,
            table.quirks,
            table.broken,
        )


@dataclass(frozen=True)
class Derived:
    """The derived part of one environment's plan, by index into its list of table reads."""

    sources: dict[int, Summary]  # read index -> summary, in the plan's source order
    merges: tuple[tuple[dict[PurePath, frozenset[int]], int], ...]  # (losing lines, in dups)
    needs: dict[str, plan.Needs]


class LazyRefs(Sequence[plan.Reference]):
    """The references of one name, decoded from ``text`` when first used."""

    __slots__ = ("_decoded", "_paths", "_text")

    def __init__(self, text: str, paths: Sequence[PurePath]) -> None:
        self._text = text
        self._paths = paths
        self._decoded: tuple[plan.Reference, ...] | None = None

    def _refs(self) -> tuple[plan.Reference, ...]:
        if self._decoded is None:
            self._decoded = decode_refs(self._text, self._paths)
        return self._decoded

    @overload
    def __getitem__(self, index: int) -> plan.Reference: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[plan.Reference]: ...
    def __getitem__(self, index: int | slice) -> plan.Reference | Sequence[plan.Reference]:
        return self._refs()[index]

    def __len__(self) -> int:
        return len(self._refs())

    def __iter__(self) -> Iterator[plan.Reference]:
        return iter(self._refs())


def encode_refs(refs: Sequence[plan.Reference], index: dict[PurePath, int]) -> str:
    """``i:3-7,9;j:2``: per read index (in order of appearance), lines as runs."""
    parts: list[str] = []
    current: int | None = None
    runs: list[list[int]] = []

    def flush() -> None:
        if current is not None:
            shown = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
            parts.append(f"{current}:{shown}")

    for ref in refs:
        i = index[ref.table]
        if i != current:
            flush()
            current, runs = i, []
        if runs and ref.line == runs[-1][1] + 1:
            runs[-1][1] = ref.line
        else:
            runs.append([ref.line, ref.line])
    flush()
    return ";".join(parts)


def decode_refs(text: str, paths: Sequence[PurePath]) -> tuple[plan.Reference, ...]:
    """The inverse of ``encode_refs``. Raises ValueError or IndexError on damage."""
    refs: list[plan.Reference] = []
    for part in text.split(";") if text else ():
        where, _, shown = part.partition(":")
        path = paths[int(where)]
        for run in shown.split(","):
            first, _, last = run.partition("-")
            start = int(first)
            end = int(last) if last else start
            refs.extend(plan.Reference(path, line) for line in range(start, end + 1))
    return tuple(refs)


def encode(derived: Derived, paths: Sequence[PurePath]) -> dict[str, Any]:
    index: dict[PurePath, int] = {}
    for i, path in enumerate(paths):
        index.setdefault(path, i)
    return {
        "sources": [
            [
                i,
                s.digest,
                [s.data_rows, s.other_target_rows, s.uncompiled_rows],
                list(s.quirks),
                [[b.line, b.module, b.reason] for b in s.broken],
            ]
            for i, s in derived.sources.items()
        ],
        "merges": [
            [[[index[path], sorted(lines)] for path, lines in lost.items()], in_dups]
            for lost, in_dups in derived.merges
        ],
        "needs": {
            module: {
                "names": {n: encode_refs(r, index) for n, r in need.names.items()},
                "unbuildable": {n: encode_refs(r, index) for n, r in need.unbuildable.items()},
                "broken": [[index[b.table], b.line, b.reason] for b in need.broken],
                "merged_away": need.merged_away,
            }
            for module, need in derived.needs.items()
        },
    }


def decode(raw: Any, paths: Sequence[PurePath]) -> Derived:
    """An entry back, its references left encoded. Raises ValueError, TypeError, KeyError,
    IndexError or AttributeError on damage."""
    sources: dict[int, Summary] = {}
    for i, digest, (data, other, uncompiled), quirks, broken in raw["sources"]:
        paths[int(i)]  # an index past the reads is damage (IndexError)
        sources[int(i)] = Summary(
            str(digest),
            int(data),
            int(other),
            int(uncompiled),
            tuple(str(q) for q in quirks),
            tuple(tables.BrokenRow(int(a), str(b), str(c)) for a, b, c in broken),
        )
    merges = tuple(
        ({paths[int(i)]: frozenset(int(n) for n in lines) for i, lines in lost}, int(in_dups))
        for lost, in_dups in raw["merges"]
    )
    needs: dict[str, plan.Needs] = {}
    for module, entry in raw["needs"].items():
        needs[str(module)] = plan.Needs(
            names={str(n): LazyRefs(_refs(t, paths), paths) for n, t in entry["names"].items()},
            unbuildable={
                str(n): LazyRefs(_refs(t, paths), paths) for n, t in entry["unbuildable"].items()
            },
            broken=[
                plan.Broken(paths[int(i)], int(line), str(reason))
                for i, line, reason in entry["broken"]
            ],
            merged_away=int(entry["merged_away"]),
        )
    return Derived(sources, merges, needs)


def _refs(value: Any, paths: Sequence[PurePath]) -> str:
    """Encoded references checked now (their form and read indices), so that decoding them
    later cannot fail. Raises TypeError or ValueError."""
    if not isinstance(value, str):
        raise TypeError("references must be text")
    if _REFS.fullmatch(value) is None:
        raise ValueError(f"bad references {value[:40]!r}")
    if any(int(i) >= len(paths) for i in _READ_INDEX.findall(value)):
        raise ValueError("a reference names no read")
    return value


class NeedsCache:
    """Entries from ``path`` (None: memory only), read when first asked for; ``save`` keeps
    the entries used since the last save and writes when anything changed."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: dict[str, Any] = {}
        self._used: dict[str, None] = {}  # in order of first use
        self._dirty = False
        self._loaded = path is None
        self.hits = 0  # entries found since start (tests and the benchmark count these)

    def get(self, key: str, paths: Sequence[PurePath]) -> Derived | None:
        """The entry for ``key`` decoded against ``paths`` (the reads' paths), or None."""
        self._load()
        raw = self._entries.get(key)
        if raw is None:
            return None
        try:
            derived = decode(raw, paths)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            del self._entries[key]
            self._dirty = True
            return None
        self._use(key)
        self.hits += 1
        return derived

    def put(self, key: str, derived: Derived, paths: Sequence[PurePath]) -> None:
        self._load()
        self._entries[key] = encode(derived, paths)
        self._use(key)
        self._dirty = True

    def save(self) -> None:
        """Write the entries used since the last save when anything changed. Raises OSError."""
        kept = list(self._used)[:MAX_ENTRIES]
        if self._loaded and self._entries.keys() != set(kept):
            self._entries = {k: self._entries[k] for k in kept if k in self._entries}
            self._dirty = True
        self._used = {}
        if self._path is None or not self._dirty:
            return
        cachefile.write(self._path, CACHE_VERSION, "entries", self._entries)
        self._dirty = False

    def _use(self, key: str) -> None:
        self._used.setdefault(key)

    def _load(self) -> None:
        if self._loaded or self._path is None:
            return
        self._loaded = True
        # an untrusted file (unreadable, another format or version) is rewritten at the next save
        self._entries, self._dirty = cachefile.read(self._path, CACHE_VERSION, "entries")
