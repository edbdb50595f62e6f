"""The daemon: watches, resync timer, one worker, restarts, signals and systemd notifications.

Threads: the *main loop* (this module's ``Runner.serve``) owns signals, timers, the watcher's
repairs, status and every sd_notify message; the *worker* takes settled batches from the work
queue and reconciles them; the *restarter* applies changed slots; watchdog's observer only
enqueues. ``WATCHDOG=1`` is sent by the main loop, and only while it finds everything healthy.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import structlog

from hal0_reconciler import __version__, fsio, reconcile
from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import metrics, notify, status
from hal0_reconciler.daemon.fights import FightDetector, LaneTracker
from hal0_reconciler.daemon.watch import ObserverFactory, Trigger, Watcher
from hal0_reconciler.daemon.workqueue import (
    Batch,
    Clock,
    Closed,
    Special,
    SystemClock,
    WorkQueue,
)
from hal0_reconciler.errors import ReconcilerError
from hal0_reconciler.host import facts as host_facts
from hal0_reconciler.host import units
from hal0_reconciler.model import HostFacts, LaneState, SlotKey
from hal0_reconciler.settings import Settings
from hal0_reconciler.state import DemotionLedger

log = structlog.get_logger("hal0_reconciler.daemon")

Gather = Callable[[Settings], HostFacts]
"""Looks at the host now (``host.facts.gather``; tests inject fakes)."""
ReconcilerFactory = Callable[[Settings], reconcile.Reconciler]
"""Builds the engine for a settings snapshot (with the demotion ledger in the state dir)."""

EXIT_OK = 0
EXIT_FAILURE = 1
_MAX_OBSERVER_DEATHS = 5  # within _DEATH_WINDOW: then report unhealthy and let systemd restart us
_DEATH_WINDOW = 600.0
_LOOP_TICK = 1.0


def default_reconciler(settings: Settings) -> reconcile.Reconciler:
    return reconcile.Reconciler(settings, ledger=DemotionLedger.in_state_dir(settings.state_dir))


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class _Waker:
    """A self-pipe: signal handlers (``set_wakeup_fd``) and threads wake the main loop."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.write_fd, b"!")

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(InterruptedError):
            select.select([self.read_fd], [], [], max(0.0, timeout))
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.read_fd, 4096):
                pass

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class _Progress:
    """What the worker tells the main loop (under ``Runner._lock``)."""

    passes: int = 0
    full_passes: int = 0
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


@dataclass(frozen=True)
class Stats:
    """Counters since start (for tests and the bench)."""

    passes: int
    full_passes: int
    relabels: int
    lane: LaneState | None


class _Worker:
    """The one thread that reconciles. A context manager: closes the queue and joins."""

    def __init__(self, queue: WorkQueue, process: Callable[[Batch], None]) -> None:
        self._queue = queue
        self._process = process
        self._thread = threading.Thread(target=self._run, name="hal0-worker", daemon=True)

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is Closed.TOKEN:
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

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._queue.close()
        self._thread.join(timeout=4.0)


