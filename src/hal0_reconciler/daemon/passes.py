"""The worker's side of the daemon: one settled batch → host facts, a pass, the bookkeeping.

:class:`Worker` is the one thread that takes batches from the work queue; :class:`Passes` is what
it runs for each: re-probe the host when asked (the lane tracker holds back a demotion for the
grace), reconcile the slots of the batch (or all of them), keep the fight detector's memory, hand
relabelled slots to the restarter, note the outcome for status and metrics, and ask for an aiter
check for the ``<aiter>`` key and every full pass (run on its own thread, ``aiterworker``: the
slot passes never wait for it).
The main loop reads :attr:`Passes.progress` under :attr:`Passes.lock`.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import _log, errors, fsio, lifecycle, reconcile, threadname
from hal0_reconciler.daemon import (
    aiterworker,
    bookkeeping,
    fights,
    labels,
    lanelog,
    memory,
    metrics,
    metricsfile,
    selfheal,
    workqueue,
)
from hal0_reconciler.daemon.progress import Progress, digest
from hal0_reconciler.host.hal0 import reader as hal0
from hal0_reconciler.host.restarts import units
from hal0_reconciler.model import HostFacts, LaneState, SlotKey
from hal0_reconciler.settings import Settings

log = _log.get_logger("hal0_reconciler.daemon")

Gather = Callable[[Settings], HostFacts]
"""Looks at the host now (``host.facts.gather``; tests inject fakes)."""
ReconcilerFactory = Callable[[Settings], reconcile.Reconciler]
"""Builds the engine for a settings snapshot (with the demotion ledger in the state dir)."""

# Slot writes failing for these reasons will not get better by waiting (a read-only view of the
# folder, a missing or forbidden path, a full disk): the daemon cannot do its job, so it says so
# (status, STATUS=, a warning) until a pass writes them.
LASTING_WRITE_ERRORS = frozenset(
    {
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.ENOSPC,
        errno.EDQUOT,
    }
)
# Problems (keys of Progress.problems) that make the daemon unhealthy, not only degraded: a
# read-only slot folder is, under the unit, a stale sandbox view (/etc/hal0 deleted and re-created
# while running) that only a restart fixes, so WATCHDOG=1 stops and systemd restarts it.
HEALTH_PROBLEMS = frozenset({"writes-read-only"})


def failures(owner: Passes) -> list[str]:
    """Why the worker's side is broken: its last batch failed (for the main loop's health)."""
    with owner.lock:
        failure = owner.progress.failure
    return [f"the last pass failed: {failure}"] if failure is not None else []


@dataclass(frozen=True)
class Stats:
    """Counters since start (for tests and the bench)."""

    passes: int
    full_passes: int
    relabels: int
    lane: LaneState | None


class Worker(lifecycle.StartStop):
    """The one thread that reconciles. A context manager: closes the queue and joins."""

    def __init__(
        self, queue: workqueue.WorkQueue, process: Callable[[workqueue.Batch], None]
    ) -> None:
        self._queue = queue
        self._process = process
        self._thread = threadname.NamedThread(target=self._run, name="hal0-worker", daemon=True)

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is workqueue.Closed.TOKEN:
                return
            if batch is None:
                continue
            try:
                self._process(batch)
            except Exception:
                log.exception("daemon.pass_failed", keys=len(batch.keys))
            finally:
                self._queue.done(batch)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.close()
        self._thread.join(timeout=WORKER_STOP_WAIT)
        if self._thread.is_alive():  # say so: its file is left old (atomic writes), not torn
            log.warning("daemon.worker_abandoned", reason="a pass was still running at exit")
        fsio.stop_fsync_helpers()  # the pass's fsync helpers (idle now, unless abandoned)


WORKER_STOP_WAIT = 4.0
"""Seconds a stop waits for a running pass. With the restarter's and the observer's waits it
stays within the unit's TimeoutStopSec, so systemd never has to kill an orderly stop."""


