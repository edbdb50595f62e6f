"""The worker's side of the daemon: one settled batch → host facts, a pass, the bookkeeping.

:class:`Worker` is the one thread that takes batches from the work queue; :class:`Passes` is what
it runs for each: re-probe the host when asked (the lane tracker holds back a demotion for the
grace), reconcile the slots of the batch (or all of them), keep the fight detector's memory, hand
relabelled slots to the restarter, note the outcome for status and metrics, and run the aiter
check for the ``<aiter>`` key and every full pass (after the slots, so it never holds them up).
The main loop reads :attr:`Passes.progress` under :attr:`Passes.lock`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from hal0_reconciler import lifecycle, reconcile
from hal0_reconciler.daemon import fights, metrics, selfheal, workqueue
from hal0_reconciler.host import hal0, units
from hal0_reconciler.model import HostFacts, LaneState, SlotKey
from hal0_reconciler.settings import Settings

log = structlog.get_logger("hal0_reconciler.daemon")

Gather = Callable[[Settings], HostFacts]
"""Looks at the host now (``host.facts.gather``; tests inject fakes)."""
ReconcilerFactory = Callable[[Settings], reconcile.Reconciler]
"""Builds the engine for a settings snapshot (with the demotion ledger in the state dir)."""


def digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class Progress:
    """What the worker tells the main loop (under ``Passes.lock``)."""

    passes: int = 0
    full_passes: int = 0
    batches: int = 0  # finished with everything recorded (pass, aiter check, problems, metrics)
    relabels_total: int = 0
    last_pass_at: float = 0.0  # wall clock
    last_full_pass: float | None = None  # monotonic
    last_duration: float = 0.0
    busy_since: float | None = None  # monotonic, while a batch is processed
    facts: HostFacts | None = None
    recheck_at: float | None = None
    slots: dict[SlotKey, dict[str, Any]] = field(default_factory=dict)
    metrics: metrics.Metrics = field(default_factory=metrics.Metrics)
    problems: dict[str, str] = field(default_factory=dict)
    hal0: dict[str, Any] | None = None  # what the installed hal0 believes (hal0.describe)


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
        self._thread = threading.Thread(target=self._run, name="hal0-worker", daemon=True)

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
        self._thread.join(timeout=4.0)
        if self._thread.is_alive():  # say so: its file is left old (atomic writes), not torn
            log.warning("daemon.worker_abandoned", reason="a pass was still running at exit")


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
    ) -> None:
        self.lock = threading.RLock()
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
        self._aiter = selfheal_
        self._wake = wake

    def update_settings(self, settings: Settings) -> None:
        """A reload: the engine takes the new settings and keeps what it already reported
        (a new state directory means a new engine, with that directory's ledger)."""
        with self.lock:
            if self._reconciler is not None and settings.state_dir == self._settings.state_dir:
                self._reconciler.update_settings(settings)
            else:
                self._reconciler = None
            self._settings = settings
        self.fights.tune(limit=settings.fight_limit, window=settings.fight_window)
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
        try:
            try:
                if reconciler is None:
                    reconciler = self._reconciler_factory(settings)
                    with self.lock:
                        self._reconciler = reconciler
                self._process_with(batch, settings, reconciler)
            finally:
                if batch.aiter and self._aiter.enabled:
                    self._check_aiter(settings)
        finally:
            with self.lock:
                self.progress.busy_since = None
                self.progress.batches += 1  # last: the main loop republishes on seeing it
            self._wake()

    def _check_aiter(self, settings: Settings) -> None:
        self._aiter.check()
        problem = self._aiter.problem()
        if problem is None:
            self.clear_problem("aiter")
        else:
            self.problem("aiter", problem)
        if settings.metrics_textfile is not None:
            self.write_metrics(settings)

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
                worse = new in (LaneState.UNUSABLE, LaneState.UNKNOWN)
                level = log.warning if worse else log.info
                level(
                    "host.rocm_lane_changed",
                    old=old.value,
                    new=new.value,
                    reason=raw.lane_reason,
                    demote_grace=settings.demote_grace if new is LaneState.UNSETTLED else None,
                )
            with self.lock:
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
        report = reconciler.reconcile(facts, paths, hands_off=hands_off)
        self._absorb(report, settings=settings, facts=facts, full=full, before=before)
        self._note_hal0(reconciler)

    def _note_hal0(self, reconciler: reconcile.Reconciler) -> None:
        """hal0's facts for the status; a source hal0 wrote in a shape we do not understand is a
        problem (the newest known values stand in until it is fixed)."""
        if reconciler.hal0_facts is not None:
            described = hal0.describe(reconciler.hal0_facts)
            with self.lock:
                self.progress.hal0 = described
        loud = [p.line() for p in reconciler.hal0_problems if p.not_understood]
        if loud:
            self.problem("hal0", "; ".join(loud))
        else:
            self.clear_problem("hal0")

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

    def _absorb(
        self,
        report: reconcile.PassReport,
        *,
        settings: Settings,
        facts: HostFacts,
        full: bool,
        before: dict[SlotKey, str | None],
    ) -> None:
        statuses = reconcile.OutcomeStatus
        seen: dict[SlotKey, dict[str, Any]] = {}
        for o in report.outcomes:
            if o.status is statuses.GONE:
                self.fights.forget(o.key)
                continue
            entry: dict[str, Any] = {"path": str(o.path), "status": o.status.value}
            if o.name is not None:
                entry["name"] = o.name
            if o.verdict is not None:
                entry["device"] = o.verdict.new if o.verdict.changes else o.verdict.old
                entry["reason"] = o.verdict.reason.value
            if o.message:
                entry["message"] = o.message
            seen[o.key] = entry
            if o.status is statuses.RELABELED and o.verdict is not None:
                self._relabeled(o, before.get(o.key))
        now_wall = time.time()
        with self.lock:
            p = self.progress
            slots = {} if full else dict(p.slots)
            for o in report.outcomes:
                if o.status is statuses.GONE:
                    slots.pop(o.key, None)
            hands_off = self.fights.hands_off
            for key, entry in seen.items():
                kept = entry["status"] == statuses.HANDS_OFF.value and key in slots
                slots[key] = {**slots[key], "status": entry["status"]} if kept else entry
            p.slots = slots
            p.passes += 1
            p.full_passes += int(full)
            p.relabels_total += len(report.relabeled)
            p.last_pass_at = now_wall
            p.last_duration = report.duration
            if full:
                p.last_full_pass = self._clock.monotonic()
            m = p.metrics
            m.passes = p.passes
            for o in report.relabeled:
                target = o.verdict.new if o.verdict is not None and o.verdict.new else "?"
                m.relabels[target] = m.relabels.get(target, 0) + 1
            m.unreadable_files = sum(
                1 for e in slots.values() if e["status"] == statuses.UNREADABLE.value
            )
            m.slots = len(slots)
            m.hands_off = len(hands_off)
            m.pass_duration = report.duration
            m.last_pass_timestamp = now_wall
            m.rocm_lane_usable = facts.amd and facts.lane is LaneState.USABLE
        if settings.metrics_textfile is not None:
            self.write_metrics(settings)

    def _relabeled(self, o: reconcile.Outcome, before: str | None) -> None:
        assert o.verdict is not None  # noqa: S101 - checked by the caller
        reverts = self.fights.relabeled(
            o.key, old=o.verdict.old, new=o.verdict.new, before=before, after=digest(o.path)
        )
        if reverts is not None:
            log.error(
                "slot.fight_detected",
                slot=o.name,
                path=str(o.path),
                reverts=reverts,
                value=o.verdict.new,
                action="another writer keeps reverting this slot: left alone until its file "
                "changes otherwise or the daemon restarts",
            )
        if o.name is not None and o.token is not None:
            self._restarter.submit(units.RestartRequest(name=o.name, token=o.token))

    # -- reporting --------------------------------------------------------------------------------
    def write_metrics(self, settings: Settings) -> None:
        assert settings.metrics_textfile is not None  # noqa: S101 - checked by the caller
        uncovered, heals, failures = self._aiter.counters()
        with self.lock:
            m = self.progress.metrics
            m.restarts = {r.value: n for r, n in self._restarter.results.items()}
            m.aiter_enabled = self._aiter.enabled
            m.aiter_modules_uncovered = uncovered
            m.aiter_heals = heals
            m.aiter_check_failures = failures
            snapshot = metrics.Metrics(**vars(m))
        folder = settings.metrics_textfile.parent
        try:
            if not folder.is_dir():
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o755)  # node_exporter reads it; the unit's UMask=0077 gives 0700
            metrics.write_textfile(settings.metrics_textfile, snapshot)
        except OSError as exc:
            self.problem("metrics", f"cannot write {settings.metrics_textfile}: {exc}")
        else:
            self.clear_problem("metrics")

    def problem(self, key: str, text: str) -> None:
        with self.lock:
            if self.progress.problems.get(key) != text:
                log.warning("daemon.problem", problem=key, detail=text)
            self.progress.problems[key] = text

    def clear_problem(self, key: str) -> None:
        with self.lock:
            self.progress.problems.pop(key, None)
