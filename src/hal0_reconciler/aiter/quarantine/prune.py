"""Pruning quarantines: the oldest beyond ``keep`` go, by folder fds, never through a link, and
only those this daemon wrote whose every module is there and whose operation is finished."""

from __future__ import annotations

import os

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.quarantine import folder as qfs
from hal0_reconciler.aiter.quarantine import journal as qj
from hal0_reconciler.aiter.quarantine import ops as qops


def prune_at(tree: qops.Tree, *, keep: int) -> qops.Pruned:
    """Delete the oldest quarantines beyond ``keep``, by folder fds, never following a link, and
    never one that is unverified, has an unfinished journal, or lacks a module it lists."""
    try:
        root = tree.root()
    except FileNotFoundError:
        return qops.Pruned()
    old = qops.ids(tree)
    removed: list[str] = []
    kept: list[tuple[str, str]] = []
    for qid in old[: max(0, len(old) - max(keep, 0))]:
        why = _unprunable(tree, qid)
        if why:
            kept.append((qid, why))
            continue
        tree.forget_place(qid)
        try:
            qfs.rmtree(root, qid, label=tree.label(qid))
        except qfs.FolderRefused as exc:  # a mount or a link inside: what is left stays
            kept.append((qid, str(exc)))
            continue
        tree.book.forget(tree.key, qid)
        removed.append(qid)
    if removed:
        os.fsync(root)
    return qops.Pruned(tuple(removed), tuple(kept))


def _unprunable(tree: qops.Tree, qid: str) -> str:
    try:
        if qfs.lstat_at(tree.place(qid), qj.JOURNAL) is not None:
            return "an operation on it is unfinished"
        data, verified = qops.read_signed(tree, qid, qops.MANIFEST, "manifest")
        if data is None or not verified:
            return "unverified (not written by this daemon, or from 0.1.0): never pruned"
        rels, _modules = qops.parse_manifest(data)
    except (OSError, qfs.HealFailed, qj.JournalInvalid, boundedread.ReadRefused) as exc:
        return f"cannot be judged: {exc}"
    missing = [r for r in rels if not tree.present(qid, r)]
    return f"its modules are not all there (missing: {', '.join(missing)})" if missing else ""
