"""The aiter self-heal as daemon work: one monitor, its checks, their summary, the retry back-off.

The aiter thread (``aiterworker``) calls :meth:`SelfHeal.check` when the worker asks for one (the
``<aiter>`` key, every full pass). A check
never stops the slot work: an exception is one ``aiter.check_failed`` event and the daemon goes
on; after ``FAILING_AFTER`` failures in a row it is a status problem until a check succeeds. A
check that cannot run at all (a ``ReconcilerError``: the process table is hidden, the routing
data is unreadable) is a warning without a traceback and a status problem at once. A
heal refused because a build is running (``retry_soon``) asks for another check after a back-off
that doubles from ``RETRY_FIRST`` up to ``RETRY_MAX`` seconds. The main loop reads
:meth:`retry_at` and :meth:`watch_paths`; everything else is for status and metrics.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hal0_reconciler import _log
from hal0_reconciler.daemon import workqueue
from hal0_reconciler.errors import ReconcilerError
from hal0_reconciler.settings import Settings

if TYPE_CHECKING:  # the aiter engine is loaded when a tree is configured (aiter_monitor)
    from hal0_reconciler.aiter import monitor

log = _log.get_logger("hal0_reconciler.daemon.selfheal")

RETRY_FIRST = 5.0
RETRY_MAX = 60.0
_NOT_CHECKED = ("not checked: path outside configured trees", "tree refused")
FAILING_AFTER = 3  # failed checks in a row before status names it as a problem
SETTLE_CAP_FACTOR = 5  # an aiter event waits at most this many settle windows under churn


class AiterCheck(Protocol):
    """What the daemon needs from ``aiter.monitor.AiterMonitor`` (tests inject failing ones)."""

    def watch_paths(self) -> list[Path]: ...
    def check(self, *, heal: bool) -> monitor.MonitorReport: ...


AiterFactory = Callable[[Settings], AiterCheck]
"""Builds the monitor for a settings snapshot (the real one is ``aiter_monitor``)."""


def aiter_monitor(settings: Settings) -> AiterCheck:
    """The real monitor (``AiterMonitor``); its engine is imported here, so a daemon with no
    aiter tree never loads it."""
    from hal0_reconciler.aiter import monitor  # noqa: PLC0415 - see above

    return monitor.AiterMonitor(settings, budget=settings.aiter.check_budget)


def window(settings: Settings) -> workqueue.Window:
    """The ``<aiter>`` key's own settle window (``[aiter].settle_window``, capped at 5x it)."""
    settle = settings.aiter.settle_window
    return workqueue.Window(settle=settle, cap=settle * SETTLE_CAP_FACTOR)


def static_watch_paths(settings: Settings) -> list[Path]:
    """The folders known without asking the monitor (when it cannot be built or asked)."""
    return [
        p
        for tree in settings.aiter.trees
        for p in (tree.package_dir / "configs", tree.package_dir / "configs/model_configs")
    ]


@dataclass
class _State:
    """The aiter checks so far, as status shows them."""

    checks: int = 0
    failures_in_a_row: int = 0
    failures_total: int = 0
    last_error: str | None = None
    cannot_run: str | None = None  # why the last check could not run at all
    heals: int = 0  # modules quarantined since start
    last_quarantine: str | None = None
    retry_delay: float = 0.0
    retry_at: float | None = None  # monotonic
    retry_reason: str = ""
    over_budget: bool = False  # the last check ran past its budget (said once per stretch)
    checked_at: float | None = None  # wall clock
    summary: dict[str, Any] = field(default_factory=dict)
    uncovered: int = 0


