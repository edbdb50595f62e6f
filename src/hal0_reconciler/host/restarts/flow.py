"""One careful restart of a relabelled slot, step by step.

Each ``step`` looks at the slot once and either ends (a ``RestartResult``) or asks to be looked at
again later (``Later``: hal0-api still booting, an update running, the slot busy, or idle counters
still to be confirmed). The order is hal0's own caution: the slot's unit must run; no update job
may be in progress; hal0-api must answer ``/api/health``; the slot must be idle (hal0 never
restarts a serving slot by itself); then ``POST /api/slots/{name}/restart`` with a read timeout
that fits hal0's budget, and the answer's ``state`` decides. Waiting state is kept per slot here,
so a slot that stays busy is told apart from one that just became busy.
"""

from __future__ import annotations

import enum
import urllib.parse
from dataclasses import dataclass, field

from hal0_reconciler import _log, errors
from hal0_reconciler.host import proc
from hal0_reconciler.host.hal0 import budget
from hal0_reconciler.host.restarts import api as hal0_api
from hal0_reconciler.host.restarts import rules as restart_rules
from hal0_reconciler.host.restarts import state as restart_state
from hal0_reconciler.host.restarts.rules import Load, Outcome
from hal0_reconciler.settings import RestartFallback, Settings

log = _log.get_logger("hal0_reconciler.host.restarts.units")

ACTIVE_STATES = frozenset({"active", "activating", "reloading"})  # a unit that runs or will
_MAX_BACKOFF = 30.0
_SERVER_ERROR = 500


class RestartResult(enum.StrEnum):
    """How one restart request ended (a metrics label)."""

    RESTARTED = "restarted"  # hal0 answered ready/idle
    NEXT_LOAD = "applies-at-next-load"  # offline in hal0: nothing runs the old label
    STOPPED = "stopped"  # fallback: the unit was stopped, hal0 must reload the slot
    FAILED = "failed"  # hal0 answered error, 4xx/5xx, or was unavailable past its bound
    NO_ANSWER = "no-answer"  # no answer within restart_timeout (or still warming after it)
    INACTIVE = "inactive"  # not running: nothing to apply
    UNKNOWN_STATE = "unknown-state"  # systemctl could not say: leave it alone
    ABANDONED = "abandoned"  # the daemon stopped during the restart: confirmed at next start
    DEFERRED = "deferred"  # a one-shot verb found it busy (or hal0 not ready): not restarted


@dataclass(frozen=True)
class RestartRequest:
    """A relabelled slot to restart."""

    name: str  # the slot's display name (the API's {name})
    token: str  # the unit instance: the slot's id when set, else its name
    pinned: bool = False  # the slot's `pinned = true`: restarted only when idle, like any other
    confirm: bool = False  # a restart left in flight by a stop: confirm it first
    recheck: bool = False  # a restart that ended with no answer or warming: look once, no restart


@dataclass(frozen=True)
class Later:
    """Look at the slot again in ``delay`` seconds; ``reason`` is shown in status."""

    delay: float
    reason: str


@dataclass
class _Wait:
    """What is known about one slot's wait (kept across steps)."""

    api_since: float | None = None
    api_attempts: int = 0
    busy_since: float | None = None
    busy_warned: bool = False
    quiet_at: float | None = None  # first settled read without counters
    counters_said: bool = False
    reason: str = ""


@dataclass
class FlowReport:
    """What status and metrics show of the restarts (read under the Restarter's lock)."""

    waiting: dict[str, str] = field(default_factory=dict)  # name -> why it waits
    failures: dict[str, str] = field(default_factory=dict)  # name -> hal0's message
    busy_past_bound: set[str] = field(default_factory=set)
    api_unavailable: str | None = None


def unit_name(token: str) -> str:
    """The systemd unit hal0 runs a slot in (``units`` and the daemon name it from here)."""
    return f"hal0-slot@{token}.service"


