"""One reconcile pass over slot files: read -> decide -> write under the lock -> one event.

Level-triggered and idempotent: every call re-reads the files it is given, so a second pass
over its own output changes nothing and logs nothing. Problems (unreadable files, unresolved
runtimes, non-regular files) are reported once per file content, not on every pass.

One file can never stop the others: a file over a limit (``slots.limits``) is reported, not
parsed, and whatever reading, parsing, deciding or editing one file raises becomes that file's
reported problem, in one line, and the pass goes on. A pass stops between two files (never in
the middle of one) once ``cancelled()`` is true. Temp files of this package's own writes that a
crash left in the slots folder are removed under hal0's lock (so never one in flight).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hal0_reconciler import __version__, errors, fsio
from hal0_reconciler._log import get_logger
from hal0_reconciler.errors import LockTimeout, OverLimit, WriteRefused
from hal0_reconciler.host import hal0, restart_rules
from hal0_reconciler.host.envfile import read_env_file
from hal0_reconciler.model import Action, Catalog, Hal0Facts, HostFacts, Reason, SlotKey, Verdict
from hal0_reconciler.settings import Settings
from hal0_reconciler.slots import document, image, limits, policy, runtime, seen, store
from hal0_reconciler.state import DemotionLedger

if TYPE_CHECKING:
    from hal0_reconciler.slots import edit

_log = get_logger("hal0_reconciler.reconcile")
FIGHT_REASON = "fight: another writer keeps reverting this slot"


class OutcomeStatus(enum.StrEnum):
    UNCHANGED = "unchanged"  # kept, with the verdict's reason
    PENDING = "pending"  # dry run: would be relabelled (message: why comments would be lost)
    RELABELED = "relabeled"
    SKIPPED = "skipped"  # runtime unresolved
    HANDS_OFF = "hands-off"  # the daemon stopped fighting over this slot
    UNREADABLE = "unreadable"
    NOT_REGULAR = "not-regular"
    WRITE_FAILED = "write-failed"
    GONE = "gone"


@dataclass(frozen=True)
class Outcome:
    """What a pass did with one slot file."""

    key: SlotKey
    path: Path
    name: str | None
    token: str | None  # the unit token; None when hal0 could not run the slot under it
    status: OutcomeStatus
    verdict: Verdict | None = None
    message: str | None = None
    unit_problem: str | None = None  # why the name or id is not one hal0 could run
    errno: int | None = None  # a failed write's OSError errno (EROFS, EACCES, ...)


def _outcome(  # noqa: PLR0917 - the Outcome's own fields, in its order
    key: SlotKey,
    path: Path,
    doc: document.SlotDoc,
    status: OutcomeStatus,
    verdict: Verdict | None,
    message: str | None = None,
) -> Outcome:
    """An outcome for a parsed slot: its token only when hal0 could run a unit by it."""
    problem = doc.unit_problem
    token = doc.token if problem is None else None
    return Outcome(key, path, doc.name, token, status, verdict, message, problem)


def _write_failed(
    key: SlotKey, path: Path, doc: document.SlotDoc, verdict: Verdict, exc: Exception
) -> Outcome:
    failed = _outcome(key, path, doc, OutcomeStatus.WRITE_FAILED, verdict, errors.describe(exc))
    return dataclasses.replace(failed, errno=getattr(exc, "errno", None))


@dataclass(frozen=True)
class PassReport:
    """Every file's outcome of one pass, and how long it took."""

    outcomes: tuple[Outcome, ...]
    duration: float

    # looked at several times per pass (the daemon, the CLI): each filtered once, 10k outcomes
    @functools.cached_property
    def relabeled(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.status is OutcomeStatus.RELABELED)

    @functools.cached_property
    def pending(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.status is OutcomeStatus.PENDING)

    @functools.cached_property
    def failed(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.status is OutcomeStatus.WRITE_FAILED)


WRITE_GROUP = 32
"""Relabels written under one hold of hal0's lock: their fsyncs reach the disk together."""


@dataclass
class _Write:
    """A relabel decided on an unlocked read, to be written with its group under the lock."""

    key: SlotKey
    path: Path
    doc: document.SlotDoc
    verdict: Verdict
    read: store.SlotFile | None  # the bytes it was decided on (None: known by its identity)
    edit: edit.EditResult | None  # the edit of those bytes, made before the lock is held
    at: int = -1  # its place in the pass's outcomes


