"""Heal, restore, roll and prune a JIT folder with the credentials of its tree's owner.

A tree root owns (``LocalTree``) is handled in this process, as ``heal`` does. Any other tree's
operation runs in the owner's child (``owner_heal_child``): every open, rename, mkdir and rmtree
is then the owner's, so a link or a race reaches only what that user could reach anyway. The
digest book stays here and answers the child's questions; the key never leaves root. A child
that dies or does not answer in time fails that folder's operation (``HealFailed``): its journal
lets the next run roll it forward or back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import as_owner_child as owner_heal_child
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.quarantine import ops as qops
from hal0_reconciler.aiter.trees import owner_io as treeio


def child_of(io: treeio.TreeIO) -> treeio.ChildTree | None:
    """The owner's child that handles ``io``'s tree, or None for a tree root owns."""
    if isinstance(io, treeio.SplitTree):
        return io.child
    if isinstance(io, treeio.ChildTree):
        return io
    if io.credentials.uid != 0:
        raise heal.HealFailed(f"no child for {io.describe()}'s tree; nothing was done")
    return None


def _run(
    child: treeio.ChildTree,
    op: str,
    jit_dir: Path,
    book: manifest_digest.Book,
    **args: Any,
) -> dict[str, Any]:
    key = str(jit_dir)

    def answer(question: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        return owner_heal_child.answer_book(book, key, question, fds)

    try:
        result = child.converse(op, jit_dir, answer, jit=key, **args)
    except treeio.TreeUnavailable as exc:
        raise heal.HealFailed(
            f"{jit_dir}: {exc.strerror}; an interrupted move is rolled by the next run"
        ) from None
    except boundedread.ReadRefused as exc:
        raise heal.HealFailed(f"{jit_dir}: {exc}") from None
    except FileNotFoundError:
        raise
    except OSError as exc:  # what the owner may not do (a folder of root's): said, not raised
        raise heal.HealFailed(
            f"{jit_dir}: {exc.strerror} for {child.describe()}: refused"
        ) from None
    if "heal_failed" in result:
        raise heal.HealFailed(str(result["heal_failed"]))
    return result


def _when(now: dt.datetime | None) -> str | None:
    return None if now is None else now.isoformat()


def quarantine(
    io: treeio.TreeIO,
    jit_dir: Path,
    modules: Mapping[str, plan.ModulePlan],
    *,
    book: manifest_digest.Book,
    now: dt.datetime | None = None,
) -> heal.Quarantine:
    """``heal.quarantine`` as the tree's owner. Raises HealFailed or OSError."""
    child = child_of(io)
    if child is None:
        return heal.quarantine(jit_dir, modules, book=book, now=now)
    entries = {m: qops.plan_entry(mp) for m, mp in sorted(modules.items())}
    result = _run(child, "heal_quarantine", jit_dir, book, modules=entries, now=_when(now))
    return owner_heal_child.decode(result["quarantine"])


def restore(
    io: treeio.TreeIO,
    jit_dir: Path,
    qid: str,
    *,
    book: manifest_digest.Book,
    now: dt.datetime | None = None,
) -> tuple[heal.Quarantine, heal.Quarantine | None]:
    """``heal.restore`` as the tree's owner: it can only move what the owner could."""
    child = child_of(io)
    if child is None:
        return heal.restore(jit_dir, qid, book=book, now=now)
    result = _run(child, "heal_restore", jit_dir, book, qid=qid, now=_when(now))
    displaced = result.get("displaced")
    return (
        owner_heal_child.decode(result["quarantine"]),
        None if displaced is None else owner_heal_child.decode(displaced),
    )


def recover(io: treeio.TreeIO, jit_dir: Path, *, book: manifest_digest.Book) -> list[qops.Rolled]:
    """``heal.recover`` as the tree's owner."""
    child = child_of(io)
    if child is None:
        return heal.recover(jit_dir, book=book)
    try:
        result = _run(child, "heal_recover", jit_dir, book)
    except FileNotFoundError:
        return []
    return [qops.Rolled(*(str(x) for x in r)) for r in result.get("rolled", [])]


def prune(
    io: treeio.TreeIO, jit_dir: Path, *, keep: int, book: manifest_digest.Book
) -> qops.Pruned:
    """``heal.prune`` as the tree's owner."""
    child = child_of(io)
    if child is None:
        return heal.prune(jit_dir, keep=keep, book=book)
    result = _run(child, "heal_prune", jit_dir, book, keep=keep)
    return qops.Pruned(
        tuple(str(q) for q in result.get("removed", [])),
        tuple((str(q), str(w)) for q, w in result.get("kept", [])),
    )
