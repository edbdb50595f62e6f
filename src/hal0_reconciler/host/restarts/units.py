"""Applying a changed slot the way a careful operator would, through hal0's API.

A plain ``systemctl restart`` would re-use the devices and argv baked into the Quadlet unit, so
the way to apply a changed TOML is ``POST {api_url}/api/slots/{name}/restart`` — but only once
the slot is idle, hal0-api answers and no update runs (``restart_flow``), and the answer's
``state`` says whether it worked. The stop fallback (``systemctl stop --no-block``) is opt-in and
only for a hal0-api that is really down past ``api_wait_bound``. Never for an inactive slot; at
most once per slot per ``restart_min_interval``; one restart at a time per host unless
``restart_concurrency`` allows more (each load can evict other idle slots), and never two of one
slot at once. All of it runs on the :class:`Restarter` threads, so the main loop never waits on an
HTTP server or systemctl.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from hal0_reconciler import _log, errors, lifecycle, threadname
from hal0_reconciler.host import proc
from hal0_reconciler.host.restarts.flow import (
    ACTIVE_STATES,
    Later,
    RestartFlow,
    RestartRequest,
    RestartResult,
    unit_name,
)
from hal0_reconciler.settings import Settings

__all__ = ["Later", "RestartRequest", "RestartResult", "Restarter", "apply_change", "unit_name"]

log = _log.get_logger("hal0_reconciler.host.restarts.units")


def is_active(settings: Settings, token: str) -> bool | None:
    """``systemctl is-active`` for the slot's unit; None when systemctl cannot say."""
    return active_states(settings, [token])[token]


def active_states(settings: Settings, tokens: Iterable[str]) -> dict[str, bool | None]:
    """The state of many slots' units in ONE ``systemctl is-active u1 u2 ...`` (one line per
    unit, in order); None for every unit when systemctl cannot say."""
    wanted = list(dict.fromkeys(tokens))
    if not wanted:
        return {}
    units = [unit_name(t) for t in wanted]
    try:
        result = proc.run([settings.systemctl, "is-active", *units], timeout=settings.api_timeout)
    except errors.ProcFailed as exc:
        log.warning("unit.state_unknown", units=_shown(units), error=str(exc))
        return dict.fromkeys(wanted)
    # one line per unit, in order; a unit systemctl printed nothing for counts as not active
    # (as a single query's empty answer always did)
    lines = result.stdout.decode("utf-8", "replace").splitlines()
    lines += [""] * (len(units) - len(lines))
    return {t: line.strip() in ACTIVE_STATES for t, line in zip(wanted, lines, strict=False)}


def _shown(units: list[str], limit: int = 5) -> str:
    more = f" (+{len(units) - limit} more)" if len(units) > limit else ""
    return " ".join(units[:limit]) + more


_ASK = object()  # apply_change: the unit's state is not known yet


def apply_change(
    settings: Settings, request: RestartRequest, *, active: object = _ASK
) -> RestartResult:
    """One look at one changed slot, for the one-shot verbs: restarted when it is idle now,
    else DEFERRED (the daemon waits for it; a one-shot verb does not)."""
    if active is _ASK:
        active = is_active(settings, request.token)
    assert active is None or isinstance(active, bool)  # noqa: S101 - the caller's answer
    result = RestartFlow(settings).step(request, active=active, now=time.monotonic())
    if isinstance(result, Later):
        log.info(
            "unit.restart_not_now",
            slot=request.name,
            unit=unit_name(request.token),
            reason=result.reason,
            action="the daemon restarts it when it is idle",
        )
        return RestartResult.DEFERRED
    return result


class _Stop(enum.Enum):
    TOKEN = enum.auto()


RESTARTER_STOP_WAIT = 2.0
"""Seconds a stop waits for a restart in flight (an API call or systemctl is then abandoned:
the slot is stopped or reloaded, or not, and the next start sees its state)."""


