"""The pass: which slot files, in which order, which come from the memory of unchanged files;
the rooms next to this one read, judge, write and report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hal0_reconciler import __version__, errors
from hal0_reconciler.reconcile import catalog, hal0view, listing, look, reports, temps, vulkan
from hal0_reconciler.reconcile import writegroup as wg
from hal0_reconciler.reconcile.judge import Judge
from hal0_reconciler.reconcile.outcome import (
    FIGHT_REASON,
    SAME,
    Hold,
    Outcome,
    OutcomeStatus,
    PassReport,
)
from hal0_reconciler.slots import limits, seen
from hal0_reconciler.state import DemotionLedger

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable

    from hal0_reconciler.host.hal0 import reader as hal0
    from hal0_reconciler.model import Hal0Facts, HostFacts, SlotKey
    from hal0_reconciler.settings import Settings


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
        announce: bool = False,
    ) -> None:
        """``seen_file``: where the memory of unchanged files is kept across restarts;
        ``announce``: the first pass that may speak names hal0's release and era (the
        daemon's journal; ``once`` and ``plan`` show them in their own output)."""
        self._ledger = ledger if ledger is not None else DemotionLedger(None)
        self._cancelled = cancelled  # ends a wait for the slot lock early (the daemon stops)
        self._reports = reports.ReportMemory(stopping=cancelled)
        self._temps = temps.LeftoverTemps()
        self._seen = (
            seen.SeenSlots()
            if seen_file is None
            else seen.SeenSlots.load(seen_file, scope=_seen_scope(settings))
        )
        self._listing = listing.FolderListing()
        self._hal0 = hal0view.Hal0View(settings, announce=announce)
        self._catalog = catalog.CatalogFile(settings.profiles_file)
        self._vulkan = vulkan.VulkanOptIn()
        self.update_settings(settings)

    def update_settings(self, settings: Settings) -> None:
        """Take new settings (SIGHUP), keeping the memory of what was already reported."""
        self._settings = settings
        self._hal0.use(settings)
        self._seen.rescope(_seen_scope(settings))  # parses made under other limits: dropped
        self._catalog.use(settings.profiles_file)  # read at the next pass, not here as well
        slot_limits = limits.Limits(max_bytes=settings.slot_max_bytes)
        self._looker = look.Looker(
            seen_slots=self._seen, ledger=self._ledger, slot_limits=slot_limits, forget=self.forget
        )
        self._writer = wg.GroupWriter(
            settings,
            looker=self._looker,
            seen_slots=self._seen,
            ledger=self._ledger,
            cancelled=self._cancelled,
        )

    @property
    def hal0_facts(self) -> Hal0Facts | None:
        """hal0's facts as read for the last pass."""
        return self._hal0.facts

    @property
    def hal0_problems(self) -> tuple[hal0.FactProblem, ...]:
        """The sources of hal0's facts that fell back to known values at the last pass."""
        return self._hal0.problems

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
        doubtful: Collection[SlotKey] = frozenset(),
    ) -> PassReport:
        """Reconcile the given slot files (default: every slot). ``apply=False`` is a dry run.

        ``doubtful``: files read the instant their writer closed them; one that cannot be read
        is not reported (nor shown) but handed back in ``PassReport.held``, to be looked at
        again after a settle window (its writer may not be done)."""
        started = time.monotonic()
        judge = self._judge(facts)
        if apply:
            self._temps.remove_at_start(self._settings)
        if paths is None:
            keys, names = self._listing.slot_files(self._settings.slots_dir)
            known: list[Path] | list[str] = names
        else:
            keys, known = listing.keyed(paths)
        # an unchanged file judged in this same context (and not ours to look at again: fought
        # over, demoted by us) has its outcome from the memory, with one lstat; None: looked at
        # below. Those outcomes were reported when they were made.
        outcomes: list[Outcome | None]
        outcomes, todo = self._seen.same_outcomes(
            keys, apply=apply, skip=self._ledger.keys() | frozenset(hands_off)
        )
        made = self._look_at(todo, outcomes, keys, known, judge, hands_off=hands_off, apply=apply)
        if paths is None and not self._is_cancelled():
            self._drop_unlisted(keys)
        done = wg.sync_folders(cast("list[Outcome]", outcomes), made)  # every group written
        for at in made:
            o = done[at]
            self._seen.note_outcome(o.key, o, apply=apply, keep=o.status in SAME)
        new = [done[at] for at in made]
        held: list[Outcome] = []
        if doubtful:
            held = [o for o in new if _held(o, doubtful)]
            if held:
                new = [o for o in new if not _held(o, doubtful)]
                done = [o for o in done if not _held(o, doubtful)]
        if facts.amd and apply:
            self._reports.report_new(new, facts)
        duration = time.monotonic() - started
        return PassReport(
            tuple(done), duration, held=tuple(held), vulkan_paused=judge.vulkan_paused
        )

    def _judge(self, facts: HostFacts) -> Judge:
        """What every verdict of this pass depends on besides the file, read now: when it
        changes, every slot is judged again (from its cached parse when the file is
        unchanged)."""
        quiet = not facts.amd
        judge = Judge(
            facts,
            catalog=self._catalog.refresh(quiet=quiet),
            hal0=self._hal0.refresh(quiet=quiet),
            vulkan_paused=self._vulkan.refresh(self._settings.api_env_file),
            hands_off=self._settings.hands_off,
        )
        self._seen.judge_with(judge.memory_key())
        return judge

    def _is_cancelled(self) -> bool:
        return self._cancelled is not None and self._cancelled()

    def _look_at(
        self,
        todo: list[int],
        outcomes: list[Outcome | None],
        keys: list[SlotKey],
        known: list[Path] | list[str],
        judge: Judge,
        *,
        hands_off: Collection[SlotKey],
        apply: bool,
    ) -> list[int]:
        """Each file at a place in ``todo``, in order: its outcome in its place (a relabel's
        when its write group is written). Stopping, the outcomes end before the first file not
        looked at. Returns the places of the outcomes made here."""
        made: list[int] = []
        group: list[look.Write] = []
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
                    key,
                    path,
                    None,
                    None,
                    OutcomeStatus.HANDS_OFF,
                    message=FIGHT_REASON,
                    hold=Hold.FIGHT,
                )
                continue
            try:
                outcome = self._looker.look(path, key, judge, apply=apply)
            except Exception as exc:  # whatever one file raises, the pass goes on
                self._seen.forget(key)
                message = f"could not be processed: {errors.describe(exc)}"
                outcome = Outcome(key, path, None, None, OutcomeStatus.UNREADABLE, message=message)
            if isinstance(outcome, look.Write):  # written with its group, under hal0's lock
                outcome.at = at
                group.append(outcome)
                if len(group) >= wg.WRITE_GROUP:
                    self._writer.write(group, outcomes, judge)
                    group = []
                continue
            outcomes[at] = outcome
        if group:  # decided before a stop, if any: written now
            self._writer.write(group, outcomes, judge)
        return made

    def _drop_unlisted(self, keys: list[SlotKey]) -> None:
        """After a full listing: a slot file deleted with no pass over it is gone all the same
        (its parse, reported problems and our demotion record go, as when a pass finds it
        gone)."""
        listed = set(keys)
        self._seen.keep_only(listed)
        if self._reports.keys() <= listed and self._ledger.keys() <= listed:
            return  # nothing reported of a file that is not there
        folder = self._settings.slots_dir.absolute()
        for key in {*self._reports.keys(), *self._ledger.keys()} - listed:
            if Path(key).parent == folder:
                self.forget(key)
                self._ledger.drop(key)

    def forget(self, key: SlotKey) -> None:
        """A slot file went away: forget what was reported about it."""
        self._reports.forget(key)
        self._seen.forget(key)


def _held(o: Outcome, doubtful: Collection[SlotKey]) -> bool:
    return o.status is OutcomeStatus.UNREADABLE and o.key in doubtful
