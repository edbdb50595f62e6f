"""Which table files a plan reads, and the keys aiter's duplicate merge goes by.

Per environment, the resolved tables become a list of reads (``sources.Read``): the files a
compiled module is built from, those only merged, the id-keyed feeds and the fixed globs; a
table's merge keys come from its untuned sibling's header (read again only when it changes).
"""

from __future__ import annotations

from pathlib import Path

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import cache as tablecache
from hal0_reconciler.aiter.tables import resolve, sources
from hal0_reconciler.aiter.trees import access as treeaccess
from hal0_reconciler.aiter.trees import owner_io as treeio


class TableReads:
    """The reads of every plan; remembers each untuned header it read, by the file's stamp."""

    def __init__(self) -> None:
        self._untuned: dict[Path, tuple[object, tuple[str, ...]]] = {}

    def plan(
        self,
        resolutions: tuple[resolve.Resolution, ...],
        rules_in: routing.Routing,
        configs: Path,
        io: treeio.TreeIO,
        dedup_keys: tuple[str, ...] = ("cu_num", "gfx"),
    ) -> tuple[list[sources.Read], list[resolve.Resolution]]:
        """The table reads a plan needs, in plan order, and the resolutions aiter merges."""
        reads: list[sources.Read] = []
        merged: list[resolve.Resolution] = []
        for res in resolutions:
            feeds = [r for r in rules_in.registries if res.route.stem in r.tables]
            if not (res.route.compiled or feeds):
                continue
            # merged files: aiter's duplicate merge; one file: its lookup needs unique shapes
            keys = self.merge_keys(configs, res.route.stem, dedup_keys, io) if res.loaded else ()
            group = -1
            if keys:
                group = len(merged)
                merged.append(res)
            part = sources.Part.SOURCE if res.route.compiled else sources.Part.MERGE
            reads.extend(sources.Read(f, res.route, keys, part, group) for f in res.loaded)
            # an id-keyed module's rows: a source only when the file has rows of its libtype
            reads.extend(
                sources.Read(f, reg.route, (), sources.Part.FEED, -1)
                for reg in feeds
                for f in res.loaded
            )
        for reg in rules_in.registries:
            reads.extend(
                sources.Read(f, reg.route, (), sources.Part.SOURCE, -1)
                for f in fixed_files(io, configs, reg.files)
            )
        return reads, merged

    def merge_keys(
        self, configs: Path, stem: str, extra: tuple[str, ...], io: treeio.TreeIO
    ) -> tuple[str, ...]:
        """aiter's duplicate-merge keys: the untuned sibling's columns + ``extra`` (the installed
        aiter's); none (no merge) when the untuned file is absent."""
        path = configs / f"{'untuned'.join(stem.rsplit('tuned', 1))}.csv"
        ident = _identity(io, path)
        cached = self._untuned.get(path)
        if cached is not None and cached[0] == (ident, extra):
            return cached[1]
        keys: tuple[str, ...] = ()
        if ident is not None and (head := treeaccess.header_line(io, path)) is not None:
            cols = [c.strip() for c in head.strip().split(",") if c.strip()]
            keys = tuple(dict.fromkeys([*cols, *extra]))
        self._untuned[path] = ((ident, extra), keys)
        return keys


def _identity(io: treeio.TreeIO, path: Path) -> tablecache.Stamp | None:
    try:
        st = io.lstat(path)
    except OSError:
        return None
    return None if st is None or not st.is_file else sources.stamp(st)


def fixed_files(
    io: treeio.TreeIO, configs: Path, patterns: tuple[str, ...]
) -> list[resolve.ResolvedFile]:
    """The files fixed globs under ``configs/`` name (sorted, as aiter's generator globs them)."""
    return [
        resolve.ResolvedFile(p, resolve.Origin.FIXED, exists=True)
        for p in treeaccess.fixed_files(io, configs, patterns)
    ]
