"""An environment's table reads → the plan's sources, each merge's losers, the needs per
module: derived from the tables, or taken from the derived cache when every input is as it was.

The reads are listed by ``survey`` (``Read``: file, route, merge keys, part in the plan); each is
stat'ed, and its cache key names the file as it is (``tablecache.key_of``: path, stamp, route,
targets). The derived result's key is a digest of those keys with the context (target choice,
routing, rule set, aiter version, this package's version): when ``needscache`` holds it, nothing
is decoded and the sources' rows are read only if someone looks at them. Otherwise each table is
taken from this process's earlier reads (settled ones only), the table cache, or the file, and
the result is stored when every read was settled.
"""

from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath

from hal0_reconciler import __version__, boundedread
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import cache as tablecache
from hal0_reconciler.aiter.tables import needs as needscache
from hal0_reconciler.aiter.tables import resolve, target
from hal0_reconciler.aiter.tables import rows as tables
from hal0_reconciler.aiter.trees import owner_io as treeio


class Part(enum.Enum):
    """What a table read is for in the plan."""

    SOURCE = "source"  # a source of the plan, read or not
    FEED = "feed"  # a source when it has rows of its id-keyed libtype
    MERGE = "merge"  # read only for the duplicate merge (its route compiles nothing)


@dataclass(frozen=True)
class Read:
    """One table read an environment's plan needs (the same file may be read several ways)."""

    file: resolve.ResolvedFile
    route: routing.TableRoute
    keys: tuple[str, ...]  # duplicate-merge key columns (none: not merged)
    part: Part
    group: int  # index of its merged resolution; -1: none


Merged = tuple[dict[PurePath, frozenset[int]], int]
Used = dict[str, tuple[plan.TableSource, bool]]
"""Table reads by their cache key (path, stamp, route, targets): the source and whether the read
was settled (an unsettled one is read again at the next check)."""


Derivation = tuple[list[plan.TableSource], list[Merged], dict[str, plan.Needs]]


@dataclass(frozen=True)
class Limits:
    """The caps on one table: bytes (checked before reading) and lines (before parsing)."""

    max_bytes: int = 64 << 20
    max_rows: int = 200_000


def stamp(st: treeio.Stat) -> tablecache.Stamp:
    """A table's identity from what the tree's ``lstat`` said."""
    return (st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns)


def _stat(io: treeio.TreeIO, path: PurePath) -> treeio.Stat | OSError:
    """The table's ``lstat`` through its tree; a missing, linked or odd file is an error."""
    try:
        st = io.lstat(path)
    except OSError as exc:
        return exc
    if st is None:
        return FileNotFoundError(2, "No such file or directory")
    if not st.is_file:
        return OSError(0, f"{boundedread.kind_of_mode(st.mode)}, not a regular file")
    return st


