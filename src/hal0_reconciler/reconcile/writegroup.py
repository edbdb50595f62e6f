"""Write groups: decided relabels written under one hold of hal0's lock, each file read and
judged again under it; their fsyncs reach the disk together, then each folder is synced once
for the whole pass. A failed write has this package's temp files removed while the lock is
held (so never one in flight)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hal0_reconciler import errors, fsio
from hal0_reconciler.errors import LockTimeout
from hal0_reconciler.model import Action
from hal0_reconciler.reconcile import demotions, temps
from hal0_reconciler.reconcile import outcome as out
from hal0_reconciler.reconcile.outcome import Outcome, OutcomeStatus
from hal0_reconciler.slots import document, store

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from hal0_reconciler.model import Verdict
    from hal0_reconciler.reconcile.judge import Judge
    from hal0_reconciler.reconcile.look import Looker, Write
    from hal0_reconciler.settings import Settings
    from hal0_reconciler.slots import edit, seen
    from hal0_reconciler.state import DemotionLedger

WRITE_GROUP = 32
"""Relabels written under one hold of hal0's lock: their fsyncs reach the disk together."""


@dataclass(frozen=True)
class _Ready:
    """A relabel under the lock whose temp file is written, waiting for its group's fsync."""

    write: Write
    doc: document.SlotDoc
    verdict: Verdict
    edit: edit.EditResult
    pending: fsio.PendingWrite
    data: bytes  # what the temp file holds


