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

The daemon keeps this memory across restarts (``load`` / ``save``, a file in its state
folder): per file its identity, whether that read was settled, its digest and its parsed
data — never a verdict, so every slot is judged again after a restart from its cached parse,
in the context of the day. Only what round-trips through JSON exactly is kept (a slot with a
TOML date is parsed again); a file written in another boot is trusted by content only (its
ctime cannot tell a write after a clock step); a missing, corrupt, oversized or foreign file
(another format, package version, slots folder or limits) reads as empty.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hal0_reconciler import errors, fsio
from hal0_reconciler._log import get_logger
from hal0_reconciler.boundedread import ReadRefused, read_bounded
from hal0_reconciler.model import SlotKey, Verdict
from hal0_reconciler.slots import document
from hal0_reconciler.slots.document import SlotDoc

_log = get_logger("hal0_reconciler.reconcile")

SETTLED_NS = 1_000_000_000
"""A read is trusted by stat alone when the file's ctime was this much older than the read."""

Identity = tuple[int, int, int, int, int]
Decide = Callable[[SlotDoc], Verdict]


identity_of = fsio.full_identity


def digest_of(data: bytes) -> bytes:
    import hashlib  # noqa: PLC0415 - loads OpenSSL: only in a process that reads a slot

    return hashlib.blake2b(data, digest_size=16).digest()