class Sources:
    """The caches of table reads and derived results, one per surveyor."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.table_cache = tablecache.TableCache(
            None if cache_dir is None else cache_dir / "tables.json"
        )
        self.needs_cache = needscache.NeedsCache(
            None if cache_dir is None else cache_dir / "needs.json"
        )
        self.table_reads = 0  # files parsed since start (tests and the benchmark count these)
        self._tables: Used = {}
        self._used: Used = {}
        self._io: treeio.TreeIO = treeio.LocalTree((), treeio.ROOT)  # derive sets it
        self._limits = Limits()

    def next_survey(self) -> None:
        """A survey starts: the last one's reads become the earlier ones."""
        self._tables, self._used = self._used, {}

    def save(self) -> None:
        """Write the caches that changed. Raises OSError."""
        self.table_cache.save()
        self.needs_cache.save()

    def derive(
        self,
        reads: list[Read],
        groups: int,
        choice: target.TargetChoice,
        context: tuple[object, ...],
        routing_key: str,
        *,
        io: treeio.TreeIO,
        limits: Limits | None = None,
    ) -> Derivation:
        """The plan's sources, the losers of each of the ``groups`` merges (a group may have no
        read: its files are all missing) and the needs per module: from the derived cache when
        every input is as it was, else from the tables (stored when all settled)."""
        targets = choice.targets
        self._io, self._limits = io, limits or Limits()
        stats = [_stat(io, r.file.path) for r in reads]
        keys = [
            tablecache.key_of(Path(r.file.path), stamp(st), r.route, targets, r.keys)
            if isinstance(st, treeio.Stat)
            else ""
            for r, st in zip(reads, stats, strict=True)
        ]
        paths = [r.file.path for r in reads]
        cacheable = tablecache.ENABLED and all(keys)
        key = ""
        if cacheable:
            h = hashlib.sha256(
                repr((needscache.CACHE_VERSION, __version__, routing_key, context, groups)).encode()
            )
            for r, k in zip(reads, keys, strict=True):
                h.update(repr((k, r.part.value, r.group, str(r.file.origin))).encode())
            key = h.hexdigest()
            known = self.needs_cache.get(key, paths)
            if known is not None and len(known.merges) == groups:
                return self._rebuilt(known, reads, keys, targets)
        done = [self._table(r, st, k, targets) for r, st, k in zip(reads, stats, keys, strict=True)]
        chosen = [
            i
            for i, (r, (src, _)) in enumerate(zip(reads, done, strict=True))
            if r.part is Part.SOURCE
            or (
                r.part is Part.FEED
                and src.table is not None
                and (src.table.rows or src.table.broken)
            )
        ]
        sources = [done[i][0] for i in chosen]
        merges: list[Merged] = []
        losers: dict[PurePath, frozenset[int]] = {}
        for group in range(groups):
            files = [
                (src.file.path, src.table)
                for r, (src, _) in zip(reads, done, strict=True)
                if r.group == group and src.table is not None
            ]
            merges.append(plan.merge_losers(files))
            losers.update(merges[-1][0])
        needs = plan.module_needs(
            sources, lookup=choice.lookup, compiled=choice.compiled, losers=losers
        )
        if cacheable and all(settled for _, settled in done):
            summaries = {
                i: needscache.Summary.of(src.table)
                for i in chosen
                if (src := done[i][0]).table is not None
            }
            self.needs_cache.put(key, needscache.Derived(summaries, tuple(merges), needs), paths)
        return sources, merges, needs

    def _rebuilt(
        self,
        known: needscache.Derived,
        reads: list[Read],
        keys: list[str],
        targets: frozenset[tables.Target],
    ) -> Derivation:
        """A derived entry back as sources whose rows are read only when looked at."""
        for k in keys:
            self.table_cache.keep(k)  # its rows are still wanted, though not decoded
        sources: list[plan.TableSource] = []
        for i, summary in known.sources.items():
            r = reads[i]
            cached = self._used.get(keys[i]) or self._tables.get(keys[i])
            if cached is None or not cached[1] or cached[0].table is None:
                table = tablecache.LazyTable(
                    digest=summary.digest,
                    data_rows=summary.data_rows,
                    other_target_rows=summary.other_target_rows,
                    uncompiled_rows=summary.uncompiled_rows,
                    quirks=summary.quirks,
                    broken=summary.broken,
                    load=self._loader(r, keys[i], targets, summary.digest),
                )
                cached = (plan.TableSource(r.file, r.route, table=table), True)
            self._used[keys[i]] = cached
            src = cached[0]
            sources.append(
                src if src.file == r.file else plan.TableSource(r.file, r.route, src.table)
            )
        return sources, list(known.merges), known.needs

    def _loader(
        self, r: Read, key: str, targets: frozenset[tables.Target], digest: str
    ) -> Callable[[], tables.Table | None]:
        """The rows of a table known by its summary: from the table cache, else the file when
        it still has the same bytes; None when neither has them any more."""

        io, limits = self._io, self._limits

        def load() -> tables.Table | None:
            table = self.table_cache.get(key)
            if table is not None and table.digest == digest:
                return table
            try:
                table, settled = self._parse(
                    Path(r.file.path), None, r.route, targets, r.keys, io=io, limits=limits
                )
            except (OSError, tables.TableUnreadable, boundedread.ReadRefused):
                return None
            if table.digest != digest:
                return None
            if settled:
                self.table_cache.put(key, table)
            return table

        return load

    def _table(
        self,
        r: Read,
        st: treeio.Stat | OSError,
        key: str,
        targets: frozenset[tables.Target],
    ) -> tuple[plan.TableSource, bool]:
        """One table read (``key``: its cache key, from ``st``), and whether it is settled.

        Each way of reading a file is parsed once per survey; an earlier survey's read is taken
        only when it was settled, the table cache's only when it was stored (settled)."""
        if isinstance(st, OSError):
            return plan.TableSource(r.file, r.route, error=st.strerror or str(st)), False
        cached = self._used.get(key)
        if cached is None and (earlier := self._tables.get(key)) is not None and earlier[1]:
            cached = earlier
            self.table_cache.keep(key)  # still in use, though not asked for
        if cached is None and (on_disk := self.table_cache.get(key)) is not None:
            cached = (plan.TableSource(r.file, r.route, table=on_disk), True)
        if cached is None:
            try:
                table, settled = self._parse(
                    Path(r.file.path),
                    st,
                    r.route,
                    targets,
                    r.keys,
                    io=self._io,
                    limits=self._limits,
                )
                cached = (plan.TableSource(r.file, r.route, table=table), settled)
                if settled:
                    self.table_cache.put(key, table)
            except boundedread.ReadRefused as exc:
                cached = (plan.TableSource(r.file, r.route, error=exc.reason), False)
            except OSError as exc:
                cached = (plan.TableSource(r.file, r.route, error=exc.strerror or str(exc)), False)
            except tables.TableUnreadable as exc:
                cached = (plan.TableSource(r.file, r.route, error=str(exc)), False)
        elif cached[0].file != r.file:
            cached = (
                plan.TableSource(r.file, r.route, cached[0].table, cached[0].error),
                cached[1],
            )
        self._used[key] = cached
        return cached

    def _parse(
        self,
        path: Path,
        st: treeio.Stat | None,
        route: routing.TableRoute,
        targets: frozenset[tables.Target],
        keys: tuple[str, ...],
        *,
        io: treeio.TreeIO,
        limits: Limits,
    ) -> tuple[tables.Table, bool]:
        """Read and parse ``path`` through its tree (a regular file, at most ``max_bytes``, at
        most ``max_rows`` lines); settled when the file is the one ``st`` saw (None: any), did
        not change while it was read, and its last change is over ``SETTLED_NS`` old.
        Raises OSError, ReadRefused or TableUnreadable."""
        read_at = tablecache.now_ns()
        fd, _ = io.open_regular(path)
        try:
            before = os.fstat(fd)
            data = boundedread.read_fd(fd, path, max_bytes=limits.max_bytes)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        self.table_reads += 1
        lines = data.count(b"\n")
        if lines > limits.max_rows:
            raise tables.TableUnreadable(
                f"more than the {limits.max_rows}-line limit ({lines} lines); not parsed"
            )
        table = tables.parse_table(data, route=route, targets=targets, key_columns=keys)
        now = tablecache.stamp_of(after)
        settled = (
            tablecache.stamp_of(before) == now
            and (st is None or stamp(st) == now)
            and len(data) == after.st_size
            and tablecache.settled(after, read_at_ns=read_at)
        )
        return table, settled