class Passes:
    """Processes batches on the worker thread; wakes the main loop after each."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: workqueue.Clock,
        gather: Gather,
        reconciler_factory: ReconcilerFactory,
        restarter: units.Restarter,
        selfheal_: selfheal.SelfHeal,
        wake: Callable[[], None],
        give_back: Callable[[Iterable[workqueue.WorkKey]], None] | None = None,
    ) -> None:
        """``give_back``: where a slot read the instant its writer closed it, and found
        unreadable, goes to wait a settle window (``WorkQueue.add_doubtful``); None: such a
        file is reported at once."""
        self.lock = threading.RLock()
        self._give_back = give_back
        self.on_busy: Callable[[], None] | None = None  # told as each batch starts
        self.metrics_file = metricsfile.MetricsFile(settings.state_dir)
        self.progress = Progress()
        self.fights = fights.FightDetector(
            limit=settings.fight_limit, window=settings.fight_window, clock=clock
        )
        self._lane = fights.LaneTracker(grace=settings.demote_grace, clock=clock)
        self._settings = settings
        self._clock = clock
        self._gather = gather
        self._reconciler_factory = reconciler_factory
        self._reconciler: reconcile.Reconciler | None = None
        self._restarter = restarter
        self.labels = labels.LabelWatch(settings, restarter.submit)  # "label not applied"
        self._aiter = selfheal_
        self.aiter_worker = aiterworker.AiterWorker(self._run_aiter_check)  # its own thread
        self._wake = wake
        self._book = bookkeeping.Bookkeeping(
            lock=self.lock,
            progress=self.progress,
            fights_=self.fights,
            restarter=restarter,
            labels_=self.labels,
            clock=clock,
            write_failures=self._note_write_failures,
        )
        self._failing_writes: dict[SlotKey, tuple[str, int | None]] = {}  # worker only
        self._garbage = False  # a big batch's memory is to be given back (worker only)

    def update_settings(self, settings: Settings) -> None:
        """A reload: the engine takes the new settings and keeps what it already reported
        (a new state directory means a new engine, with that directory's ledger)."""
        with self.lock:
            if self._reconciler is not None and settings.state_dir == self._settings.state_dir:
                self._reconciler.update_settings(settings)
            else:
                self._reconciler = None
            old_textfile = self._settings.metrics_textfile
            self._settings = settings
        if old_textfile != settings.metrics_textfile:  # off, or moved: the old file goes
            self.metrics_file.settle(settings.metrics_textfile, settings.state_dir)
            self.clear_problem("metrics")  # the main loop writes the new one (metricsfile.due)
        self.fights.tune(limit=settings.fight_limit, window=settings.fight_window)
        self.labels.update_settings(settings)
        self._lane.tune(grace=settings.demote_grace)

    def stats(self) -> Stats:
        with self.lock:
            p = self.progress
            lane = p.facts.lane if p.facts is not None else None
            return Stats(p.passes, p.full_passes, p.relabels_total, lane)

    # -- one batch ------------------------------------------------------------------------------
    def process(self, batch: workqueue.Batch) -> None:
        with self.lock:
            settings = self._settings
            reconciler = self._reconciler
            self.progress.busy_since = self._clock.monotonic()
        if self.on_busy is not None:
            self.on_busy()
        with self.lock:
            revision = self.progress.revision
        restarts = sum(self._restarter.results.values())
        try:
            try:
                if reconciler is None:
                    reconciler = self._reconciler_factory(settings)
                    with self.lock:
                        self._reconciler = reconciler
                self._process_with(batch, settings, reconciler)
                # a flood's garbage goes back to the kernel, not kept for good; not while more
                # work waits (the rest of a burst is not kept waiting for a collection)
                if self._garbage and not batch.behind:
                    self._garbage = False
                    memory.release()
            finally:
                if batch.aiter and self._aiter.enabled:
                    self._check_aiter()
        except Exception as exc:
            with self.lock:
                self.progress.failure = errors.describe(exc)
            raise
        else:
            with self.lock:
                self.progress.failure = None
        finally:
            with self.lock:
                self.progress.full_attempts += int(batch.everything)
                self.progress.busy_since = None
                changed = self.progress.revision != revision
            changed = changed or sum(self._restarter.results.values()) != restarts
            # every full pass rewrites the file (its mtime is what the staleness alert reads),
            # unless the aiter thread is about to write it after its check
            changed = changed or (batch.everything and not (batch.aiter and self._aiter.enabled))
            # once per batch, and not for a batch that changed nothing (the echo of our write)
            if changed and settings.metrics_textfile is not None:
                self.write_metrics(settings)
            with self.lock:
                self.progress.batches += 1  # last: the main loop republishes on seeing it
            self._wake()

    def _check_aiter(self) -> None:
        """Ask the aiter thread for a check: the slot pass never waits for it."""
        self.aiter_worker.request()

    def _run_aiter_check(self) -> None:
        """One aiter check, on the aiter thread; then status and metrics as after a batch."""
        self._aiter.check()
        self._note_aiter_problem()
        with self.lock:
            settings = self._settings
        if settings.metrics_textfile is not None:
            self.write_metrics(settings)
        self._wake()

    def _note_aiter_problem(self) -> None:
        problem = self._aiter.problem()
        if problem is None:
            self.clear_problem("aiter")
        else:
            self.problem("aiter", problem)

    def _process_with(
        self, batch: workqueue.Batch, settings: Settings, reconciler: reconcile.Reconciler
    ) -> None:
        lane_changed = False
        facts = self.progress.facts
        if batch.host_facts or facts is None:
            raw = self._gather(settings)
            view = self._lane.observe(raw)
            facts = view.facts
            old, new = view.changed if view.changed is not None else (None, raw.lane)
            if old is not None and raw.amd:
                lane_changed = True
                lanelog.log_lane_change(old, new, reason=raw.lane_reason, left=view.demotion_in)
            self._note_probe(raw)
            with self.lock:
                if facts != self.progress.facts:
                    self.progress.revision += 1
                self.progress.facts = facts
                self.progress.recheck_at = view.recheck_at
        full = batch.everything or lane_changed
        paths: list[Path] | None = None
        if not full:
            if not batch.slots:
                return  # host facts re-probed (or only the aiter key), nothing changed
            paths = [Path(k) for k in batch.slots]
        hands_off = self._hands_off()
        before = self._fingerprints(paths)
        doubtful = (
            frozenset(SlotKey(k) for k in batch.prompt if not isinstance(k, workqueue.Special))
            if self._give_back is not None and not full
            else frozenset()
        )
        report = reconciler.reconcile(facts, paths, hands_off=hands_off, doubtful=doubtful)
        if report.held and self._give_back is not None:  # its writer may not be done after all
            self._give_back([o.key for o in report.held])
        with self.lock:
            demoted = reconciler.own_demotions
            if demoted != self.progress.metrics.demoted_slots:
                self.progress.revision += 1
            self.progress.metrics.demoted_slots = demoted
        fresh = self._book.absorb(report, facts=facts, full=full, before=before)
        if facts.amd and (full or report.relabeled):  # what runs vs the labels
            looked = self.labels.check(
                report,
                reconciler.hal0_facts,
                full=full,
                restarts=sum(self._restarter.results.values()),
            )
            with self.lock:
                self.progress.revision += int(looked)
        self._note_hal0(reconciler)
        if fresh >= memory.BIG_BATCH:  # not a full pass that found every file as it was
            self._garbage = True

    def _note_hal0(self, reconciler: reconcile.Reconciler) -> None:
        """hal0's facts for the status; a source hal0 wrote in a shape we do not understand is a
        problem (until it is fixed, a hal0 whose era is not placed keeps every slot)."""
        if reconciler.hal0_facts is not None:
            described = hal0.describe(reconciler.hal0_facts)
            with self.lock:
                if described != self.progress.hal0:
                    self.progress.revision += 1
                self.progress.hal0 = described
        loud = [p.line() for p in reconciler.hal0_problems if p.not_understood]
        if loud:
            self.problem("hal0", "; ".join(loud))
        else:
            self.clear_problem("hal0")

    def _note_probe(self, raw: HostFacts) -> None:
        """A probe that cannot run (no such service user...) proves nothing and demotes
        nothing, but the daemon cannot do its job: said once at warning, degraded until fixed."""
        problem = None
        if raw.amd and raw.lane is LaneState.UNKNOWN:
            problem = f"the ROCm-lane probe cannot run: {raw.lane_reason}"
        with self.lock:
            before = self.progress.problems.get("probe")
            if problem != before:
                self.progress.revision += 1
            if problem is None:
                self.progress.problems.pop("probe", None)
            else:
                self.progress.problems["probe"] = problem
        if problem is not None and problem != before:
            log.warning(
                "host.probe_failed", reason=raw.lane_reason, effect="no slot is demoted to cpu"
            )
        elif problem is None and before is not None:
            log.info("host.probe_runs_again")

    def _hands_off(self) -> frozenset[SlotKey]:
        """The fought-over slots; one whose file changed in some other way is released."""
        for key in self.fights.hands_off:
            if not self.fights.still_fighting(key, digest(Path(key))):
                self.fights.release(key)
                log.info("slot.fight_released", path=key, reason="the file changed otherwise")
        return self.fights.hands_off

    def _fingerprints(self, paths: list[Path] | None) -> dict[SlotKey, str | None]:
        """Content digests, before the pass, of the slots with recent relabels."""
        tracked = self.fights.tracked_keys()
        if paths is not None:
            tracked &= {reconcile.slot_key(p) for p in paths}
        return {key: digest(Path(key)) for key in tracked}

    def _note_write_failures(self, report: reconcile.PassReport) -> None:
        """The "writes" problem: slots whose last write failed for a lasting reason
        ("writes-read-only" when the folder is read-only: that one makes it unhealthy)."""
        # with no failing write on record only the pass's failures matter (not 10k outcomes)
        for o in report.outcomes if self._failing_writes else report.failed:
            failing = o.status is reconcile.OutcomeStatus.WRITE_FAILED
            if failing and o.errno in LASTING_WRITE_ERRORS:
                self._failing_writes[o.key] = (f"{o.path}: {o.message}", o.errno)
            else:
                self._failing_writes.pop(o.key, None)
        read_only = any(e == errno.EROFS for _, e in self._failing_writes.values())
        key, other = ("writes-read-only", "writes") if read_only else ("writes", "writes-read-only")
        self.clear_problem(other)
        if not self._failing_writes:
            self.clear_problem(key)
            return
        first = min(m for m, _ in self._failing_writes.values())
        more = len(self._failing_writes) - 1
        self.problem(key, f"slot writes fail: {first}" + (f" (+{more} more)" if more else ""))

    # -- reporting --------------------------------------------------------------------------------
    def write_metrics(self, settings: Settings, *, running: bool = True) -> None:
        """The textfile (``running``: false for the one a clean stop leaves)."""
        assert settings.metrics_textfile is not None  # noqa: S101 - checked by the caller
        uncovered, heals, failures = self._aiter.counters()
        not_converging = len((self._aiter.status() or {}).get("not_converging") or ())
        fatal_boots = len((self._aiter.status() or {}).get("fatal_boots") or ())
        results = self._restarter.results
        waits = self._restarter.report()
        with self.lock:
            m = self.progress.metrics
            m.restarts = {r.value: results.get(r, 0) for r in units.RestartResult}
            m.restarts_waiting = len(waits["waiting"])  # type: ignore[arg-type]
            m.restarts_busy_past_bound = len(waits["busy_past_bound"])  # type: ignore[arg-type]
            m.labels_not_applied = self.labels.counts()
            m.aiter_not_converging = not_converging
            m.aiter_fatal_boots = fatal_boots
            m.aiter_enabled = self._aiter.enabled
            m.aiter_modules_uncovered = uncovered
            m.aiter_heals = heals
            m.aiter_check_failures = failures
            snapshot = metrics.Metrics(**{**vars(m), "running": running})
        # the worker (after a pass) and the main loop (health, retries, the stop): one lock
        problem = self.metrics_file.write(settings.metrics_textfile, metrics.render(snapshot))
        if problem is not None:
            self.problem("metrics", problem)
        else:
            self.clear_problem("metrics")

    def note_health(self, *, healthy: bool, settings: Settings) -> None:
        """The main loop's verdict, for the ``healthy`` gauge (written when it changes)."""
        with self.lock:
            changed = self.progress.metrics.healthy != healthy
            self.progress.metrics.healthy = healthy
        if changed and settings.metrics_textfile is not None:
            self.write_metrics(settings)

    def problem(self, key: str, text: str) -> None:
        with self.lock:
            if self.progress.problems.get(key) != text:
                log.warning("daemon.problem", problem=key, detail=text)
                self.progress.revision += 1
            self.progress.problems[key] = text

    def clear_problem(self, key: str) -> None:
        with self.lock:
            if self.progress.problems.pop(key, None) is not None:
                self.progress.revision += 1
