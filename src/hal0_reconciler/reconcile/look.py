"""One look at one slot file: its bytes read (or known from the memory of unchanged files),
parsed and judged; its outcome, or the relabel to write with its group under hal0's lock."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hal0_reconciler import errors
from hal0_reconciler.errors import OverLimit, WriteRefused
from hal0_reconciler.model import Action, SlotKey, Verdict
from hal0_reconciler.reconcile import demotions
from hal0_reconciler.reconcile import outcome as out
from hal0_reconciler.reconcile.outcome import Outcome, OutcomeStatus
from hal0_reconciler.slots import document, store

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from hal0_reconciler.reconcile.judge import Judge
    from hal0_reconciler.slots import edit, limits, seen
    from hal0_reconciler.state import DemotionLedger

Read = tuple[document.SlotDoc, Verdict, store.SlotFile | None]
"""A slot's document and verdict, and the bytes they were made of (None: known by identity)."""


@dataclass
class Write:
    """A relabel decided on an unlocked read, to be written with its group under the lock."""

    key: SlotKey
    path: Path
    doc: document.SlotDoc
    verdict: Verdict
    read: store.SlotFile | None  # the bytes it was decided on (None: known by its identity)
    edit: edit.EditResult | None  # the edit of those bytes, made before the lock is held
    at: int = -1  # its place in the pass's outcomes


def _dry_write(
    slot_file: store.SlotFile, doc: document.SlotDoc, new: str | None
) -> tuple[OutcomeStatus, str | None]:
    """What the write would do, said beforehand: PENDING, with why when it would rewrite the
    whole file (comments and layout lost); WRITE_FAILED when the edit would be refused."""
    if new is None:
        return OutcomeStatus.PENDING, None
    from hal0_reconciler.slots import edit  # noqa: PLC0415 - the editor loads for a relabel

    try:
        result = edit.set_device_in(
            slot_file.data.decode("utf-8"), tables=doc.write_tables, new=new, parsed=doc.data
        )
    except Exception as exc:  # refused, or anything the editor raised: as the write would
        return OutcomeStatus.WRITE_FAILED, errors.describe(exc)
    return OutcomeStatus.PENDING, None if result.byte_minimal else result.note


class Looker:
    """Looks at slot files with these limits, this memory and this ledger."""

    def __init__(
        self,
        *,
        seen_slots: seen.SeenSlots,
        ledger: DemotionLedger,
        slot_limits: limits.Limits,
        forget: Callable[[SlotKey], None],
    ) -> None:
        """``forget``: a file found gone, everything remembered of it goes."""
        self._seen = seen_slots
        self._ledger = ledger
        self.limits = slot_limits
        self._forget = forget

    def look(self, path: Path, key: SlotKey, judge: Judge, *, apply: bool) -> Outcome | Write:
        """The file's outcome, or the relabel to write (with its group, under hal0's lock)."""
        # a dry run previews the edit: it needs the bytes (still not parsed when unchanged)
        read = self.read_and_decide(path, key, judge, fresh=not apply)
        if isinstance(read, Outcome):
            return read
        doc, verdict, slot_file = read
        held = judge.held_back(doc, verdict)
        if held is not None:
            hold, why = held
            return out.of_doc(key, path, doc, OutcomeStatus.HANDS_OFF, verdict, why, hold=hold)
        if verdict.action is Action.SKIP:
            return out.of_doc(key, path, doc, OutcomeStatus.SKIPPED, verdict)
        if verdict.action is Action.KEEP:
            demotions.settle(self._ledger, key, verdict)
            return out.of_doc(key, path, doc, OutcomeStatus.UNCHANGED, verdict)
        if not apply:
            assert slot_file is not None  # noqa: S101 - a dry run reads the bytes (fresh)
            status, note = _dry_write(slot_file, doc, verdict.new)
            return out.of_doc(key, path, doc, status, verdict, note)
        made = None
        if slot_file is not None and verdict.new is not None:
            from hal0_reconciler.slots import edit  # noqa: PLC0415 - the editor loads for a relabel

            try:  # the edit of these bytes, made before the lock is held (reused if unchanged)
                text = slot_file.data.decode("utf-8")
                made = edit.set_device_in(
                    text, tables=doc.write_tables, new=verdict.new, parsed=doc.data
                )
            except Exception:  # made again under the lock, which reports it
                made = None
        return Write(key, path, doc, verdict, slot_file, made)

    def read_and_decide(
        self, path: Path, key: SlotKey, judge: Judge, *, fresh: bool
    ) -> Read | Outcome:
        """The slot's document and verdict. ``fresh``: read the bytes now (under the lock);
        else a file whose identity has not changed since a settled read is not read again
        (the SlotFile is then None)."""
        demoted = key in self._ledger

        def decide(doc: document.SlotDoc) -> Verdict:
            return judge.decide(doc, demoted=demoted)

        if not fresh:
            try:
                st = os.lstat(path)
            except OSError:
                pass  # read_slot says what is wrong
            else:
                hit = self._seen.by_identity(key, st, demoted=demoted, decide=decide)
                if hit is not None:
                    return hit.doc, hit.verdict, None
        read_at = time.time_ns()
        try:
            slot_file = store.read_slot(path, max_bytes=self.limits.max_bytes)
        except FileNotFoundError:
            self._forget(key)
            self._ledger.drop(key)  # a new file at this path is not the slot we demoted
            return Outcome(key, path, None, None, OutcomeStatus.GONE)
        except WriteRefused as exc:
            self._seen.forget(key)
            return Outcome(key, path, None, None, OutcomeStatus.NOT_REGULAR, message=str(exc))
        except (OSError, OverLimit) as exc:
            self._seen.forget(key)
            return Outcome(key, path, None, None, OutcomeStatus.UNREADABLE, message=str(exc))
        data, st = slot_file.data, slot_file.stat
        hit = self._seen.by_content(
            key, data, st, read_at_ns=read_at, demoted=demoted, decide=decide
        )
        if hit is not None:
            return hit.doc, hit.verdict, slot_file
        try:
            text = data.decode("utf-8")
            doc = document.parse_slot(text, stem=path.stem, limits=self.limits)
            verdict = decide(doc)
        except Exception as exc:  # not UTF-8, not TOML, over a limit, or anything else
            self._seen.forget(key)
            message = errors.describe(exc)
            return Outcome(key, path, None, None, OutcomeStatus.UNREADABLE, message=message)
        self._seen.remember(key, data, st, doc, verdict, read_at_ns=read_at, demoted=demoted)
        return doc, verdict, slot_file
