"""What the daemon says about itself, and when: the ``STATUS=`` line and status.json, written
when something they show changed (passes done, problems, READY) or the heartbeat is due, and
the "unhealthy" / "healthy again" lines. Called from the main loop only."""

from __future__ import annotations

import time

from hal0_reconciler import _log
from hal0_reconciler.daemon import health, notify, passes, publish, selfheal, status, statusjson
from hal0_reconciler.daemon import watch as watch_mod
from hal0_reconciler.host.restarts import units
from hal0_reconciler.settings import Settings

log = _log.get_logger("hal0_reconciler.daemon")
_METRICS_RETRY = 5.0  # seconds between tries of a textfile that could not be written


class Reporter:
    """Remembers what was published last; publishes again when that changed."""

    def __init__(
        self,
        settings: Settings,
        *,
        passes_: passes.Passes,
        restarter: units.Restarter,
        selfheal_: selfheal.SelfHeal,
        health_: health.Health,
        reloads: status.ReloadState,
        notifier: notify.Notifier,
    ) -> None:
        self._settings = settings
        self._passes = passes_
        self._restarter = restarter
        self._aiter = selfheal_
        self._health = health_
        self._reloads = reloads
        self._notifier = notifier
        self._started_at = time.time()
        self._slots_json = statusjson.SlotsJson()
        self.next_status = 0.0
        self._reported_passes = -1  # passes, aiter checks and finished batches, as last published
        self._reported_problems: list[str] = []
        self._reported_ready = False
        self._metrics_at = 0.0  # the next retry of a textfile not written (monotonic)

    def update_settings(self, settings: Settings) -> None:
        self._settings = settings

    def republish(self) -> None:
        """Publish at the next report, changed or not (``reload`` is waiting for it)."""
        self._reported_passes = -1

    def report(
        self,
        worker: passes.Worker,
        watcher: watch_mod.Watcher | None,
        now: float,
        passes_done: int,
        *,
        ready: bool,
        became_ready: bool,
    ) -> list[str]:
        """Publish the status when it changed (or the heartbeat is due); the problems found."""
        retried = self._retry_metrics(now)  # first: a file written now is no problem shown now
        problems = self._health.problems(worker, now)
        changed = self._health.check_slots_dir() or became_ready or ready != self._reported_ready
        changed |= retried
        changed |= passes_done != self._reported_passes or problems != self._reported_problems
        if changed or now >= self.next_status:
            if problems and problems != self._reported_problems:
                log.error("daemon.unhealthy", problems=problems, watchdog="pings stopped")
            elif self._reported_problems and not problems:
                log.info("daemon.healthy_again")
            self._reported_passes = passes_done
            self._reported_problems = problems
            self._reported_ready = ready
            self.next_status = now + status.HEARTBEAT
            self._publish(watcher, problems, ready=ready)
        return problems

    def metrics_retry_at(self) -> float | None:
        """When the main loop must wake to write the textfile again (monotonic); None while
        the file is written where the settings say (no wake-up for it)."""
        if not self._passes.metrics_file.due(self._settings.metrics_textfile):
            return None
        return self._metrics_at

    def _retry_metrics(self, now: float) -> bool:
        """The textfile not written where the settings say (a folder missing, the start, a
        reload that moved it): tried again at most every ``_METRICS_RETRY`` seconds, so a
        folder made later is picked up without a pass having to change anything."""
        settings = self._settings
        if not self._passes.metrics_file.due(settings.metrics_textfile) or now < self._metrics_at:
            return False
        self._metrics_at = now + _METRICS_RETRY
        self._passes.write_metrics(settings)
        return True

    def _publish(
        self, watcher: watch_mod.Watcher | None, problems: list[str], *, ready: bool
    ) -> None:
        """STATUS= line and status.json."""
        sources = publish.Sources(
            passes=self._passes,
            health=watcher.health() if watcher is not None else None,
            pending_restarts=self._restarter.pending(),
            selfheal=self._aiter,
            started_at=self._started_at,
            slots_json=self._slots_json,
        )
        degraded: tuple[str, ...] = ()
        if self._health.slots_dir_problem is not None:
            degraded = (self._health.slots_dir_problem,)
        degraded += tuple(self._restarter.problems().values())  # failed, busy past bound, API
        degraded += health.unjudged(self._passes)  # slot files that cannot be judged
        snapshot, line = publish.compose(sources, problems, ready=ready, degraded=degraded)
        snapshot["restarts"] = self._restarter.report()
        snapshot["labels_not_applied"] = self._passes.labels.report()
        snapshot["reload"] = self._reloads.snapshot()
        try:
            status.write_status(self._settings, snapshot)
        except OSError as exc:
            log.warning("daemon.status_write_failed", error=str(exc))
        self._passes.note_health(healthy=snapshot["healthy"], settings=self._settings)
        self._notifier.status(line)