class Runner:
    """One daemon instance. ``serve()`` runs the main loop in the calling thread until stopped."""

    def __init__(
        self,
        settings: Settings,
        *,
        config_path: Path | None = None,
        overrides: dict[str, Any] | None = None,
        notifier: notify.Notifier | None = None,
        clock: Clock | None = None,
        gather: Gather = host_facts.gather,
        reconciler_factory: ReconcilerFactory = default_reconciler,
        observer_factory: ObserverFactory | None = None,
    ) -> None:
        self._settings = settings
        self._config_path = config_path
        self._overrides = dict(overrides or {})
        self._notifier = notifier if notifier is not None else notify.from_environment()
        self._clock = clock if clock is not None else SystemClock()
        self._gather = gather
        self._reconciler_factory = reconciler_factory
        self._observer_factory = observer_factory
        self._lock = threading.RLock()
        self._waker = _Waker()
        self._stop_requested = False
        self._reload_requested = False
        self._queue = WorkQueue(
            settle=settings.settle_window, cap=settings.settle_cap, clock=self._clock
        )
        self._reconciler: reconcile.Reconciler | None = None
        self._fights = FightDetector(
            limit=settings.fight_limit, window=settings.fight_window, clock=self._clock
        )
        self._lane = LaneTracker(grace=settings.demote_grace, clock=self._clock)
        self._restarter = units.Restarter(settings)
        self._progress = _Progress()
        self._watcher: Watcher | None = None
        self._observer_deaths: list[float] = []
        self._started_at = time.time()

    # -- requests (safe from signal handlers: plain flag writes and a pipe write) ---------------
    def request_stop(self) -> None:
        self._stop_requested = True
        self._waker.wake()

    def request_reload(self) -> None:
        self._reload_requested = True
        self._waker.wake()

    @property
    def wake_fd(self) -> int:
        return self._waker.write_fd

    def stats(self) -> Stats:
        with self._lock:
            p = self._progress
            lane = p.facts.lane if p.facts is not None else None
            return Stats(p.passes, p.full_passes, p.relabels_total, lane)

    def close(self) -> None:
        """Release the wake-up pipe (after ``serve`` returned and signals are restored)."""
        self._waker.close()

    # -- the worker's side -------------------------------------------------------------------------
    def _process(self, batch: Batch) -> None:
        with self._lock:
            settings = self._settings
            reconciler = self._reconciler
            self._progress.busy_since = self._clock.monotonic()
        try:
            if reconciler is None:
                reconciler = self._reconciler_factory(settings)
                with self._lock:
                    self._reconciler = reconciler
            self._process_with(batch, settings, reconciler)
        finally:
            with self._lock:
                self._progress.busy_since = None
            self._waker.wake()

    def _process_with(
        self, batch: Batch, settings: Settings, reconciler: reconcile.Reconciler
    ) -> None:
        lane_changed = False
        facts = self._progress.facts
        if batch.host_facts or facts is None:
            raw = self._gather(settings)
            view = self._lane.observe(raw)
            facts = view.facts
            old, new = view.changed if view.changed is not None else (None, raw.lane)
            if old is not None and raw.amd:
                lane_changed = True
                level = log.warning if new is LaneState.UNUSABLE else log.info
                level(
                    "host.rocm_lane_changed",
                    old=old.value,
                    new=new.value,
                    reason=raw.lane_reason,
                    demote_grace=settings.demote_grace if new is LaneState.UNSETTLED else None,
                )
            with self._lock:
                self._progress.facts = facts
                self._progress.recheck_at = view.recheck_at
        full = batch.everything or lane_changed
        paths: list[Path] | None = None
        if not full:
            if not batch.slots:
                return  # host facts re-probed, nothing changed
            paths = [Path(k) for k in batch.slots]
        hands_off = self._hands_off()
        before = self._fingerprints(paths)
        report = reconciler.reconcile(facts, paths, hands_off=hands_off)
        self._absorb(report, settings=settings, facts=facts, full=full, before=before)

    def _hands_off(self) -> frozenset[SlotKey]:
        """The fought-over slots; one whose file changed in some other way is released."""
        for key in self._fights.hands_off:
            if not self._fights.still_fighting(key, _digest(Path(key))):
                self._fights.release(key)
                log.info("slot.fight_released", path=key, reason="the file changed otherwise")
        return self._fights.hands_off

    def _fingerprints(self, paths: list[Path] | None) -> dict[SlotKey, str | None]:
        """Content digests, before the pass, of the slots with recent relabels."""
        tracked = self._fights.tracked_keys()
        if paths is not None:
            tracked &= {reconcile.slot_key(p) for p in paths}
        return {key: _digest(Path(key)) for key in tracked}

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
                self._fights.forget(o.key)
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
        with self._lock:
            p = self._progress
            slots = {} if full else dict(p.slots)
            for o in report.outcomes:
                if o.status is statuses.GONE:
                    slots.pop(o.key, None)
            hands_off = self._fights.hands_off
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
            self._write_metrics(settings)

    def _relabeled(self, o: reconcile.Outcome, before: str | None) -> None:
        assert o.verdict is not None  # noqa: S101 - checked by the caller
        reverts = self._fights.relabeled(
            o.key, old=o.verdict.old, new=o.verdict.new, before=before, after=_digest(o.path)
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

    def _write_metrics(self, settings: Settings) -> None:
        assert settings.metrics_textfile is not None  # noqa: S101 - checked by the caller
        with self._lock:
            m = self._progress.metrics
            m.restarts = {r.value: n for r, n in self._restarter.results.items()}
            snapshot = metrics.Metrics(**vars(m))
        try:
            settings.metrics_textfile.parent.mkdir(parents=True, exist_ok=True)
            metrics.write_textfile(settings.metrics_textfile, snapshot)
        except OSError as exc:
            self._problem("metrics", f"cannot write {settings.metrics_textfile}: {exc}")
        else:
            self._clear_problem("metrics")

    def _problem(self, key: str, text: str) -> None:
        with self._lock:
            if self._progress.problems.get(key) != text:
                log.warning("daemon.problem", problem=key, detail=text)
            self._progress.problems[key] = text

    def _clear_problem(self, key: str) -> None:
        with self._lock:
            self._progress.problems.pop(key, None)

    # -- the main loop -------------------------------------------------------------------------
    def _make_watcher(self, settings: Settings) -> Watcher:
        extra: dict[str, Any] = {}
        if self._observer_factory is not None:
            extra["observer_factory"] = self._observer_factory
        return Watcher(
            slots_dir=settings.slots_dir.absolute(),
            dev_dir=settings.kfd_path.parent.absolute() if settings.watch_dev else None,
            kfd_name=settings.kfd_path.name,
            dri_dir=settings.dri_dir.absolute() if settings.watch_dev else None,
            is_slot_name=reconcile.is_slot_file_name,
            enqueue=self._queue.add_many,
            wake=self._waker.wake,
            **extra,
        )

    def serve(self) -> int:
        """Run until ``request_stop``; returns the exit code."""
        settings = self._settings
        for folder in (settings.runtime_dir, settings.state_dir):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                log.error("daemon.start_failed", path=str(folder), error=str(exc))  # noqa: TRY400 - the human line, no traceback
                return EXIT_FAILURE
            fsio.remove_stale_temps(folder)
        fsio.remove_stale_temps(settings.slots_dir)
        log.info(
            "daemon.started",
            version=__version__,
            pid=os.getpid(),
            slots_dir=str(settings.slots_dir),
            watchdog_ping=self._notifier.watchdog_interval(),
        )
        self._watcher = self._make_watcher(settings)
        try:
            with self._restarter, _Worker(self._queue, self._process) as worker:
                self._watcher.start()
                self._queue.add(Special.EVERYTHING)
                self._loop(worker)
        finally:
            if self._watcher is not None:
                self._watcher.stop()
            with contextlib.suppress(OSError):
                status.status_path(self._settings).unlink()
        log.info("daemon.stopped")
        return EXIT_OK

    def _loop(self, worker: _Worker) -> None:  # noqa: PLR0915 - the main loop reads best whole
        ready_after: int | None = 1  # READY=1 once this many full passes are done
        next_ping = self._clock.monotonic()
        next_status = 0.0
        reported_passes = -1
        reported_problems: list[str] = []
        while True:
            now = self._clock.monotonic()
            interval = self._notifier.watchdog_interval()
            with self._lock:
                recheck_at = self._progress.recheck_at
                last_full = self._progress.last_full_pass
            settings = self._settings
            resync_at = None if last_full is None else last_full + settings.resync_interval
            deadlines = [now + _LOOP_TICK, next_status]
            deadlines += [d for d in (recheck_at, resync_at) if d is not None]
            if interval is not None:
                deadlines.append(next_ping)
            self._waker.wait(min(deadlines) - now)
            if self._stop_requested:
                self._notifier.stopping()
                log.info("daemon.stopping")
                return
            now = self._clock.monotonic()
            if self._reload_requested:
                self._reload_requested = False
                if self._reload():
                    with self._lock:
                        ready_after = self._progress.full_passes + 1
                else:
                    self._notifier.ready()
            watcher = self._watcher
            assert watcher is not None  # noqa: S101 - set by serve()
            due = resync_at is not None and now >= resync_at
            triggers = watcher.check(retry_failures=due)
            if Trigger.OBSERVER_DIED in triggers:
                self._observer_deaths = [
                    t for t in self._observer_deaths if now - t < _DEATH_WINDOW
                ]
                self._observer_deaths.append(now)
            if triggers or due:
                reason = ",".join(t.value for t in triggers) or "resync-interval"
                log.info("daemon.resync_started", reason=reason)
                self._queue.add(Special.EVERYTHING)
                with self._lock:
                    self._progress.last_full_pass = now  # the next resync counts from here
            if recheck_at is not None and now >= recheck_at:
                with self._lock:
                    self._progress.recheck_at = None
                self._queue.add(Special.HOST_FACTS)
            with self._lock:
                full_passes = self._progress.full_passes
                passes = self._progress.passes
            if ready_after is not None and full_passes >= ready_after:
                ready_after = None
                self._notifier.ready()
                log.info("daemon.ready", watches=watcher.health().mode)
            problems = self._health(worker, now)
            if passes != reported_passes or now >= next_status or problems != reported_problems:
                if problems and problems != reported_problems:
                    log.error("daemon.unhealthy", problems=problems, watchdog="pings stopped")
                elif reported_problems and not problems:
                    log.info("daemon.healthy_again")
                reported_passes = passes
                reported_problems = problems
                next_status = now + status.HEARTBEAT
                self._publish(problems, ready=ready_after is None)
            if interval is not None and not problems and now >= next_ping:
                self._notifier.watchdog()
                next_ping = now + interval

    def _health(self, worker: _Worker, now: float) -> list[str]:
        """Why the daemon is not healthy (empty: healthy)."""
        settings = self._settings
        problems: list[str] = []
        with self._lock:
            busy_since = self._progress.busy_since
        if not worker.is_alive():
            problems.append("the worker thread died")
        elif busy_since is not None and now - busy_since > settings.stuck_after:
            problems.append(f"a pass has been running for {round(now - busy_since)}s")
        elif self._queue.oldest_pending_age(now) > settings.stuck_after + settings.settle_cap:
            problems.append("the work queue is not moving")
        if not self._restarter.is_alive():
            problems.append("the restarter thread died")
        elif self._restarter.busy_for() > settings.stuck_after:
            problems.append("a slot restart is stuck")
        recent = [t for t in self._observer_deaths if now - t < _DEATH_WINDOW]
        if len(recent) >= _MAX_OBSERVER_DEATHS:
            problems.append(f"the file observer died {len(recent)} times in 10 minutes")
        return problems

    def _publish(self, problems: list[str], *, ready: bool) -> None:
        """STATUS= line and status.json."""
        watcher = self._watcher
        health = watcher.health() if watcher is not None else None
        with self._lock:
            p = self._progress
            facts = p.facts
            snapshot: dict[str, Any] = {
                "schema": status.SCHEMA,
                "pid": os.getpid(),
                "pid_start": status.process_start_time(os.getpid()),
                "version": __version__,
                "started_at": self._started_at,
                "updated_at": time.time(),
                "heartbeat": status.HEARTBEAT,
                "ready": ready,
                "healthy": not problems,
                "problems": [*problems, *p.problems.values()],
                "passes": p.passes,
                "relabels_total": p.relabels_total,
                "last_pass": {
                    "at": p.last_pass_at,
                    "duration": round(p.last_duration, 6),
                    "slots": len(p.slots),
                }
                if p.passes
                else None,
                "slots": {e.get("name", k): e for k, e in p.slots.items()},
                "hands_off": sorted(
                    str(p.slots.get(k, {}).get("name", k)) for k in self._fights.hands_off
                ),
            }
            last_pass_at = p.last_pass_at
            relabels = p.relabels_total
            count = len(p.slots)
        lane_text = "unknown"
        if facts is not None:
            lane_text = "not an AMD host" if not facts.amd else f"rocm lane {facts.lane.value}"
            snapshot["lane"] = {
                "amd": facts.amd,
                "state": facts.lane.value,
                "reason": facts.lane_reason,
            }
        snapshot["pending_restarts"] = self._restarter.pending()
        if health is not None:
            snapshot["watch_mode"] = health.mode
            snapshot["watched"] = list(health.watched)
            snapshot["problems"] += [f"cannot watch {p}: {r}" for p, r in health.failures.items()]
        try:
            status.write_status(self._settings, snapshot)
        except OSError as exc:
            log.warning("daemon.status_write_failed", error=str(exc))
        ago = f"{round(time.time() - last_pass_at)}s ago" if last_pass_at else "pending"
        line = f"{count} slots, {relabels} relabelled, {lane_text}, last pass {ago}"
        if health is not None and health.mode == "polling":
            line += ", POLLING (watch failed)"
        if snapshot["hands_off"]:
            line += f", hands off: {len(snapshot['hands_off'])}"
        if problems:
            line += f", UNHEALTHY: {problems[0]}"
        self._notifier.status(line)

    def _reload(self) -> bool:
        """SIGHUP: RELOADING=1, new settings, a full pass; False when the settings are bad."""
        self._notifier.reloading()
        log.info("daemon.reload_started", config=str(self._config_path or "default"))
        try:
            new = settings_mod.load(self._config_path, self._overrides)
        except ReconcilerError as exc:
            log.error(  # noqa: TRY400 - the human line, no traceback
                "daemon.reload_failed", error=str(exc), action="keeping the old settings"
            )
            return False
        old = self._settings
        with self._lock:
            self._settings = new
            self._reconciler = None  # rebuilt by the worker with the new settings
        self._queue.tune(settle=new.settle_window, cap=new.settle_cap)
        self._fights.tune(limit=new.fight_limit, window=new.fight_window)
        self._lane.tune(grace=new.demote_grace)
        self._restarter.update_settings(new)
        watched = ("slots_dir", "kfd_path", "dri_dir", "watch_dev")
        if any(getattr(old, f) != getattr(new, f) for f in watched) and self._watcher is not None:
            self._watcher.stop()
            self._watcher = self._make_watcher(new)
            self._watcher.start()
        self._queue.add(Special.EVERYTHING)
        log.info("daemon.reloaded")
        return True


def run(settings: Settings, *, config_path: Path | None, overrides: dict[str, Any]) -> int:
    """``hal0-reconciler run``: the daemon in the main thread, with signals and faulthandler."""
    faulthandler.enable()  # a watchdog SIGABRT puts every thread's stack in the journal
    runner = Runner(settings, config_path=config_path, overrides=overrides)

    def on_stop(_signum: int, _frame: FrameType | None) -> None:
        runner.request_stop()

    def on_reload(_signum: int, _frame: FrameType | None) -> None:
        runner.request_reload()

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, on_stop),
        signal.SIGINT: signal.signal(signal.SIGINT, on_stop),
        signal.SIGHUP: signal.signal(signal.SIGHUP, on_reload),
    }
    old_wakeup = signal.set_wakeup_fd(runner.wake_fd, warn_on_full_buffer=False)
    try:
        return runner.serve()
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        runner.close()