class Restarter(lifecycle.StartStop):
    """Worker threads (``restart_concurrency``, read once: a reload does not change it) applying
    restart requests from one queue, rate-limited per slot, never two of one slot at once.

    ``submit`` never blocks. A request for a slot restarted less than ``restart_min_interval``
    ago waits until its turn; several such requests are one restart. A request the flow puts off
    (``Later``: busy, hal0-api booting, an update running) is looked at again at its due time,
    without counting as a restart. A context manager that stops and joins the thread on exit;
    a stop drops a restart in flight (it is confirmed at the next start).

    The due times are also kept in a heap of ``(due, token)``, so taking what is due and finding
    the next due time cost O(log n) per request, whatever the number pending. An entry whose
    token is no longer pending at that due time is stale and skipped; the heap is rebuilt when
    stale entries outnumber live ones. A due request for a slot whose restart is in progress
    is parked (off the heap, still pending) and put back when that restart ends.

    With one worker, everything due is taken as one batch (one systemctl call); with more, each
    worker takes one request at a time so that the others can take the next.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[float, RestartRequest]] = {}  # token -> (due, request)
        self._dues: list[tuple[float, str]] = []  # heap of (due, token), stale entries included
        self._last: dict[str, float] = {}  # token -> monotonic time of the last action
        self._pruned_at = 0.0
        self._stop: _Stop | None = None
        self._busy_since: dict[int, float] = {}  # worker -> when its restart in progress began
        self._previous: dict[str, float | None] = {}  # token -> its last action before this one
        self._running: set[str] = set()  # tokens taken by a worker and not done yet
        self._parked: set[str] = set()  # pending tokens due while running: off the heap
        self._concurrency = settings.restart_concurrency
        first = RestartFlow(settings)
        self._flows = [first] + [
            RestartFlow(settings, shares_with=first) for _ in range(self._concurrency - 1)
        ]
        self._flow = first  # the report every worker's flow shares
        self.results: Counter[RestartResult] = Counter()
        self._shown: tuple[object, ...] = ((), (), (), None)  # the report, as last counted
        self.revision = 0  # bumped when a restart waits, ends or fails (status shows it)
        self.on_change: Callable[[], None] | None = None  # told at each bump (the main loop)
        self._started = False  # start() was called
        self._spawning = False  # the workers are being started (at the first request), once
        self._spawned = False  # every worker was started: from now on each must be alive
        self._threads = [
            threadname.NamedThread(
                target=self._run,
                args=(n,),
                name="hal0-restarter" if n == 0 else f"hal0-restarter-{n + 1}",
                daemon=True,
            )
            for n in range(self._concurrency)
        ]

    def update_settings(self, settings: Settings) -> None:
        """New settings for every worker; ``restart_concurrency`` keeps its value until the
        daemon restarts (the caller says so)."""
        with self._cond:
            self._settings = settings
            for flow in self._flows:
                flow.settings = settings

    def submit(self, request: RestartRequest) -> None:
        now = time.monotonic()
        with self._cond:
            last = self._last.get(request.token)
            interval = self._settings.restart_min_interval
            due = now if last is None else max(now, last + interval)
            if due > now and request.token not in self._pending:
                log.info(
                    "unit.restart_deferred",
                    slot=request.name,
                    unit=unit_name(request.token),
                    due_in=round(due - now, 1),
                    reason="restarted less than restart_min_interval ago",
                )
            self._put(request, due)
        if self._started and not self._spawned:
            self._spawn()

    def _put(self, request: RestartRequest, due: float) -> None:
        """Pending at ``due`` (replacing an earlier request for the slot). Holds ``_cond``."""
        known = self._pending.get(request.token)
        self._pending[request.token] = (due, request)
        if known is None or known[0] != due:
            heapq.heappush(self._dues, (due, request.token))
            if len(self._dues) > 2 * len(self._pending) + 64:  # mostly stale: rebuild
                self._dues = [(d, t) for t, (d, _) in self._pending.items()]
                heapq.heapify(self._dues)
        self._cond.notify_all()

    def pending(self) -> dict[str, float]:
        """Slot name → seconds until its restart (0 when it is due or running)."""
        now = time.monotonic()
        with self._cond:
            return {r.name: max(0.0, due - now) for due, r in self._pending.values()}

    def report(self) -> dict[str, object]:
        """For status: slots waiting (and why), failed restarts (hal0's message), bounds passed."""
        with self._cond:
            r = self._flow.report
            return {
                "waiting": dict(sorted(r.waiting.items())),
                "failed": dict(sorted(r.failures.items())),
                "busy_past_bound": sorted(r.busy_past_bound),
                "api_unavailable": r.api_unavailable,
            }

    def problems(self) -> dict[str, str]:
        """Degraded, not unhealthy: a restart failed, a slot busy past its bound, hal0-api
        unavailable past its bound (keys for the daemon's problem list)."""
        with self._cond:
            r = self._flow.report
            found: dict[str, str] = {}
            if r.failures:
                name = min(r.failures)
                more = f" (+{len(r.failures) - 1} more)" if len(r.failures) > 1 else ""
                found["restart-failed"] = f"restart of slot {name} failed: {r.failures[name]}{more}"
            if r.busy_past_bound:
                names = ", ".join(sorted(r.busy_past_bound))
                found["restart-busy"] = f"busy past busy_bound, restart still waiting: {names}"
            if r.api_unavailable:
                found["hal0-api"] = f"hal0 API unavailable: {r.api_unavailable}"
            return found

    def busy_for(self) -> float:
        """Seconds the oldest restart in progress has run (0 when none runs)."""
        with self._cond:
            if not self._busy_since:
                return 0.0
            return time.monotonic() - min(self._busy_since.values())

    def is_alive(self) -> bool:
        """Started and not stopped, and every worker runs (one that died is the daemon's
        problem). The workers start with the first request: none runs while nothing did."""
        if not self._started or (self._stop is not None and not self._spawned):
            return False
        return not self._spawned or all(thread.is_alive() for thread in self._threads)

    def start(self) -> None:
        for request in self._flow.take_in_flight():
            log.info("unit.restart_to_confirm", slot=request.name, unit=unit_name(request.token))
            self.submit(request)
        self._started = True
        if self._pending:
            self._spawn()

    def _spawn(self) -> None:
        """Start the workers, once (at the first request after ``start``). Until the last has
        started, none is looked at by ``is_alive`` (one not started yet has not died); a start
        that fails leaves the rest unstarted, and so not alive."""
        with self._cond:
            if self._spawning or self._stop is not None:
                return
            self._spawning = True
        try:
            for thread in self._threads:
                thread.start()
        finally:
            self._spawned = True

    def stop(self, *, timeout: float = RESTARTER_STOP_WAIT) -> None:
        """Every worker's connection dropped (each restart in flight is written down), then
        every worker joined, all within ``timeout``."""
        with self._cond:
            self._stop = _Stop.TOKEN
            self._cond.notify_all()
        for flow in self._flows:
            flow.abort()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _next_due(self, worker: int) -> tuple[list[RestartRequest], Settings] | _Stop:
        """Every request that is due now (waiting for the first one); with more than one
        worker, one request. A slot whose restart is in progress is parked, not taken."""
        limit = None if self._concurrency == 1 else 1
        with self._cond:
            while True:
                if self._stop is not None:
                    return self._stop
                now = time.monotonic()
                if now - self._pruned_at >= 1.0:  # at most once a second: O(slots) each time
                    # a slot restarted longer ago than the rate limit needs no memory (bounded)
                    interval = self._settings.restart_min_interval
                    self._last = {t: at for t, at in self._last.items() if now - at < interval}
                    self._pruned_at = now
                requests: list[RestartRequest] = []
                while self._dues and self._dues[0][0] <= now:  # in (due, token) order
                    if limit is not None and len(requests) >= limit:
                        break
                    due, token = heapq.heappop(self._dues)
                    known = self._pending.get(token)
                    if known is None or known[0] != due:
                        continue  # stale: taken already, or due at another time
                    if token in self._running:  # its restart is in progress: after it ends
                        self._parked.add(token)
                        continue
                    del self._pending[token]
                    self._running.add(token)
                    self._previous[token] = self._last.get(token)
                    self._last[token] = now  # a request arriving meanwhile waits its turn
                    requests.append(known[1])
                if requests:
                    self._busy_since[worker] = now
                    return requests, self._settings
                soonest = self._soonest()
                self._cond.wait(None if soonest is None else max(0.01, soonest - now))

    def _soonest(self) -> float | None:
        """The next due time (stale heap entries on top are dropped). Holds ``_cond``."""
        while self._dues:
            due, token = self._dues[0]
            known = self._pending.get(token)
            if known is not None and known[0] == due:
                return due
            heapq.heappop(self._dues)
        return None

    def _run(self, worker: int) -> None:
        while True:
            item = self._next_due(worker)
            if isinstance(item, _Stop):
                return
            requests, settings = item
            try:  # one systemctl call for the whole batch
                states = active_states(settings, [r.token for r in requests])
            except Exception:
                log.exception("unit.state_query_crashed", units=len(requests))
                states = {}
            for request in requests:
                with self._cond:
                    if self._stop is not None:
                        break  # stopping: the rest is not applied (the files are written)
                    self._busy_since[worker] = time.monotonic()  # per restart, not per batch
                try:
                    result = self._flows[worker].step(
                        request, active=states.get(request.token), now=time.monotonic()
                    )
                except Exception:
                    log.exception("unit.restart_crashed", slot=request.name)
                    result = RestartResult.FAILED
                self._done(request, result)
            with self._cond:
                self._busy_since.pop(worker, None)

    def _done(self, request: RestartRequest, result: RestartResult | Later) -> None:
        with self._cond:
            self._running.discard(request.token)
            if request.token in self._parked:  # due while it ran: back on the heap
                self._parked.discard(request.token)
                known = self._pending.get(request.token)
                if known is not None:
                    heapq.heappush(self._dues, (known[0], request.token))
                    self._cond.notify_all()
            previous = self._previous.pop(request.token, None)
            nothing_done = (
                isinstance(result, Later)
                or request.recheck
                or result
                in {
                    RestartResult.INACTIVE,
                    RestartResult.UNKNOWN_STATE,
                    RestartResult.NEXT_LOAD,
                    RestartResult.ABANDONED,
                }
            )
            if nothing_done:
                # nothing was done: it does not count against the rate limit
                if previous is None:
                    self._last.pop(request.token, None)
                else:
                    self._last[request.token] = previous
            r = self._flow.report
            shown = (
                tuple(sorted(r.waiting.items())),
                tuple(sorted(r.failures.items())),
                tuple(sorted(r.busy_past_bound)),
                r.api_unavailable,
            )
            if shown != self._shown:  # what status shows of the restarts changed
                self._shown = shown
                self.revision += 1
                if self.on_change is not None:
                    self.on_change()
            if isinstance(result, Later):
                if request.token not in self._pending:  # a newer request is due sooner
                    self._put(request, time.monotonic() + result.delay)
                return
            if not request.recheck:  # a re-check is a look, not a restart
                self.results[result] += 1
            may_come_up = result is RestartResult.NO_ANSWER and not request.recheck
            if may_come_up and request.token not in self._pending:  # looked at once, later
                later = dataclasses.replace(request, recheck=True, confirm=False)
                self._put(later, time.monotonic() + self._settings.warming_recheck)