@dataclass(frozen=True)
class _Ready:
    """A relabel under the lock whose temp file is written, waiting for its group's fsync."""

    write: _Write
    doc: document.SlotDoc
    verdict: Verdict
    edit: edit.EditResult
    pending: fsio.PendingWrite
    data: bytes  # what the temp file holds


_UNREAD = object()  # the profiles file has not been read yet


_SAME = frozenset({OutcomeStatus.UNCHANGED, OutcomeStatus.SKIPPED, OutcomeStatus.PENDING})
"""Outcomes an unchanged file gets again in the same context (kept with the file's parse)."""


def _keyed(paths: Iterable[Path]) -> list[tuple[SlotKey, Path]]:
    return [(slot_key(p), p) for p in paths]


def slot_key(path: Path) -> SlotKey:
    return SlotKey(str(path if path.is_absolute() else path.absolute()))


def _dry_write(
    slot_file: store.SlotFile, doc: document.SlotDoc, new: str | None
) -> tuple[OutcomeStatus, str | None]:
    """What the write would do, said beforehand: PENDING, with why when it would rewrite the
    whole file (comments and layout lost); WRITE_FAILED when the edit would be refused."""
    if new is None:
        return OutcomeStatus.PENDING, None
    from hal0_reconciler.slots import edit  # noqa: PLC0415 - the editor loads for a relabel

    try:
        result = edit.set_device(
            slot_file.data.decode("utf-8"), table=doc.table, new=new, parsed=doc.data
        )
    except Exception as exc:  # refused, or anything the editor raised: as the write would
        return OutcomeStatus.WRITE_FAILED, errors.describe(exc)
    return OutcomeStatus.PENDING, None if result.byte_minimal else result.note


def _seen_scope(settings: Settings) -> str:
    """What a saved memory of slot files is valid for: this version, folder and limits."""
    folder = (
        settings.slots_dir if settings.slots_dir.is_absolute() else settings.slots_dir.absolute()
    )
    return f"{__version__} {limits.Limits(max_bytes=settings.slot_max_bytes)!r} {folder}"


