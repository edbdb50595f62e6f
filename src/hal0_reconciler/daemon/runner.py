"""The daemon's wiring: watches, resync timer, one worker, restarts, signals and notifications.

Threads: the *main loop* (this module's ``Runner.serve``) owns signals, timers, the watcher's
repairs, status and every sd_notify message; the *worker* takes settled batches from the work
queue and runs them through ``passes.Passes`` (slots, host facts, the aiter check); the
*restarter* applies changed slots; watchdog's observer only enqueues. ``WATCHDOG=1`` is sent by
the main loop, and only while it finds everything healthy.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from hal0_reconciler import __version__, _log, fsio, held_signals, reconcile
from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import (
    health,
    memory,
    notify,
    passes,
    reporter,
    selfheal,
    status,
    waker,
    watch,
    workqueue,
)
from hal0_reconciler.errors import ReconcilerError
from hal0_reconciler.host import facts as host_facts
from hal0_reconciler.host.hal0 import reader as hal0
from hal0_reconciler.host.restarts import units
from hal0_reconciler.settings import Settings
from hal0_reconciler.slots import store
from hal0_reconciler.state import DemotionLedger

log = _log.get_logger("hal0_reconciler.daemon")

Gather = passes.Gather
ReconcilerFactory = passes.ReconcilerFactory
Stats = passes.Stats

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_FRESH_VIEW = health.EXIT_FRESH_VIEW  # EX_TEMPFAIL: restart me (RestartForceExitStatus=75)
SEEN_FILE = "seen-slots.json"  # in the state dir: unchanged slot files are not parsed at a start
_LOOP_TICK = 5.0  # seconds: health checks while work is in hand; events and signals wake it at once


def default_reconciler(
    settings: Settings, *, cancelled: Callable[[], bool] | None = None
) -> reconcile.Reconciler:
    """The engine, remembering its own demotions and the slot files it read (so a restart does
    not parse unchanged files again) in the state directory; ``cancelled`` ends a wait for
    hal0's slot lock when the daemon is stopping."""
    return reconcile.Reconciler(
        settings,
        ledger=DemotionLedger.in_state_dir(settings.state_dir),
        cancelled=cancelled,
        seen_file=settings.state_dir / SEEN_FILE,
        announce=True,
    )


def _windows(settings: Settings) -> dict[workqueue.WorkKey, workqueue.Window]:
    return {workqueue.Special.AITER: selfheal.window(settings)}


@dataclass
class _Beat:
    """What the main loop remembers from one round to the next."""

    next_ping: float
    ready_after: int | None = 1  # READY=1 once this many full passes are done


@dataclass(frozen=True)
class _Timers:
    """The loop's timers as read before it slept: what may have come due when it wakes."""

    recheck_at: float | None
    resync_at: float | None
    aiter_retry_at: float | None