FORMAT = "hal0-reconciler seen-slots 1"
MAX_FILE_BYTES = 64 << 20
"""A saved memory larger than this is neither read nor written (it is saved without entries)."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(slots=True)
class _Entry:
    """What was read of one slot file, and the verdict made of it."""

    identity: Identity
    settled: bool  # the read may be trusted by identity alone
    digest: bytes
    doc: SlotDoc
    verdict: Verdict | None  # None: loaded from the saved memory, not judged yet
    generation: int  # the judging context the verdict was made in
    demoted: bool  # the demotion record the verdict was made with
    outcome: Any = None  # the caller's outcome for this verdict (same_outcome)
    outcome_for: tuple[int, bool] | None = None  # (generation, apply) it was made in


@dataclass(frozen=True)
class Hit:
    """An unchanged file: its cached parse and its current verdict."""

    doc: SlotDoc
    verdict: Verdict


class SeenSlots:
    """Per slot key: the last parse and verdict, and how to recognise the same file again."""

    def __init__(self, path: Path | None = None, *, scope: str = "") -> None:
        """``path``: where ``save`` keeps this memory for the next start (``load`` reads it);
        ``scope``: what it is valid for (the slots folder, the limits; see ``load``)."""
        self._entries: dict[SlotKey, _Entry] = {}
        self._context: object = None
        self._generation = 0
        self._path = path
        self._scope = scope
        self._dirty = False  # changed since loaded or saved
        self.save_error: str | None = None  # why the last save failed (None: it did not)

    @classmethod
    def load(cls, path: Path, *, scope: str) -> SeenSlots:
        """The memory ``save`` left at ``path`` for the same ``scope``: empty when the file is
        missing, unreadable, over ``MAX_FILE_BYTES``, not this format, or of another scope."""
        slots = cls(path, scope=scope)
        try:
            entries = _read_saved(path, scope)
        except (OSError, ValueError, TypeError, KeyError, IndexError, RecursionError):
            return slots  # corrupt or foreign: start empty (and overwrite it at the next save)
        except errors.SlotParseError:
            return slots
        slots._entries = entries
        return slots

    def rescope(self, scope: str) -> None:
        """What the memory is valid for from now on: another scope (limits, folder, version)
        forgets every file, whose parse was made under the old one."""
        if scope != self._scope:
            self._scope = scope
            self._entries.clear()
            self._dirty = True

    def save(self) -> None:
        """Write this memory to its path (atomically, mode 0600: slot files may hold secrets)
        when it changed; a failure is kept in ``save_error`` (the next full pass retries)."""
        if self._path is None or not self._dirty:
            return
        entries = [
            [key, *e.identity, e.settled, e.digest.hex(), e.doc.data]
            for key, e in self._entries.items()
            if _plain(e.doc.data)
        ]
        doc = {"format": FORMAT, "scope": self._scope, "boot": _boot_id(), "entries": entries}
        data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        if len(data) > MAX_FILE_BYTES:
            doc["entries"] = []
            data = json.dumps(doc).encode("utf-8")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fsio.write_atomically(self._path, data, mode=0o600)
        except OSError as exc:
            error = exc.strerror or str(exc)
            if error != self.save_error:  # said once; the next full pass tries again
                _log.warning(
                    "seen.save_failed",
                    path=str(self._path),
                    error=error,
                    effect="the next start parses every slot file again",
                )
            self.save_error = error
            return
        self.save_error = None
        self._dirty = False

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
        identity, settled = identity_of(st), _settled(st, read_at_ns)
        if (identity, settled) != (entry.identity, entry.settled):
            entry.identity, entry.settled = identity, settled
            entry.outcome = entry.outcome_for = None  # noted again for the new identity
            self._dirty = True
        return self._current(entry, demoted=demoted, decide=decide)

    def remember(
        self, key: SlotKey, data: bytes, st: os.stat_result, doc: SlotDoc, verdict: Verdict, *,
        read_at_ns: int, demoted: bool,
    ) -> None:  # fmt: skip
        self._entries[key] = _Entry(
            identity_of(st), _settled(st, read_at_ns), digest_of(data), doc, verdict,
            self._generation, demoted,
        )  # fmt: skip
        self._dirty = True

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

    def same_outcomes(
        self, keys: list[SlotKey], *, apply: bool, skip: Collection[SlotKey]
    ) -> tuple[list[Any], list[int]]:
        """``same_outcome`` of each key (a full pass: one lstat per file), None for a key in
        ``skip`` too; and the places of those Nones."""
        entries = self._entries
        wanted = (self._generation, apply)  # noted only for settled reads, not demoted by us
        lstat = os.lstat
        found: list[Any] = [None] * len(keys)
        missed: list[int] = []
        for at, key in enumerate(keys):
            entry = entries.get(key)
            if entry is None or entry.outcome_for != wanted or (skip and key in skip):
                missed.append(at)
                continue
            try:
                st = lstat(key)
            except OSError:
                missed.append(at)
                continue
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == entry.identity:
                found[at] = entry.outcome
            else:
                missed.append(at)
        return found, missed

    def note_outcome(self, key: SlotKey, outcome: object, *, apply: bool, keep: bool) -> None:
        """What the caller made of this file's current verdict (``keep``: it is what the
        same file gets again in the same context). Kept only for a settled read judged in
        this context, not demoted by us: what ``same_outcome`` gives back."""
        entry = self._entries.get(key)
        if entry is None:
            return
        reusable = entry.settled and not entry.demoted and entry.generation == self._generation
        if keep and reusable:
            entry.outcome, entry.outcome_for = outcome, (self._generation, apply)
        else:
            entry.outcome, entry.outcome_for = None, None

    def forget(self, key: SlotKey) -> None:
        if self._entries.pop(key, None) is not None:
            self._dirty = True

    def keep_only(self, keys: AbstractSet[SlotKey]) -> None:
        """After a full listing: drop the files that are no longer there, and save."""
        for key in self._entries.keys() - keys:
            del self._entries[key]
            self._dirty = True
        self.save()

    def _current(self, entry: _Entry, *, demoted: bool, decide: Decide) -> Hit:
        if (
            entry.verdict is None
            or entry.generation != self._generation
            or entry.demoted != demoted
        ):
            entry.outcome = entry.outcome_for = None
            entry.verdict = decide(entry.doc)
            entry.generation = self._generation
            entry.demoted = demoted
        return Hit(entry.doc, entry.verdict)


def _settled(st: os.stat_result, read_at_ns: int) -> bool:
    return st.st_ctime_ns < read_at_ns - SETTLED_NS


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _read_saved(path: Path, scope: str) -> dict[SlotKey, _Entry]:
    """The entries of a saved memory (raises on anything not exactly as ``save`` writes)."""
    try:
        raw = read_bounded(path, max_bytes=MAX_FILE_BYTES, missing_ok=True)
    except ReadRefused:  # a link, a FIFO, over the cap: start empty
        return {}
    if raw is None:
        return {}
    doc = json.loads(raw)
    if not isinstance(doc, dict) or (doc["format"], doc["scope"]) != (FORMAT, scope):
        return {}
    boot = doc["boot"]
    same_boot = isinstance(boot, str) and boot != "" and boot == _boot_id()
    entries: dict[SlotKey, _Entry] = {}
    for item in doc["entries"]:
        key, dev, ino, size, mtime, ctime, settled, digest, data = item
        identity = (dev, ino, size, mtime, ctime)
        if not (
            isinstance(key, str)
            and key.startswith("/")
            and type(dev) is type(ino) is type(size) is type(mtime) is type(ctime) is int
            and type(settled) is bool
            and isinstance(digest, str)
            and isinstance(data, dict)
        ):
            raise ValueError("not a saved entry")
        stem = _stem(key)
        entries[SlotKey(key)] = _Entry(
            identity, settled and same_boot, bytes.fromhex(digest),
            document.from_data(data, stem=stem), None, -1, demoted=False,
        )  # fmt: skip
    return entries


def _stem(key: str) -> str:
    """``Path(key).stem`` without a Path for each of thousands of slot files."""
    name = key.rpartition("/")[2]
    if name.endswith(".toml") and not name.startswith("."):
        return name[: -len(".toml")]
    return Path(name).stem


def _plain(value: object) -> bool:
    """Whether ``value`` comes back from JSON exactly as it is (no TOML dates or times)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            assert isinstance(item, dict)  # noqa: S101 - for mypy
            if not all(type(k) is str for k in item):
                return False
            stack.extend(item.values())
        elif kind is list:
            assert isinstance(item, list)  # noqa: S101 - for mypy
            stack.extend(item)
        elif kind not in (str, int, float, bool):
            return False
    return True