class Reconciler:
    """Applies the policy to slot files. Holds only memory of what it already reported."""

    def __init__(
        self,
        settings: Settings,
        *,
        ledger: DemotionLedger | None = None,
        cancelled: Callable[[], bool] | None = None,
        seen_file: Path | None = None,
    ) -> None:
        """``seen_file``: where the memory of unchanged files is kept across restarts."""
        self._ledger = ledger if ledger is not None else DemotionLedger(None)
        self._cancelled = cancelled  # ends a wait for the slot lock early (the daemon stops)
        self._reported: dict[SlotKey, tuple[object, ...]] = {}
        self._unit_reported: dict[SlotKey, str] = {}
        self._catalog_reported: str | None = None
        self._temps_checked = False  # leftover temp files are looked for once, at the start
        self._hal0_reported: frozenset[hal0.FactProblem] = frozenset()
        self._seen = (
            seen.SeenSlots()
            if seen_file is None
            else seen.SeenSlots.load(seen_file, scope=_seen_scope(settings))
        )
        self._reported_outcome: dict[SlotKey, Outcome] = {}  # the outcome last reported
        # the folder, its names as listed, and the slot files' keys and names made of them
        self._last_listing: tuple[str, list[str], list[SlotKey], list[str]] | None = None
        self.hal0_facts: Hal0Facts | None = None  # as read for the last pass
        self._vulkan_paused = False  # HAL0_ALLOW_VULKAN_FALLBACK set in hal0's api.env
        self.hal0_problems: tuple[hal0.FactProblem, ...] = ()
        self.update_settings(settings)

    def update_settings(self, settings: Settings) -> None:
        """Take new settings (SIGHUP), keeping the memory of what was already reported."""
        self._settings = settings
        self._hal0 = hal0.Hal0Reader(settings)
        self._limits = limits.Limits(max_bytes=settings.slot_max_bytes)
        self._seen.rescope(_seen_scope(settings))  # parses made under other limits: dropped
        # read at the next pass (by _refresh_catalog), not here as well
        self._catalog_identity: tuple[int, int, int, int] | object | None = _UNREAD
        self._catalog: Catalog = Catalog()

    @property
    def own_demotions(self) -> int:
        """Slots on ``cpu`` now because this reconciler demoted them (a metrics gauge)."""
        return len(self._ledger.keys())

    def reconcile(
        self,
        facts: HostFacts,
        paths: Iterable[Path] | None = None,
        *,
        hands_off: Collection[SlotKey] = frozenset(),
        apply: bool = True,
    ) -> PassReport:
        """Reconcile the given slot files (default: every slot). ``apply=False`` is a dry run."""
        started = time.monotonic()
        self._refresh_catalog(quiet=not facts.amd)
        self._refresh_hal0(quiet=not facts.amd)
        assert self.hal0_facts is not None  # noqa: S101 - just read
        # what every verdict depends on besides the file: when it changes, every slot is judged
        # again (from its cached parse when the file is unchanged)
        self._note_vulkan_fallback()
        self._seen.judge_with(
            (
                facts.amd,
                facts.lane,
                self.hal0_facts,
                id(self._catalog),
                self._vulkan_paused,
                self._settings.hands_off,
            )
        )
        if apply and not self._temps_checked:
            self._temps_checked = True
            self._remove_leftover_temps(wait=False)
        if paths is None:
            keys, names = self._listing()
            known: list[Path] | list[str] = names
        else:
            keyed = _keyed(paths)
            keys, known = [k for k, _ in keyed], [p for _, p in keyed]
        # an unchanged file judged in this same context (and not ours to look at again: fought
        # over, demoted by us) has its outcome from the memory, with one lstat; None: looked at
        # below. Those outcomes were reported when they were made.
        outcomes: list[Outcome | None]
        outcomes, todo = self._seen.same_outcomes(
            keys, apply=apply, skip=self._ledger.keys() | frozenset(hands_off)
        )
        made = self._look_at(todo, outcomes, keys, known, facts, hands_off=hands_off, apply=apply)
        if paths is None and not self._is_cancelled():
            self._drop_unlisted(keys)
        done = self._sync_folders(cast("list[Outcome]", outcomes), made)  # every group written
        for at in made:
            o = done[at]
            self._seen.note_outcome(o.key, o, apply=apply, keep=o.status in _SAME)
        if facts.amd and apply:
            self._report_new([done[at] for at in made], facts)
        return PassReport(tuple(done), time.monotonic() - started)

    def _is_cancelled(self) -> bool:
        return self._cancelled is not None and self._cancelled()

    def _look_at(
        self,
        todo: list[int],
        outcomes: list[Outcome | None],
        keys: list[SlotKey],
        known: list[Path] | list[str],
        facts: HostFacts,
        *,
        hands_off: Collection[SlotKey],
        apply: bool,
    ) -> list[int]:
        """Each file at a place in ``todo``, in order: its outcome in its place (a relabel's
        when its write group is written). Stopping, the outcomes end before the first file not
        looked at. Returns the places of the outcomes made here."""
        made: list[int] = []
        group: list[_Write] = []
        folder = self._settings.slots_dir
        for at in todo:
            if self._is_cancelled():
                del outcomes[at:]  # stopping: between two files, never half-way through one
                break
            key, name = keys[at], known[at]
            path = name if isinstance(name, Path) else folder / name
            made.append(at)
            if key in hands_off:
                outcomes[at] = Outcome(
                    key, path, None, None, OutcomeStatus.HANDS_OFF, message=FIGHT_REASON
                )
                continue
            try:
                outcome = self._reconcile_one(path, key, facts, apply=apply)
            except Exception as exc:  # whatever one file raises, the pass goes on
                self._seen.forget(key)
                message = f"could not be processed: {errors.describe(exc)}"
                outcome = Outcome(key, path, None, None, OutcomeStatus.UNREADABLE, message=message)
            if isinstance(outcome, _Write):  # written with its group, under hal0's lock
                outcome.at = at
                group.append(outcome)
                if len(group) >= WRITE_GROUP:
                    self._write_group(group, outcomes, facts)
                    group = []
                continue
            outcomes[at] = outcome
        if group:  # decided before a stop, if any: written now
            self._write_group(group, outcomes, facts)
        return made

    def _listing(self) -> tuple[list[SlotKey], list[str]]:
        """Every slot file's key (its path made absolute) and name: no Path object each (the
        same lists as last time when the folder lists the same names in the same order)."""
        folder = self._settings.slots_dir
        base = str(folder if folder.is_absolute() else folder.absolute())
        listed = store.list_folder(folder)
        last = self._last_listing
        if last is not None and last[0] == base and last[1] == listed:
            return last[2], last[3]
        prefix = base if base.endswith("/") else base + "/"  # str keys, not 10k Path objects
        names = store.slot_names(listed)
        keys = cast("list[SlotKey]", [prefix + n for n in names])
        self._last_listing = (base, listed, keys, names)
        return keys, names

    def _drop_unlisted(self, keys: list[SlotKey]) -> None:
        """After a full listing: a slot file deleted with no pass over it is gone all the same
        (its parse, reported problems and our demotion record go, as when a pass finds it
        gone)."""
        listed = set(keys)
        self._seen.keep_only(listed)
        if self._reported_outcome.keys() <= listed and self._ledger.keys() <= listed:
            return  # nothing reported of a file that is not there
        folder = self._settings.slots_dir.absolute()
        for key in {*self._reported_outcome, *self._ledger.keys()} - listed:
            if Path(key).parent == folder:
                self.forget(key)
                self._ledger.drop(key)

    def _sync_folders(self, outcomes: list[Outcome], made: list[int]) -> list[Outcome]:
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

    def forget(self, key: SlotKey) -> None:
        """A slot file went away: forget what was reported about it."""
        self._reported.pop(key, None)
        self._unit_reported.pop(key, None)
        self._reported_outcome.pop(key, None)
        self._seen.forget(key)

    # -- one file ---------------------------------------------------------------------------

    def _reconcile_one(
        self, path: Path, key: SlotKey, facts: HostFacts, *, apply: bool
    ) -> Outcome | _Write:
        """The file's outcome, or the relabel to write (with its group, under hal0's lock)."""
        # a dry run previews the edit: it needs the bytes (still not parsed when unchanged)
        read = self._read_and_decide(path, key, facts, fresh=not apply)
        if isinstance(read, Outcome):
            return read
        doc, verdict, slot_file = read
        held = self._held_back(doc, verdict)
        if held is not None:
            return _outcome(key, path, doc, OutcomeStatus.HANDS_OFF, verdict, held)
        if verdict.action is Action.SKIP:
            return _outcome(key, path, doc, OutcomeStatus.SKIPPED, verdict)
        if verdict.action is Action.KEEP:
            self._settle_ledger(key, verdict)
            return _outcome(key, path, doc, OutcomeStatus.UNCHANGED, verdict)
        if not apply:
            assert slot_file is not None  # noqa: S101 - a dry run reads the bytes (fresh)
            status, note = _dry_write(slot_file, doc, verdict.new)
            return _outcome(key, path, doc, status, verdict, note)
        made = None
        if slot_file is not None and verdict.new is not None:
            from hal0_reconciler.slots import edit  # noqa: PLC0415 - the editor loads for a relabel

            try:  # the edit of these bytes, made before the lock is held (reused if unchanged)
                text = slot_file.data.decode("utf-8")
                made = edit.set_device(text, table=doc.table, new=verdict.new, parsed=doc.data)
            except Exception:  # made again under the lock, which reports it
                made = None
        return _Write(key, path, doc, verdict, slot_file, made)

    def _held_back(self, doc: document.SlotDoc, verdict: Verdict) -> str | None:
        """Why a deliberate choice keeps this slot as it is: the operator's ``hands_off``, or
        hal0's Vulkan opt-in while a Vulkan-candidate relabel is due."""
        if restart_rules.is_hands_off(self._settings.hands_off, name=doc.name, slot_id=doc.id):
            return "operator: listed in hands_off (never relabelled nor restarted)"
        relabel = verdict.action not in {Action.KEEP, Action.SKIP}
        if self._vulkan_paused and relabel and verdict.old == "gpu-vulkan":
            return f"paused: {restart_rules.VULKAN_FALLBACK_VARIABLE} is set in hal0's api.env"
        return None

    def _note_vulkan_fallback(self) -> None:
        """hal0's Vulkan opt-in, as hal0 reads it; said once (loudly) when it becomes set."""
        try:
            environment = read_env_file(self._settings.api_env_file)
        except (OSError, UnicodeDecodeError):
            environment = {}
        paused = restart_rules.vulkan_fallback_allowed(environment)
        if paused and not self._vulkan_paused:
            _log.warning(
                "slot.vulkan_relabels_paused",
                variable=restart_rules.VULKAN_FALLBACK_VARIABLE,
                path=str(self._settings.api_env_file),
                detail="the operator is running Vulkan on purpose: no gpu-vulkan slot is "
                "relabelled or restarted while it is set. hal0's own boot pass ignores this "
                "variable and still relabels unvalidated gpu-vulkan slots at every hal0-api start",
            )
        elif self._vulkan_paused and not paused:
            _log.info(
                "slot.vulkan_relabels_resumed", variable=restart_rules.VULKAN_FALLBACK_VARIABLE
            )
        self._vulkan_paused = paused

    def _write_group(
        self, group: list[_Write], outcomes: list[Outcome | None], facts: HostFacts
    ) -> None:
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
                self._write_under_lock(group, outcomes, facts)
        except (LockTimeout, OSError) as exc:
            for w in group:
                if outcomes[w.at] is None:
                    outcomes[w.at] = _write_failed(w.key, w.path, w.doc, w.verdict, exc)

    def _write_under_lock(
        self, group: list[_Write], outcomes: list[Outcome | None], facts: HostFacts
    ) -> None:
        ready: list[_Ready] = []
        try:
            for w in group:
                try:
                    step = self._prepare(w, facts)
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
        # the folder is fsynced once for the whole pass (_sync_folders)
        for r, error in zip(ready, fsio.commit_writes([r.pending for r in ready]), strict=True):
            w = r.write
            if error is not None:
                outcomes[w.at] = _write_failed(w.key, w.path, r.doc, r.verdict, error)
                continue
            if r.verdict.reason is Reason.NOT_CAPABLE_ROCM_UNUSABLE:
                self._ledger.record(w.key, slot=r.doc.name, old=r.verdict.old)
            elif r.verdict.reason is Reason.RESTORE_OWN_DEMOTION:
                self._ledger.drop(w.key)
            self._remember_written(r, facts)
            note = None if r.edit.byte_minimal else r.edit.note
            outcomes[w.at] = _outcome(
                w.key, w.path, r.doc, OutcomeStatus.RELABELED, r.verdict, note
            )
        failed = {OutcomeStatus.WRITE_FAILED}
        if any(getattr(outcomes[w.at], "status", None) in failed for w in group):
            self._remove_leftover_temps(wait=True)  # we hold the lock: none of ours in flight

    def _remember_written(self, r: _Ready, facts: HostFacts) -> None:
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
                r.edit.text, parsed, stem=path.stem, limits=self._limits
            )
            verdict = self._decide(doc, facts, demoted=demoted)
        except Exception:  # over a limit now, or anything else: read and parsed next time
            self._seen.forget(key)
            return
        self._seen.remember(  # the temp file's stat: what was written is not a settled read
            key, r.data, r.pending.stat, doc, verdict, read_at_ns=time.time_ns(), demoted=demoted
        )

    def _prepare(self, w: _Write, facts: HostFacts) -> Outcome | _Ready:
        """Under the lock: read the file again and judge it again (another writer may have
        changed it meanwhile; the same bytes as a moment ago are not parsed again), then its
        temp file (not yet synced)."""
        read = self._read_and_decide(w.path, w.key, facts, fresh=True)
        if isinstance(read, Outcome):
            return read
        doc, verdict, slot_file = read
        if verdict.action is not Action.RELABEL or verdict.new is None or slot_file is None:
            status = (
                OutcomeStatus.SKIPPED if verdict.action is Action.SKIP else OutcomeStatus.UNCHANGED
            )
            return _outcome(w.key, w.path, doc, status, verdict)
        from hal0_reconciler.slots import edit  # noqa: PLC0415 - the editor loads for a relabel

        try:
            made = w.edit
            same = w.read is not None and w.read.data == slot_file.data
            if made is None or not same or w.verdict.new != verdict.new:
                text = slot_file.data.decode("utf-8")
                made = edit.set_device(text, table=doc.table, new=verdict.new, parsed=doc.data)
            data = made.text.encode("utf-8")
            pending = store.begin_replace(w.path, data, like=slot_file.stat)
        except Exception as exc:  # refused, failed, or anything the editor raised
            return _write_failed(w.key, w.path, doc, verdict, exc)
        return _Ready(w, doc, verdict, made, pending, data)

    def _read_and_decide(
        self, path: Path, key: SlotKey, facts: HostFacts, *, fresh: bool
    ) -> tuple[document.SlotDoc, Verdict, store.SlotFile | None] | Outcome:
        """The slot's document and verdict. ``fresh``: read the bytes now (under the lock);
        else a file whose identity has not changed since a settled read is not read again
        (the SlotFile is then None)."""
        demoted = key in self._ledger

        def decide(doc: document.SlotDoc) -> Verdict:
            return self._decide(doc, facts, demoted=demoted)

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
            slot_file = store.read_slot(path, max_bytes=self._limits.max_bytes)
        except FileNotFoundError:
            self.forget(key)
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
            doc = document.parse_slot(text, stem=path.stem, limits=self._limits)
            verdict = decide(doc)
        except Exception as exc:  # not UTF-8, not TOML, over a limit, or anything else
            self._seen.forget(key)
            message = errors.describe(exc)
            return Outcome(key, path, None, None, OutcomeStatus.UNREADABLE, message=message)
        self._seen.remember(key, data, st, doc, verdict, read_at_ns=read_at, demoted=demoted)
        return doc, verdict, slot_file

    def _decide(self, doc: document.SlotDoc, facts: HostFacts, *, demoted: bool) -> Verdict:
        assert self.hal0_facts is not None  # noqa: S101 - read at the start of every pass
        return policy.decide(
            doc,
            runtime=runtime.runtime_of(doc, self._catalog),
            image=image.effective_image(doc, self.hal0_facts) if doc.vulkan_candidate else None,
            facts=facts,
            demoted_by_us=demoted,
            rule=self.hal0_facts.rule,
        )

    def _settle_ledger(self, key: SlotKey, verdict: Verdict) -> None:
        """Forget a demotion of ours once the operator moved the slot off ``cpu``."""
        if key in self._ledger and verdict.old != "cpu":
            self._ledger.drop(key)

    def _remove_leftover_temps(self, *, wait: bool) -> None:
        """Remove this package's own temp files from the slots folder (never hal0's).

        Only while holding hal0's slot lock, which every writer of ours holds for the whole
        life of its temp file: so no other instance's write in flight is ever removed. At the
        start (``wait=False``) nothing waits for the lock: when it is busy, the next write that
        fails, or the next start, removes them.
        """
        folder = self._settings.slots_dir
        if not fsio.has_own_temps(folder):
            return
        if wait:
            removed = fsio.remove_stale_temps(folder)
        else:
            try:
                with store.slot_write_lock(
                    self._settings.effective_lock_file, timeout=0, group_of=folder
                ):
                    removed = fsio.remove_stale_temps(folder)
            except (LockTimeout, OSError):
                return
        if removed:
            _log.info("slot.temp_files_removed", count=len(removed), folder=str(folder))

    # -- reporting --------------------------------------------------------------------------

    def _refresh_catalog(self, *, quiet: bool) -> None:
        try:
            identity: tuple[int, int, int, int] | None = fsio.identity_of(
                self._settings.profiles_file.stat()
            )
        except OSError:
            identity = None  # absent: the built-in profiles
        if identity != self._catalog_identity:
            self._catalog_identity = identity
            self._catalog = store.read_catalog(self._settings.profiles_file)
        error = self._catalog.error
        if error is not None and error != self._catalog_reported and not quiet:
            _log.error("profiles.unreadable", path=str(self._settings.profiles_file), error=error)
        self._catalog_reported = error

    def _refresh_hal0(self, *, quiet: bool) -> None:
        """Read what the installed hal0 believes (cheap when unchanged); say what changed once,
        and each source that could not be read once."""
        read = self._hal0.read()
        old, new = self.hal0_facts, read.facts
        self.hal0_facts, self.hal0_problems = new, read.problems
        if quiet:
            return
        if old is not None and (old.default_image, old.capable, old.rule) != (
            new.default_image,
            new.capable,
            new.rule,
        ):
            _log.info(
                "hal0.facts_changed",
                version=new.version,
                old_version=old.version,
                rule=new.rule.value,
                old_rule=old.rule.value,
                rule_evidence=new.rule_evidence,
                default_image=new.default_image,
                old_default_image=old.default_image,
                vulkan_capable=sorted(new.capable),
                old_vulkan_capable=sorted(old.capable),
                effect="every slot is judged again",
            )
        fresh = set(read.problems) - self._hal0_reported
        for problem in read.problems:
            if problem in fresh:
                level = _log.error if problem.not_understood else _log.warning
                level(
                    "hal0.facts_fallback",
                    source=problem.source,
                    path=problem.path,
                    reason=problem.why,
                )
        self._hal0_reported = frozenset(read.problems)

    def _report_new(self, outcomes: list[Outcome], facts: HostFacts) -> None:
        for outcome in outcomes:
            if self._reported_outcome.get(outcome.key) is not outcome:  # said already
                self._report(outcome, facts)
                if outcome.status is not OutcomeStatus.GONE:  # nothing of it is kept
                    self._reported_outcome[outcome.key] = outcome

    def _report_unit_problem(self, o: Outcome) -> None:
        """A name or id hal0 could not run: said once per file (again when it changes)."""
        if o.unit_problem is None or o.status is OutcomeStatus.GONE:
            self._unit_reported.pop(o.key, None)
            return
        if self._unit_reported.get(o.key) == o.unit_problem:
            return
        self._unit_reported[o.key] = o.unit_problem
        _log.warning(
            "slot.name_invalid",
            slot=o.name,
            path=str(o.path),
            reason=o.unit_problem,
            effect="hal0 cannot run this slot; it is never named to systemctl or the API",
        )

    def _report(self, o: Outcome, facts: HostFacts) -> None:
        """Log one event per decision that matters; problems only when they first appear."""
        self._report_unit_problem(o)
        fields = {"slot": o.name, "path": str(o.path)}
        if o.status is OutcomeStatus.RELABELED and o.verdict is not None:
            self._reported.pop(o.key, None)
            v = o.verdict
            change = {"old": v.old, "new": v.new, "reason": v.reason.value}
            if v.reason is Reason.NOT_CAPABLE_ROCM_UNUSABLE:
                _log.warning(
                    "slot.demoted_to_cpu",
                    **fields,
                    **change,
                    behaviour_change="the slot leaves the GPU and runs on the CPU, much slower",
                    rocm_lane=facts.lane_reason,
                )
            elif v.reason is Reason.RESTORE_OWN_DEMOTION:
                _log.info("slot.restored_to_rocm", **fields, **change)
            else:
                _log.info("slot.relabeled", **fields, **change)
            if o.message is not None:
                _log.warning("slot.comments_lost", **fields, reason=o.message)
            return
        if o.status is OutcomeStatus.WRITE_FAILED:
            if self._cancelled is not None and self._cancelled():  # an orderly stop, not an error
                _log.info("slot.write_abandoned", **fields, reason="stopping", error=o.message)
            else:
                _log.error("slot.write_failed", **fields, error=o.message)
            return
        problem: tuple[object, ...] | None = None
        if o.status in (OutcomeStatus.UNREADABLE, OutcomeStatus.NOT_REGULAR):
            problem = (o.status, o.message)
        elif o.status is OutcomeStatus.SKIPPED:
            problem = (o.status, o.name)
        if problem is None:
            self._reported.pop(o.key, None)
            return
        if self._reported.get(o.key) == problem:
            return
        self._reported[o.key] = problem
        if o.status is OutcomeStatus.UNREADABLE:
            _log.error("slot.unreadable", path=str(o.path), error=o.message)
        elif o.status is OutcomeStatus.NOT_REGULAR:
            _log.warning("slot.not_regular_file", path=str(o.path), error=o.message)

        else:
            _log.warning(
                "slot.runtime_unresolved",
                **fields,
                reason="the profile's runtime family is unknown or the profile cannot be read",
            )