class GroupWriter:
    """Writes groups of relabels into the slots folder these settings name."""

    def __init__(
        self,
        settings: Settings,
        *,
        looker: Looker,
        seen_slots: seen.SeenSlots,
        ledger: DemotionLedger,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        """``cancelled``: ends a wait for the slot lock early (the daemon stops)."""
        self._settings = settings
        self._looker = looker
        self._seen = seen_slots
        self._ledger = ledger
        self._cancelled = cancelled

    def write(self, group: list[Write], outcomes: list[Outcome | None], judge: Judge) -> None:
        """Write decided relabels under one hold of hal0's lock: each file is read again and
        judged again under it and its temp file written; then every temp file is fsynced at
        once (one journal commit can carry them all) and renamed over its file. Each outcome
        goes to its place in ``outcomes``."""
        try:
            with store.slot_write_lock(
                self._settings.effective_lock_file,
                timeout=self._settings.lock_timeout,
                group_of=self._settings.slots_dir,
                cancelled=self._cancelled,
            ):
                self._write_under_lock(group, outcomes, judge)
        except (LockTimeout, OSError) as exc:
            for w in group:
                if outcomes[w.at] is None:
                    outcomes[w.at] = out.write_failed(w.key, w.path, w.doc, w.verdict, exc)

    def _write_under_lock(
        self, group: list[Write], outcomes: list[Outcome | None], judge: Judge
    ) -> None:
        ready: list[_Ready] = []
        try:
            for w in group:
                try:
                    step = self._prepare(w, judge)
                except Exception as exc:  # whatever one file raises, the others go on
                    self._seen.forget(w.key)
                    message = f"could not be processed: {errors.describe(exc)}"
                    step = Outcome(
                        w.key, w.path, None, None, OutcomeStatus.UNREADABLE, message=message
                    )
                if isinstance(step, Outcome):
                    outcomes[w.at] = step
                else:
                    ready.append(step)
        except BaseException:
            for r in ready:
                fsio.abandon(r.pending)
            raise
        # the folder is fsynced once for the whole pass (sync_folders)
        for r, error in zip(ready, fsio.commit_writes([r.pending for r in ready]), strict=True):
            w = r.write
            if error is not None:
                outcomes[w.at] = out.write_failed(w.key, w.path, r.doc, r.verdict, error)
                continue
            demotions.note_written(self._ledger, w.key, r.verdict, slot=r.doc.name)
            self._remember_written(r, judge)
            note = None if r.edit.byte_minimal else r.edit.note
            outcomes[w.at] = out.of_doc(
                w.key, w.path, r.doc, OutcomeStatus.RELABELED, r.verdict, note
            )
        failed = {OutcomeStatus.WRITE_FAILED}
        if any(getattr(outcomes[w.at], "status", None) in failed for w in group):
            temps.remove(self._settings, wait=True)  # we hold the lock: none of ours in flight

    def _remember_written(self, r: _Ready, judge: Judge) -> None:
        """What was just written, as if read back: the echo of the daemon's own write (its
        inotify event) is then known by its bytes and not parsed again. Any doubt forgets the
        file instead, and the next look reads and parses what is there."""
        key, path = r.write.key, r.write.path
        demoted = key in self._ledger
        parsed = r.edit.data
        try:
            if parsed is None:  # the editor always gives it; without it, nothing is remembered
                raise errors.SlotParseError("the edit's parse is not known")  # noqa: TRY301
            doc = document.from_checked_parse(
                r.edit.text, parsed, stem=path.stem, limits=self._looker.limits
            )
            verdict = judge.decide(doc, demoted=demoted)
        except Exception:  # over a limit now, or anything else: read and parsed next time
            self._seen.forget(key)
            return
        self._seen.remember(  # the temp file's stat: what was written is not a settled read
            key, r.data, r.pending.stat, doc, verdict, read_at_ns=time.time_ns(), demoted=demoted
        )

    def _prepare(self, w: Write, judge: Judge) -> Outcome | _Ready:
        """Under the lock: read the file again and judge it again (another writer may have
        changed it meanwhile; the same bytes as a moment ago are not parsed again), then its
        temp file (not yet synced)."""
        read = self._looker.read_and_decide(w.path, w.key, judge, fresh=True)
        if isinstance(read, Outcome):
            return read
        doc, verdict, slot_file = read
        if verdict.action is not Action.RELABEL or verdict.new is None or slot_file is None:
            status = (
                OutcomeStatus.SKIPPED if verdict.action is Action.SKIP else OutcomeStatus.UNCHANGED
            )
            return out.of_doc(w.key, w.path, doc, status, verdict)
        from hal0_reconciler.slots import edit  # noqa: PLC0415 - the editor loads for a relabel

        try:
            made = w.edit
            same = w.read is not None and w.read.data == slot_file.data
            if made is None or not same or w.verdict.new != verdict.new:
                text = slot_file.data.decode("utf-8")
                made = edit.set_device_in(
                    text, tables=doc.write_tables, new=verdict.new, parsed=doc.data
                )
            data = made.text.encode("utf-8")
            pending = store.begin_replace(w.path, data, like=slot_file.stat)
        except Exception as exc:  # refused, failed, or anything the editor raised
            return out.write_failed(w.key, w.path, doc, verdict, exc)
        return _Ready(w, doc, verdict, made, pending, data)


def sync_folders(outcomes: list[Outcome], made: list[int]) -> list[Outcome]:
    """fsync each folder a file was renamed into, once for the whole pass, before anything
    is reported or restarted; a folder that cannot be synced fails its relabels (``made``:
    the places of the outcomes made in this pass; the others are from the memory)."""
    relabeled = OutcomeStatus.RELABELED
    folders = {outcomes[at].path.parent for at in made if outcomes[at].status is relabeled}
    failed: dict[Path, tuple[str, int | None]] = {}
    for folder in sorted(folders):
        try:
            fsio.fsync_directory(folder)
        except OSError as exc:
            failed[folder] = (f"{folder}: the folder could not be synced: {exc}", exc.errno)
    if not failed:
        return outcomes
    return [
        dataclasses.replace(
            o,
            status=OutcomeStatus.WRITE_FAILED,
            message=failed[o.path.parent][0],
            errno=failed[o.path.parent][1],
        )
        if o.status is OutcomeStatus.RELABELED and o.path.parent in failed
        else o
        for o in outcomes
    ]