class SelfHeal:
    """Owned by the runner; ``check`` runs on the aiter thread, the rest on the main loop."""

    def __init__(
        self, settings: Settings, *, factory: AiterFactory, clock: workqueue.Clock
    ) -> None:
        self._factory = factory
        self._clock = clock
        self._lock = threading.Lock()
        self._settings = settings
        self._monitor: AiterCheck | None = None
        self._paths: tuple[Path, ...] = tuple(static_watch_paths(settings))
        self._state = _State()

    @property
    def enabled(self) -> bool:
        return bool(self._settings.aiter.trees)

    def update_settings(self, settings: Settings) -> None:
        """A reload: a new monitor when anything it reads changed (it re-logs its findings)."""
        with self._lock:
            old = self._settings
            self._settings = settings
            if (old.aiter, old.slots_dir, old.state_dir) != (
                settings.aiter,
                settings.slots_dir,
                settings.state_dir,
            ):
                self._monitor = None
                self._paths = tuple(static_watch_paths(settings))
                self._state.retry_at = None
            if not settings.aiter.trees:
                self._state = _State()

    # -- the main loop's look -------------------------------------------------------------------
    def watch_paths(self) -> tuple[Path, ...]:
        with self._lock:
            return self._paths if self.enabled else ()

    def retry_at(self) -> float | None:
        with self._lock:
            return self._state.retry_at

    def generation(self) -> int:
        """Grows with every check, failed or not (the main loop republishes status then)."""
        with self._lock:
            return self._state.checks + self._state.failures_total

    def retry_reason(self) -> str:
        with self._lock:
            return self._state.retry_reason or "a build was running"

    def retry_taken(self) -> None:
        with self._lock:
            self._state.retry_at = None

    def refresh_watch_paths(self) -> None:
        """Ask the monitor which folders to watch (builds it; called before the first watch)."""
        with self._lock:
            settings = self._settings
        if not settings.aiter.trees:
            return
        try:
            mon = self._get_monitor(settings)
        except Exception as exc:
            log.warning("aiter.watch_paths_failed", error=f"{type(exc).__name__}: {exc}")
            return
        self._watch_paths_of(mon, settings)

    # -- the worker's side ------------------------------------------------------------------------
    def check(self) -> bool:
        """One check, healing per settings. False when it failed (already logged)."""
        with self._lock:
            settings = self._settings
        if not settings.aiter.trees:
            return True
        try:
            mon = self._get_monitor(settings)
            report = mon.check(heal=settings.aiter.heal)
        except ReconcilerError as exc:
            log.warning("aiter.check_cannot_run", error=str(exc), effect="nothing is healed")
            self._failed(str(exc), cannot_run=True)
            return False
        except Exception as exc:
            log.exception("aiter.check_failed", error=f"{type(exc).__name__}: {exc}")
            self._failed(f"{type(exc).__name__}: {exc}", cannot_run=False)
            return False
        self._watch_paths_of(mon, settings)
        self._record(report)
        return True

    def _failed(self, error: str, *, cannot_run: bool) -> None:
        with self._lock:
            s = self._state
            s.failures_in_a_row += 1
            s.failures_total += 1
            s.last_error = error
            s.cannot_run = error if cannot_run else None

    def _get_monitor(self, settings: Settings) -> AiterCheck:
        with self._lock:
            if self._monitor is None:
                self._monitor = self._factory(settings)
            return self._monitor

    def _watch_paths_of(self, mon: AiterCheck, settings: Settings) -> None:
        try:
            paths = tuple(mon.watch_paths())
        except Exception as exc:
            log.warning("aiter.watch_paths_failed", error=f"{type(exc).__name__}: {exc}")
            paths = tuple(static_watch_paths(settings))
        with self._lock:
            self._paths = paths

    def _record(self, report: monitor.MonitorReport) -> None:
        from hal0_reconciler.aiter.decision import plan  # noqa: PLC0415 - loaded by the check already

        modules = [(p, m) for p in report.plans for m in p.modules]
        healed = [h for h in report.heals if h.quarantine is not None]
        with self._lock:
            s = self._state
            s.checks += 1
            s.failures_in_a_row = 0
            s.last_error = None
            s.cannot_run = None
            s.checked_at = time.time()
            s.heals += sum(len(h.modules) for h in healed)
            if healed:
                s.last_quarantine = healed[-1].quarantine
            over_budget = report.over_budget
            if over_budget and not s.over_budget:  # said once; degraded while it lasts
                log.warning(
                    "aiter.check_over_budget",
                    budget=self._settings.aiter.check_budget,
                    effect="the modules not read yet are read at the next check; degraded",
                )
            elif s.over_budget and not over_budget:
                log.info("aiter.check_within_budget")
            s.over_budget = over_budget
            if report.retry_soon or over_budget:
                s.retry_delay = min(RETRY_MAX, s.retry_delay * 2 if s.retry_delay else RETRY_FIRST)
                s.retry_at = self._clock.monotonic() + s.retry_delay
                s.retry_reason = (
                    "a build was running"
                    if report.retry_soon
                    else "the last check ran past its time budget"
                )
            else:
                s.retry_delay = 0.0
                s.retry_at = None
            s.uncovered = sum(1 for _, m in modules if m.status is plan.Status.UNCOVERED)
            s.summary = {
                "verdicts": dict(sorted(Counter(str(m.status) for _, m in modules).items())),
                "uncovered": sorted(
                    f"{p.environment}:{m.module}"
                    for p, m in modules
                    if m.status is plan.Status.UNCOVERED
                ),
                "heal_pending": report.heal_pending,
                "not_converging": sorted(
                    f"{p.environment}:{m.module}"
                    for p, m in modules
                    if m.action is plan.Action.STUCK
                ),
                "fix_tables": sorted(  # rows no rebuild fixes: for a person, never healed
                    f"{p.environment}:{m.module}"
                    for p, m in modules
                    if m.action is plan.Action.OPERATOR
                ),
                "fatal_boots": list(report.fatal_boots),  # the environment and the reason
                "refused": sorted({b for h in report.heals for b in h.refused}),
                "errors": list(report.errors),
                "not_checked": [  # refused trees, slot paths outside the trees: degraded
                    *(
                        f"{p.tree} [{p.environment}]: {why}"
                        for p in report.plans
                        for why in p.problems[:1]
                        if not p.checked and why.startswith(_NOT_CHECKED)
                    ),
                    *report.modules_not_checked,  # too large, sparse, keeps changing, budget
                ],
            }

    # -- status and metrics ---------------------------------------------------------------------
    def problem(self) -> str | None:
        """The status problem to show, if any: a check that keeps failing, or heal errors."""
        with self._lock:
            s = self._state
            if s.cannot_run is not None:
                return f"the aiter check cannot run: {s.cannot_run}"
            if s.failures_in_a_row >= FAILING_AFTER:
                times = s.failures_in_a_row
                return f"the aiter check failed {times} times in a row: {s.last_error}"
            errors = s.summary.get("errors") or s.summary.get("not_checked") or []
            if errors:
                return f"aiter: {errors[0]}"
            fatal = s.summary.get("fatal_boots") or []
            if fatal:
                more = f" (+{len(fatal) - 1} more)" if len(fatal) > 1 else ""
                return f"aiter: a boot dies: {fatal[0]}{more}"
            return None

    def status(self) -> dict[str, Any] | None:
        """The ``aiter`` part of status.json (None when no tree is configured)."""
        if not self.enabled:
            return None
        with self._lock:
            s = self._state
            retry = None
            if s.retry_at is not None:
                retry = round(max(0.0, s.retry_at - self._clock.monotonic()), 1)
            return {
                **s.summary,
                "state": "not checked yet" if s.checks + s.failures_total == 0 else "checked",
                "checks": s.checks,
                "checked_at": s.checked_at,
                "failures_in_a_row": s.failures_in_a_row,
                "last_error": s.last_error,
                "heals": s.heals,
                "last_quarantine": s.last_quarantine,
                "retry_in": retry,
            }

    def counters(self) -> tuple[int, int, int]:
        """(modules uncovered now, modules healed since start, failed checks since start)."""
        with self._lock:
            s = self._state
            return s.uncovered, s.heals, s.failures_total
