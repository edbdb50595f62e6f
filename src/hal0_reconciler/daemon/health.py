"""The daemon's health, judged by the main loop: why it is not healthy (its threads, the work
queue, the file observer's deaths, what the passes found), whether the slots folder is there
(degraded, said once), and whether the sandbox's view of /etc/hal0 went stale."""

from __future__ import annotations

import os

from hal0_reconciler import _log
from hal0_reconciler.daemon import bookkeeping, passes, workqueue
from hal0_reconciler.host.hal0 import budget
from hal0_reconciler.host.restarts import units
from hal0_reconciler.settings import Settings

log = _log.get_logger("hal0_reconciler.daemon")

EXIT_FRESH_VIEW = 75  # EX_TEMPFAIL: restart me (the unit's RestartForceExitStatus=75)
_MAX_OBSERVER_DEATHS = 5  # within _DEATH_WINDOW: then report unhealthy and let systemd restart us
_DEATH_WINDOW = 600.0
_NAMED_FILES = 5  # slot files that cannot be judged, named one by one in the problems


def unjudged(passes_: passes.Passes) -> tuple[str, ...]:
    """The slot files that cannot be judged (not valid TOML, too large, a bad name, not a
    regular file), each by path and why, as degraded problems: the daemon cannot keep those
    slots' labels true. The first few by name; ``status --json``'s slots list every one."""
    with passes_.lock:
        p = passes_.progress
        if not p.metrics.unreadable_files:
            return ()
        bad = sorted(
            (str(e.get("path", key)), str(e.get("message") or e["status"]))
            for key, e in p.slots.items()
            if e["status"] in bookkeeping.UNJUDGED
        )
    lines = [f"slot file {path} cannot be judged: {why}" for path, why in bad[:_NAMED_FILES]]
    if len(bad) > _NAMED_FILES:
        lines.append(f"{len(bad) - _NAMED_FILES} more slot files cannot be judged")
    return tuple(lines)


class Health:
    """What the main loop asks before it publishes and pings: called from its thread only."""

    def __init__(
        self,
        settings: Settings,
        *,
        passes_: passes.Passes,
        queue: workqueue.WorkQueue,
        restarter: units.Restarter,
    ) -> None:
        self._settings = settings
        self._passes = passes_
        self._queue = queue
        self._restarter = restarter
        self._observer_deaths: list[float] = []
        self.slots_dir_problem: str | None = None

    def update_settings(self, settings: Settings) -> None:
        self._settings = settings

    def observer_died(self, now: float) -> None:
        """The file observer died (and was replaced): counted within the window."""
        self._observer_deaths = [t for t in self._observer_deaths if now - t < _DEATH_WINDOW]
        self._observer_deaths.append(now)

    def problems(self, worker: passes.Worker, now: float) -> list[str]:
        """Why the daemon is not healthy (empty: healthy)."""
        settings = self._settings
        problems: list[str] = []
        with self._passes.lock:
            busy_since = self._passes.progress.busy_since
        if not worker.is_alive():
            problems.append("the worker thread died")
        elif busy_since is not None and now - busy_since > settings.stuck_after:
            problems.append(f"a pass has been running for {round(now - busy_since)}s")
        elif self._queue.oldest_pending_age(now) > settings.stuck_after + settings.settle_cap:
            problems.append("the work queue is not moving")
        if not self._restarter.is_alive():
            problems.append("the restarter thread died")
        elif self._restarter.busy_for() > budget.restart_timeout(settings) + settings.stuck_after:
            problems.append("a slot restart is stuck")  # hal0's answer may take restart_timeout
        recent = [t for t in self._observer_deaths if now - t < _DEATH_WINDOW]
        if len(recent) >= _MAX_OBSERVER_DEATHS:
            problems.append(f"the file observer died {len(recent)} times in 10 minutes")
        with self._passes.lock:  # slot writes failing, an aiter check that cannot run
            found = self._passes.progress.problems
            problems += [found[k] for k in sorted(found) if k in passes.HEALTH_PROBLEMS]
        problems += passes.failures(self._passes)  # its last batch failed
        return problems

    def check_slots_dir(self) -> bool:
        """A missing slots folder is said once, at warning; the daemon is degraded (not dead:
        the watches bring the folder in at once when it appears) until it is there."""
        folder = self._settings.slots_dir
        problem = None
        if not folder.is_dir():
            what = "does not exist" if not folder.exists() else "is not a directory"
            problem = f"slots directory {folder} {what}"
        if problem == self.slots_dir_problem:
            return False
        if problem is not None:
            log.warning(
                "daemon.slots_dir_missing",
                path=str(folder),
                problem=problem,
                action="watching for it to appear; degraded until then",
            )
        else:
            log.info("daemon.slots_dir_found", path=str(folder))
        self.slots_dir_problem = problem
        return True

    def stale_view(self) -> bool:
        """Under systemd (``INVOCATION_ID``), slot writes failing with EROFS mean the sandbox's
        view of a re-created /etc/hal0 (``ProtectSystem=strict`` binds only the folder that
        existed at start writable), and likewise a metrics folder made after the start: exit 75
        and let systemd restart with a fresh view, said as such, not as a watchdog abort.
        Elsewhere a read-only folder only makes it unhealthy."""
        if not os.environ.get("INVOCATION_ID"):
            return False
        restart_for = self._passes.metrics_file.restart_for  # a metrics folder made later
        if restart_for is not None:
            log.error("daemon.restart_requested", message=restart_for, exit_status=EXIT_FRESH_VIEW)
            return True
        with self._passes.lock:
            problem = self._passes.progress.problems.get("writes-read-only")
        if problem is None:
            return False
        log.error(
            "daemon.restart_requested",
            message=f"{self._settings.slots_dir.parent} was re-created; restarting to see it",
            problem=problem,
            exit_status=EXIT_FRESH_VIEW,
        )
        return True