def unit_states(settings: Settings, units: list[str]) -> list[str | None]:
    """``systemctl is-active u1 u2 ...`` (one line per unit, in order); None when it cannot say."""
    if not units:
        return []
    try:
        result = proc.run([settings.systemctl, "is-active", *units], timeout=settings.api_timeout)
    except errors.ProcFailed as exc:
        log.warning("unit.state_unknown", units=" ".join(units[:5]), error=str(exc))
        return [None] * len(units)
    lines: list[str | None] = [
        line.strip() for line in result.stdout.decode("utf-8", "replace").splitlines()
    ]
    lines += [""] * (len(units) - len(lines))
    return lines[: len(units)]


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class RestartFlow:
    """The steps of every pending restart. Used from one Restarter worker thread only; the
    workers' flows share one report and one memory of each slot's wait (``shares_with``), and a
    slot is stepped by one worker at a time, so each slot's entries have one writer."""

    def __init__(self, settings: Settings, *, shares_with: RestartFlow | None = None) -> None:
        self.settings = settings
        self.report: FlowReport = FlowReport() if shares_with is None else shares_with.report
        self.waits: dict[str, _Wait] = {} if shares_with is None else shares_with.waits
        self._client: hal0_api.Hal0Client | None = None
        self._stopping = False
        self._posting: tuple[RestartRequest, str] | None = None  # the restart POST in flight

    # -- the daemon stopping --------------------------------------------------------------------
    def abort(self) -> None:
        """Drop the connection of a restart in flight (called from the stopping thread)."""
        self._stopping = True
        in_flight = self._posting
        client = self._client
        if client is not None:
            client.abort()
        if in_flight is not None:
            self._write_in_flight(*in_flight)

    def _new_client(self) -> hal0_api.Hal0Client:
        client = hal0_api.Hal0Client(self.settings)
        self._client = client
        if self._stopping:
            client.abort()
        return client

    # -- one step -------------------------------------------------------------------------------
    def step(
        self, request: RestartRequest, *, active: bool | None, now: float
    ) -> RestartResult | Later:
        wait = self.waits.setdefault(request.token, _Wait())
        try:
            result = self._step(request, wait, active=active, now=now)
        finally:
            if self._client is not None:
                self._client.close()
        if isinstance(result, Later):
            wait.reason = result.reason
            self.report.waiting[request.name] = result.reason
        else:
            self.waits.pop(request.token, None)
            self.report.waiting.pop(request.name, None)
            self.report.busy_past_bound.discard(request.name)
        return result

    def _step(
        self, request: RestartRequest, wait: _Wait, *, active: bool | None, now: float
    ) -> RestartResult | Later:
        unit = unit_name(request.token)
        if active is None:
            return RestartResult.UNKNOWN_STATE
        if not active:
            log.debug("unit.restart_skipped_inactive", slot=request.name, unit=unit)
            return RestartResult.INACTIVE
        job = restart_state.update_job(self.settings)
        if job is not None:
            return Later(self.settings.idle_recheck, f"hal0 update {job} in progress")
        try:
            client = self._new_client()
            client.get("/api/health")
        except hal0_api.ApiAborted:
            return RestartResult.ABANDONED
        except hal0_api.ApiMisconfigured as exc:
            return self._failed(request, str(exc))
        except hal0_api.ApiError as exc:
            return self._api_unavailable(request, wait, str(exc), now=now)
        if wait.api_since is not None:
            log.info("unit.api_available", slot=request.name, waited=round(now - wait.api_since))
        wait.api_since, wait.api_attempts = None, 0
        self.report.api_unavailable = None
        try:
            reading = self._load(client, request.name)
        except hal0_api.ApiAborted:
            return RestartResult.ABANDONED
        except hal0_api.ApiHttpError as exc:
            return self._failed(request, str(exc))
        except hal0_api.ApiError as exc:
            return self._api_unavailable(request, wait, str(exc), now=now)
        if request.recheck:
            return self._rechecked(request, reading.state)
        if request.confirm and reading.state in restart_rules.SETTLED:
            log.info("unit.restart_confirmed", slot=request.name, unit=unit, state=reading.state)
            return RestartResult.RESTARTED
        ready = self._ready(request, wait, reading, now=now)
        if ready is not None:
            return ready
        return self._restart(client, request)

    def _ready(
        self,
        request: RestartRequest,
        wait: _Wait,
        reading: restart_rules.LoadReading,
        *,
        now: float,
    ) -> RestartResult | Later | None:
        """None when the slot may be restarted now."""
        load = reading.load
        if load is Load.OFFLINE:
            log.info(
                "unit.restart_skipped_offline",
                slot=request.name,
                detail="offline in hal0: the new label applies at the next load",
            )
            return RestartResult.NEXT_LOAD
        if load is Load.ERROR:
            return None  # hal0's restart is how an error slot recovers; nothing is served
        if load is Load.NO_COUNTERS:
            if not wait.counters_said:
                wait.counters_said = True
                log.info(
                    "unit.counters_unavailable",
                    slot=request.name,
                    detail="hal0 has no requests_deferred for this slot (llama-server without "
                    "--metrics): idle when its state stays ready/idle in two reads "
                    f"{self.settings.idle_confirm:g}s apart",
                )
            if wait.quiet_at is None:
                wait.quiet_at = now
            if now - wait.quiet_at < self.settings.idle_confirm:
                return Later(
                    max(0.01, wait.quiet_at + self.settings.idle_confirm - now),
                    "confirming idle (counters unavailable)",
                )
            return None
        if load is Load.BUSY:
            wait.quiet_at = None
            if wait.busy_since is None:
                wait.busy_since = now
                log.info(
                    "unit.restart_waiting_busy",
                    slot=request.name,
                    pinned=request.pinned,
                    detail=reading.describe(),
                )
            busy_for = now - wait.busy_since
            if busy_for >= self.settings.busy_bound:
                if not wait.busy_warned:
                    wait.busy_warned = True
                    self.report.busy_past_bound.add(request.name)
                    log.warning(
                        "unit.restart_busy_past_bound",
                        slot=request.name,
                        busy_for=round(busy_for),
                        detail=reading.describe(),
                        action="restart the slot in hal0 when convenient"
                        if not self.settings.restart_busy
                        else "restart_busy = true: restarting it anyway",
                    )
                if self.settings.restart_busy:
                    return None
            return Later(self.settings.idle_recheck, f"busy ({reading.describe()})")
        return None

    def _restart(self, client: hal0_api.Hal0Client, request: RestartRequest) -> RestartResult:
        unit = unit_name(request.token)
        request_id = hal0_api.new_request_id()
        self._posting = (request, request_id)
        log.info(
            "unit.restart_started",
            slot=request.name,
            unit=unit,
            request_id=request_id,
            pinned=request.pinned,
            note="pinned slot, restarted while idle" if request.pinned else None,
        )
        try:
            try:
                answer = client.post(
                    f"/api/slots/{_quoted(request.name)}/restart",
                    timeout=budget.restart_timeout(self.settings),
                    request_id=request_id,
                )
            finally:
                self._posting = None
        except hal0_api.ApiAborted:
            log.warning(
                "unit.restart_abandoned",
                slot=request.name,
                unit=unit,
                detail="restart in flight, unconfirmed: confirmed at the next start",
            )
            return RestartResult.ABANDONED
        except hal0_api.ApiNoAnswer as exc:
            return self._failed(request, str(exc), result=RestartResult.NO_ANSWER)
        except hal0_api.ApiHttpError as exc:
            if exc.status < _SERVER_ERROR:
                return self._failed(request, str(exc))
            # a 5xx names the class of failure (often only "system.internal"); the slot's own
            # message says what failed
            return self._failed(request, f"{exc}; slot: {self._message(client, request.name)}")
        except hal0_api.ApiError as exc:
            return self._failed(request, str(exc))
        state = str(answer.body.get("state") or "")
        outcome = restart_rules.judge_answer(state)
        if outcome is Outcome.DONE:
            self.report.failures.pop(request.name, None)
            log.info("unit.restarted", slot=request.name, unit=unit, via="hal0-api", state=state)
            return RestartResult.RESTARTED
        if outcome is Outcome.NEXT_LOAD:
            log.info(
                "unit.restart_left_offline",
                slot=request.name,
                unit=unit,
                detail="hal0 left it offline: the new label applies at the next load",
            )
            return RestartResult.NEXT_LOAD
        if outcome is Outcome.WARMING:
            return self._failed(
                request,
                "still warming after hal0's readiness budget (it may still come up)",
                result=RestartResult.NO_ANSWER,
            )
        return self._failed(request, f"state error: {self._message(client, request.name)}")

    def _rechecked(self, request: RestartRequest, state: str) -> RestartResult:
        """The one later look at a restart that ended without the slot up: it came up, or not."""
        if restart_rules.judge_answer(state) is Outcome.DONE:
            self.report.failures.pop(request.name, None)
            log.info("unit.restart_came_up", slot=request.name, state=state)
            return RestartResult.RESTARTED
        self.report.failures[request.name] = f"did not come up: state {state} at the re-check"
        log.warning(
            "unit.restart_never_came_up",
            slot=request.name,
            unit=unit_name(request.token),
            state=state,
            action="see the slot in hal0; restart it there to apply its new device",
        )
        return RestartResult.FAILED

    def _message(self, client: hal0_api.Hal0Client, name: str) -> str:
        """hal0's ``metadata.message`` for a slot in error (``GET /api/slots/{name}``)."""
        try:
            body = client.get(f"/api/slots/{_quoted(name)}").body
        except hal0_api.ApiError as exc:
            return f"no message ({exc})"
        metadata = body.get("metadata")
        message = metadata.get("message") if isinstance(metadata, dict) else None
        return str(message)[:300] if message else "no message"

    def _failed(
        self, request: RestartRequest, message: str, *, result: RestartResult = RestartResult.FAILED
    ) -> RestartResult:
        self.report.failures[request.name] = message
        log.warning(
            "unit.restart_failed",
            slot=request.name,
            unit=unit_name(request.token),
            error=message,
            action="see the slot in hal0; restart it there to apply its new device",
        )
        return result

    def _load(self, client: hal0_api.Hal0Client, name: str) -> restart_rules.LoadReading:
        state = str(client.get(f"/api/slots/{_quoted(name)}/state").body.get("state") or "")
        metrics = client.get("/api/slots/metrics").body
        row = metrics.get(name)
        return restart_rules.judge_load(state, row if isinstance(row, dict) else None)

    # -- hal0-api not answering -----------------------------------------------------------------
    def _api_unavailable(
        self, request: RestartRequest, wait: _Wait, error: str, *, now: float
    ) -> RestartResult | Later:
        if wait.api_since is None:
            wait.api_since = now
            log.info("unit.api_waiting", slot=request.name, error=error)
        wait.api_attempts += 1
        waited = now - wait.api_since
        if waited < self.settings.api_wait_bound:
            backoff = min(_MAX_BACKOFF, self.settings.idle_recheck * 2 ** (wait.api_attempts - 1))
            return Later(
                min(backoff, self.settings.api_wait_bound - waited + 0.01),
                f"waiting for hal0-api ({error})",
            )
        self.report.api_unavailable = error
        api_state = unit_states(self.settings, [self.settings.hal0_api_unit])[0]
        down = api_state is not None and api_state not in ACTIVE_STATES
        unit = unit_name(request.token)
        if self.settings.restart_fallback is RestartFallback.STOP and down and not request.recheck:
            return self._stop(request, error, api_state or "")
        log.warning(
            "unit.restart_failed",
            slot=request.name,
            unit=unit,
            error=f"hal0 API unavailable for {round(waited)}s: {error}",
            hal0_api=api_state or "unknown",
            fallback=self.settings.restart_fallback.value,
            action="nothing was stopped; restart the slot in hal0 to apply its new device",
        )
        self.report.failures[request.name] = f"hal0 API unavailable: {error}"
        return RestartResult.FAILED

    def _stop(self, request: RestartRequest, error: str, api_state: str) -> RestartResult:
        unit = unit_name(request.token)
        result = proc.run(
            [self.settings.systemctl, "stop", "--no-block", unit], timeout=self.settings.api_timeout
        )
        if not result.ok:
            log.error(
                "unit.restart_failed",
                slot=request.name,
                unit=unit,
                error=error,
                stop_error=result.describe(),
            )
            return RestartResult.FAILED
        log.warning(
            "unit.stopped_needs_reload",
            slot=request.name,
            unit=unit,
            error=error,
            hal0_api=api_state,
            action="the slot needs a reload in hal0 (its unit was stopped)",
        )
        return RestartResult.STOPPED

    # -- a restart in flight when the daemon stops ----------------------------------------------
    def in_flight(self) -> list[RestartRequest]:
        """Restarts a stop left unconfirmed (to confirm at this start)."""
        found = restart_state.read_in_flight(restart_state.in_flight_path(self.settings))
        return [RestartRequest(name=n, token=t, confirm=True) for t, n in found.items()]

    def take_in_flight(self) -> list[RestartRequest]:
        """``in_flight()``, and the file removed (each is resubmitted; a new stop writes it
        again)."""
        found = self.in_flight()
        restart_state.remove_in_flight(restart_state.in_flight_path(self.settings))
        return found

    def _write_in_flight(self, request: RestartRequest, request_id: str) -> None:
        """Called by ``abort`` (the stopping thread): the restart dropped is confirmed later."""
        path = restart_state.in_flight_path(self.settings)
        restart_state.write_in_flight(path, request.token, request.name, request_id)