class Runner:
    """One daemon instance. ``serve()`` runs the main loop in the calling thread until stopped."""

    def __init__(
        self,
        settings: Settings,
        *,
        config_path: Path | None = None,
        overrides: dict[str, Any] | None = None,
        notifier: notify.Notifier | None = None,
        clock: workqueue.Clock | None = None,
        gather: Gather = host_facts.gather,
        reconciler_factory: ReconcilerFactory | None = None,
        observer_factory: watch.ObserverFactory | None = None,
        aiter_factory: selfheal.AiterFactory = selfheal.aiter_monitor,
    ) -> None:
        self._settings = settings
        self._config_path = config_path
        self._overrides = dict(overrides or {})
        self._notifier = notifier if notifier is not None else notify.from_environment()
        self._clock = clock if clock is not None else workqueue.SystemClock()
        self._observer_factory = observer_factory
        self._waker = waker.Waker()
        self._stop_requested = False
        self._reload_requested = False
        self._queue = workqueue.WorkQueue(
            settle=settings.settle_window,
            cap=settings.settle_cap,
            clock=self._clock,
            windows=_windows(settings),
        )
        self._restarter = units.Restarter(settings)
        self._restarter.on_change = self._waker.wake  # a restart waited, ended or failed
        self._aiter = selfheal.SelfHeal(settings, factory=aiter_factory, clock=self._clock)
        self._passes = passes.Passes(
            settings,
            clock=self._clock,
            gather=gather,
            reconciler_factory=reconciler_factory
            or functools.partial(default_reconciler, cancelled=self._is_stopping),
            restarter=self._restarter,
            selfheal_=self._aiter,
            wake=self._waker.wake,
            give_back=self._queue.add_doubtful,
        )
        self._passes.on_busy = self._on_busy
        self._idle_sleep = False  # the main loop sleeps without the tick (nothing in hand)
        self._watcher: watch.Watcher | None = None
        self._health = health.Health(
            settings, passes_=self._passes, queue=self._queue, restarter=self._restarter
        )
        self._reloads = status.ReloadState()  # what `hal0-reconciler reload` waits for
        self._reporter = reporter.Reporter(
            settings,
            passes_=self._passes,
            restarter=self._restarter,
            selfheal_=self._aiter,
            health_=self._health,
            reloads=self._reloads,
            notifier=self._notifier,
        )

    def _on_busy(self) -> None:
        """A pass starts (worker thread): a main loop asleep without its tick is woken, to
        watch the pass with it (a stuck pass is noticed within ``stuck_after``)."""
        if self._idle_sleep:
            self._idle_sleep = False
            self._waker.wake()

    def _is_stopping(self) -> bool:
        return self._stop_requested

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
        return self._passes.stats()

    def close(self) -> None:
        """Release the wake-up pipe (after ``serve`` returned and signals are restored)."""
        self._waker.close()

    # -- the main loop -------------------------------------------------------------------------
    def _make_watcher(self, settings: Settings) -> watch.Watcher:
        extra: dict[str, Any] = {}
        if self._observer_factory is not None:
            extra["observer_factory"] = self._observer_factory
        watcher = watch.Watcher(
            slots_dir=settings.slots_dir.absolute(),
            dev_dir=settings.kfd_path.parent.absolute() if settings.watch_dev else None,
            kfd_name=settings.kfd_path.name,
            dri_dir=settings.dri_dir.absolute() if settings.watch_dev else None,
            is_slot_name=store.is_slot_file_name,
            enqueue=self._queue.add_many,
            enqueue_complete=self._queue.add_complete,
            wake=self._waker.wake,
            aiter_dirs=self._aiter.watch_paths(),
            **extra,
        )
        watcher.set_hal0_files(hal0.hal0_paths(settings).watched())
        return watcher

    def serve(self) -> int:
        """Run until ``request_stop``; returns the exit code."""
        memory.hold()  # until READY (the entry point held it already for `run`)
        try:
            return self._serve()
        finally:
            memory.resume()

    def _serve(self) -> int:
        settings = self._settings
        for folder in (settings.runtime_dir, settings.state_dir):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                log.error("daemon.start_failed", path=str(folder), error=str(exc))  # noqa: TRY400 - the human line, no traceback
                return EXIT_FAILURE
            fsio.remove_stale_temps(folder)
        self._passes.metrics_file.settle(settings.metrics_textfile)  # one it wrote elsewhere
        log.info(
            "daemon.started",
            version=__version__,
            pid=os.getpid(),
            slots_dir=str(settings.slots_dir),
            watchdog_ping=self._notifier.watchdog_interval(),
            aiter_trees=len(settings.aiter.trees),
        )
        self._aiter.refresh_watch_paths()
        self._watcher = self._make_watcher(settings)
        try:
            with (
                self._restarter,
                self._passes.aiter_worker,  # stopped after the worker: no request comes after
                passes.Worker(self._queue, self._passes.process) as worker,
            ):
                self._watcher.start()
                self._queue.add(workqueue.Special.EVERYTHING, settled=True)  # READY is not kept
                code = self._loop(worker)  # waiting for a settle window: nothing in flux yet
            if self._settings.metrics_textfile is not None:  # a clean stop: the file says so
                self._passes.write_metrics(self._settings, running=False)
        finally:
            if self._watcher is not None:
                self._watcher.stop()
            with contextlib.suppress(OSError):
                status.status_path(self._settings).unlink()
        log.info("daemon.stopped")
        return code

    def _loop(self, worker: passes.Worker) -> int:
        """Sleep until a timer, an event or a signal; then stop, reload, look at the watches and
        timers, publish what changed, say READY=1 once, and ping the watchdog while healthy."""
        beat = _Beat(next_ping=self._clock.monotonic())
        while True:
            now = self._clock.monotonic()
            interval = self._notifier.watchdog_interval()
            timers = self._timers()
            self._sleep(beat, timers, now, interval)
            if self._stop_requested:
                self._notifier.stopping()
                log.info("daemon.stopping")
                return EXIT_OK
            now = self._clock.monotonic()
            if self._reload_requested:
                self._take_reload(beat)
            watcher = self._watcher
            assert watcher is not None  # noqa: S101 - set by serve()
            self._look(watcher, timers, now)
            full_passes, passes_done = self._counts()
            became_ready = self._readiness(beat, full_passes)
            problems = self._reporter.report(
                worker,
                watcher,
                now,
                passes_done,
                ready=beat.ready_after is None,
                became_ready=became_ready,
            )
            if became_ready:  # after status.json says so: whoever READY=1 wakes reads "running"
                self._notifier.ready()
                log.info("daemon.ready", watches=watcher.health().mode)
                memory.resume()  # the start's garbage, collected now that READY is out
            if self._health.stale_view():
                self._notifier.stopping()
                return EXIT_FRESH_VIEW
            if interval is not None and not problems and now >= beat.next_ping:
                self._notifier.watchdog()
                beat.next_ping = now + interval

    def _timers(self) -> _Timers:
        progress = self._passes.progress
        with self._passes.lock:
            recheck_at = progress.recheck_at
            last_full = progress.last_full_pass
        aiter_retry_at = self._aiter.retry_at()
        settings = self._settings
        resync_at = None if last_full is None else last_full + settings.resync_interval
        return _Timers(recheck_at, resync_at, aiter_retry_at)

    def _sleep(self, beat: _Beat, timers: _Timers, now: float, interval: float | None) -> None:
        """Until the earliest of the status heartbeat, the timers and the ping, and the tick
        while work is in hand (a pass running, keys pending: a stuck pass is noticed; restarts
        pending: their waits are published). Idle, no tick: events that need the main loop,
        signals, a pass starting or ending and a restart's changed wait wake it at once."""
        deadlines = [self._reporter.next_status]
        self._idle_sleep = True  # first: a pass starting from here on wakes it
        with self._passes.lock:
            busy = self._passes.progress.busy_since is not None
        restarting = self._restarter.pending() or self._restarter.busy_for()
        in_hand = bool(busy or self._queue.pending() or restarting)
        if in_hand:
            deadlines.append(now + _LOOP_TICK)  # a restart waiting: status says why
            self._idle_sleep = False
        metrics_at = self._reporter.metrics_retry_at()  # a textfile not written yet
        deadlines += [
            d
            for d in (timers.recheck_at, timers.resync_at, timers.aiter_retry_at, metrics_at)
            if d is not None
        ]
        if interval is not None:
            deadlines.append(beat.next_ping)
        self._waker.wait(min(deadlines) - now)

    def _take_reload(self, beat: _Beat) -> None:
        """SIGHUP: READY=1 again after the new settings' first full pass, or at once when
        they were refused (``reload`` is waiting for the answer)."""
        self._reload_requested = False
        if self._reload():
            with self._passes.lock:
                beat.ready_after = self._passes.progress.full_attempts + 1
            self._reloads.pending = True
        else:
            self._notifier.ready()
            self._reloads.finished(ok=False)
            self._reporter.republish()  # publish now: `reload` is waiting for it

    def _look(self, watcher: watch.Watcher, timers: _Timers, now: float) -> None:
        """The watches repaired (a full pass when events may be lost), and the work of the
        timers that came due queued: the resync, the host facts' recheck, the aiter retry."""
        watcher.set_aiter_dirs(self._aiter.watch_paths())  # the worker learns new JIT folders
        watcher.set_hal0_files(hal0.hal0_paths(self._settings).watched())  # a new venv
        progress, lock = self._passes.progress, self._passes.lock
        resync_at, recheck_at = timers.resync_at, timers.recheck_at
        due = resync_at is not None and now >= resync_at
        triggers = watcher.check(retry_failures=due)
        if watch.Trigger.OBSERVER_DIED in triggers:
            self._health.observer_died(now)
        if triggers or due:
            reason = ",".join(t.value for t in triggers) or "resync-interval"
            log.info("daemon.resync_started", reason=reason)
            self._queue.add(workqueue.Special.EVERYTHING)
            with lock:
                progress.last_full_pass = now  # the next resync counts from here
        if recheck_at is not None and now >= recheck_at:
            with lock:
                progress.recheck_at = None
            self._queue.add(workqueue.Special.HOST_FACTS)
        aiter_retry_at = timers.aiter_retry_at
        if aiter_retry_at is not None and now >= aiter_retry_at:
            self._aiter.retry_taken()
            log.info("aiter.check_retried", reason=self._aiter.retry_reason())
            self._queue.add(workqueue.Special.AITER)

    def _counts(self) -> tuple[int, int]:
        """The full passes done (READY waits for them), and what was published as done."""
        with self._passes.lock:
            full_passes = self._passes.progress.full_attempts  # READY even when a file is poisoned
            # what status.json shows changed (not a batch that changed nothing, such as
            # the echo of the daemon's own write), or the aiter check ran
            passes_done = self._passes.progress.revision + self._aiter.generation()
            passes_done += self._restarter.revision  # a restart waited, ended or failed
        return full_passes, passes_done

    def _readiness(self, beat: _Beat, full_passes: int) -> bool:
        """True once, when the full passes READY=1 waits for are done (at the start, and after
        a reload: then ``reload`` is told)."""
        became_ready = beat.ready_after is not None and full_passes >= beat.ready_after
        if became_ready:
            beat.ready_after = None
            if self._reloads.pending:  # the new settings' first full pass is done
                self._reloads.finished(ok=True)  # published just below, with READY=1
        return became_ready

    def _reload(self) -> bool:
        """SIGHUP: RELOADING=1, new settings, a full pass; False when the settings are bad."""
        self._notifier.reloading()
        config = str(self._config_path or settings_mod.default_config_path())
        log.info("daemon.reload_started", config=config)
        try:
            loaded = settings_mod.read(self._config_path, self._overrides)
        except ReconcilerError as exc:
            log.error(  # noqa: TRY400 - the human line, no traceback
                "daemon.reload_failed",
                config=config,
                error=str(exc),
                action="keeping the old settings",
            )
            return False
        for line in loaded.deprecated:
            log.warning("settings.deprecated", message=line, effect="ignored")
        new = loaded.settings
        old = self._settings
        changes = settings_mod.changed(old, new)
        if (old.log_format, old.log_level) != (new.log_format, new.log_level):
            used = _log.configure(new.log_format, new.log_level)
            log.info("daemon.logging_changed", log_format=used.value, log_level=new.log_level)
        self._settings = new
        self._passes.update_settings(new)
        self._health.update_settings(new)
        self._reporter.update_settings(new)
        self._aiter.update_settings(new)
        self._queue.tune(settle=new.settle_window, cap=new.settle_cap, windows=_windows(new))
        self._restarter.update_settings(new)
        if old.restart_concurrency != new.restart_concurrency:
            log.warning(
                "daemon.restart_concurrency_kept",
                running=old.restart_concurrency,
                configured=new.restart_concurrency,
                action="systemctl restart hal0-reconciler to change it",
            )
        watched = ("slots_dir", "kfd_path", "dri_dir", "watch_dev")
        if any(getattr(old, f) != getattr(new, f) for f in watched) and self._watcher is not None:
            self._watcher.stop()
            self._watcher = self._make_watcher(new)
            self._watcher.start()
        self._queue.add(workqueue.Special.EVERYTHING)
        log.info("daemon.reloaded", config=config, changed=changes)  # text: "none"
        return True


def run(
    settings: Settings,
    *,
    config_path: Path | None,
    overrides: dict[str, Any],
    gather: Gather = host_facts.gather,
) -> int:
    """``hal0-reconciler run``: the daemon in the main thread, with signals and faulthandler
    (``gather``: the command line's ``EarlyGather``, started before this module loaded)."""
    faulthandler.enable()  # a watchdog SIGABRT puts every thread's stack in the journal
    runner = Runner(settings, config_path=config_path, overrides=overrides, gather=gather)

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
    held_signals.release()  # held since the process started: delivered to the handlers now
    try:
        return runner.serve()
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        runner.close()
