"""What the reconciler last read of each slot file, so an unchanged file is not parsed again.

Two ways to know a file is unchanged:

- its **identity** — ``(device, inode, size, mtime_ns, ctime_ns)`` from ``lstat`` — is the one
  it had when it was read, and that read was *settled*: the file's ctime was more than
  ``SETTLED_NS`` older than the moment of the read. Any later write, chmod, chown or rename
  onto the path sets a ctime of "now" (which userspace cannot forge), so it cannot collide
  with a settled one, whatever the file system's timestamp granularity (a file written within
  the same clock tick as its read is the "racy" case; it is never trusted by stat alone);
- else, its **content**: the bytes read now hash to the bytes parsed before.

A hit still gives a *current* verdict: the verdict is re-computed (from the cached parse)
whenever the judging context changed since it was made — host facts, hal0's facts, the
profile catalog (``judge_with``) — or the slot's own demotion record did.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from hal0_reconciler.model import SlotKey, Verdict
from hal0_reconciler.slots.document import SlotDoc

SETTLED_NS = 1_000_000_000
"""A read is trusted by stat alone when the file's ctime was this much older than the read."""

Identity = tuple[int, int, int, int, int]
Decide = Callable[[SlotDoc], Verdict]


def identity_of(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def digest_of(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass
class _Entry:
    identity: Identity
    settled: bool  # the read may be trusted by identity alone
    digest: bytes
    doc: SlotDoc
    verdict: Verdict
    generation: int  # the judging context the verdict was made in
    demoted: bool  # the demotion record the verdict was made with
    outcome: Any = None  # the caller's outcome for this verdict (same_outcome)
    outcome_for: tuple[int, bool] | None = None  # (generation, apply) it was made in


@dataclass(frozen=True)
class Hit:
    doc: SlotDoc
    verdict: Verdict


class SeenSlots:
    """Per slot key: the last parse and verdict, and how to recognise the same file again."""

    def __init__(self) -> None:
        self._entries: dict[SlotKey, _Entry] = {}
        self._context: object = None
        self._generation = 0

    def __len__(self) -> int:
        return len(self._entries)

    def judge_with(self, context: object) -> None:
        """The context every verdict depends on; a different one re-judges every slot."""
        if context != self._context:
            self._context = context
            self._generation += 1

    def by_identity(
        self, key: SlotKey, st: os.stat_result, *, demoted: bool, decide: Decide
    ) -> Hit | None:
        """A hit when ``st`` is the identity of a settled read of this file."""
        entry = self._entries.get(key)
        if entry is None or not entry.settled or entry.identity != identity_of(st):
            return None
        return self._current(entry, demoted=demoted, decide=decide)

    def by_content(
        self, key: SlotKey, data: bytes, st: os.stat_result, *, read_at_ns: int, demoted: bool,
        decide: Decide,
    ) -> Hit | None:  # fmt: skip
        """A hit when ``data`` are the bytes parsed before (the identity is refreshed)."""
        entry = self._entries.get(key)
        if entry is None or entry.digest != digest_of(data):
            return None
        entry.identity = identity_of(st)
        entry.settled = _settled(st, read_at_ns)
        return self._current(entry, demoted=demoted, decide=decide)

    def remember(
        self, key: SlotKey, data: bytes, st: os.stat_result, doc: SlotDoc, verdict: Verdict, *,
        read_at_ns: int, demoted: bool,
    ) -> None:  # fmt: skip
        self._entries[key] = _Entry(
            identity_of(st), _settled(st, read_at_ns), digest_of(data), doc, verdict,
            self._generation, demoted,
        )  # fmt: skip

    def same_outcome(self, key: SlotKey, *, apply: bool) -> Any:
        """The outcome noted for this file when nothing changed since (a settled read, the
        same identity now, the same context and mode; not demoted by us): None otherwise."""
        entry = self._entries.get(key)
        if (
            entry is None
            or entry.outcome_for != (self._generation, apply)
            or not entry.settled
            or entry.generation != self._generation
            or entry.demoted
        ):
            return None
        try:
            st = os.lstat(key)
        except OSError:
            return None
        if identity_of(st) != entry.identity:
            return None
        return entry.outcome

    def note_outcome(self, key: SlotKey, outcome: object, *, apply: bool, keep: bool) -> None:
        """What the caller made of this file's current verdict (``keep``: it is what the
        same file gets again in the same context)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if keep and entry.generation == self._generation:
            entry.outcome, entry.outcome_for = outcome, (self._generation, apply)
        else:
            entry.outcome, entry.outcome_for = None, None

    def forget(self, key: SlotKey) -> None:
        self._entries.pop(key, None)

    def keep_only(self, keys: Collection[SlotKey]) -> None:
        """After a full listing: drop the files that are no longer there."""
        for key in [k for k in self._entries if k not in keys]:
            del self._entries[key]

    def _current(self, entry: _Entry, *, demoted: bool, decide: Decide) -> Hit:
        if entry.generation != self._generation or entry.demoted != demoted:
            entry.outcome = entry.outcome_for = None
            entry.verdict = decide(entry.doc)
            entry.generation = self._generation
            entry.demoted = demoted
        return Hit(entry.doc, entry.verdict)


def _settled(st: os.stat_result, read_at_ns: int) -> bool:
    return st.st_ctime_ns < read_at_ns - SETTLED_NS
