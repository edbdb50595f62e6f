"""Applying a changed slot: ask hal0's API to restart it, else the configured fallback.

A plain ``systemctl restart`` would re-use the devices and argv baked into the Quadlet unit, so
the way to apply a changed TOML is ``POST {api_url}/api/slots/{name}/restart``. When the API
cannot be reached or refuses, the fallback is ``systemctl stop --no-block hal0-slot@<token>``
(loudly: the slot needs a reload in hal0) or nothing. Never for an inactive slot; at most once per
slot per ``restart_min_interval`` (a later request waits for its turn, coalesced). All of it runs
on the :class:`Restarter` thread, so the main loop never waits on an HTTP server or systemctl.
"""

from __future__ import annotations

import enum
import heapq
import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hal0_reconciler import _log, errors, lifecycle
from hal0_reconciler.host import proc
from hal0_reconciler.host.envfile import read_env_file
from hal0_reconciler.settings import RestartFallback, Settings

if TYPE_CHECKING:
    import urllib.error

log = _log.get_logger("hal0_reconciler.host.units")

_ACTIVE_STATES = frozenset({"active", "activating", "reloading"})
API_KEY_VARIABLE = "HAL0_ADMIN_KEY"


class RestartResult(enum.StrEnum):
    """How one restart request ended (a metrics label)."""

    RESTARTED = "restarted"  # hal0's API accepted it
    STOPPED = "stopped"  # fallback: the unit was stopped, hal0 must reload the slot
    FAILED = "failed"  # neither the API nor the fallback worked (or fallback is `none`)
    NO_ANSWER = "no-answer"  # the API took the request but did not answer in time
    INACTIVE = "inactive"  # not running: nothing to apply
    UNKNOWN_STATE = "unknown-state"  # systemctl could not say: leave it alone


@dataclass(frozen=True)
class RestartRequest:
    """A relabelled slot to restart."""

    name: str  # the slot's display name (the API's {name})
    token: str  # the unit instance: the slot's id when set, else its name


def unit_name(token: str) -> str:
    return f"hal0-slot@{token}.service"


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
    return {t: line.strip() in _ACTIVE_STATES for t, line in zip(wanted, lines, strict=False)}


def _shown(units: list[str], limit: int = 5) -> str:
    more = f" (+{len(units) - limit} more)" if len(units) > limit else ""
    return " ".join(units[:limit]) + more


class ApiNoAnswer(Exception):
    """The API took the request but did not answer within the timeout."""


def restart_via_api(settings: Settings, name: str) -> None:
    """POST the restart; raises ApiNoAnswer, or ReconcilerError with the human line."""
    import urllib.error  # noqa: PLC0415 - http, ssl, email: only when a restart is asked
    import urllib.request  # noqa: PLC0415

    url = f"{settings.api_url.rstrip('/')}/api/slots/{urllib.parse.quote(name, safe='')}/restart"
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    try:
        key = read_env_file(settings.api_env_file).get(API_KEY_VARIABLE, "")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.ReconcilerError(f"cannot read {settings.api_env_file}: {exc}") from None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        request = urllib.request.Request(url, data=b"{}", headers=headers, method="POST")  # noqa: S310 - configured http(s) URL
    except ValueError as exc:
        raise errors.ReconcilerError(f"bad api_url {settings.api_url!r}: {exc}") from None
    try:
        with urllib.request.urlopen(request, timeout=settings.api_timeout) as response:  # noqa: S310
            response.read(65536)
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc)
        raise errors.ReconcilerError(f"hal0 API answered {exc.code} for {url}{detail}") from None
    except urllib.error.URLError as exc:
        raise errors.ReconcilerError(f"hal0 API unreachable at {url}: {exc.reason}") from None
    except TimeoutError:
        raise ApiNoAnswer(f"hal0 API gave no answer within {settings.api_timeout}s") from None
    except (OSError, ValueError) as exc:
        raise errors.ReconcilerError(f"hal0 API call failed at {url}: {exc}") from None


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(2048).decode("utf-8", "replace")
        detail: object = body
        if body.startswith("{"):
            doc = json.loads(body)  # hal0: {"error": {"code": ..., "message": ...}}
            error = doc.get("error")
            if isinstance(error, dict):
                detail = f"{error.get('code', '')}: {error.get('message', '')}".strip(": ")
            else:
                detail = doc.get("detail", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return f": {str(detail).strip()[:200]}" if detail else ""


def stop_unit(settings: Settings, token: str) -> None:
    """``systemctl stop --no-block`` the slot's unit; raises ReconcilerError with the line."""
    result = proc.run(
        [settings.systemctl, "stop", "--no-block", unit_name(token)], timeout=settings.api_timeout
    )
    if not result.ok:
        raise errors.ProcFailed(result.describe())


_ASK = object()  # apply_change: the unit's state is not known yet


def apply_change(
    settings: Settings, request: RestartRequest, *, active: object = _ASK
) -> RestartResult:
    """Restart one changed slot the hal0 way, else its fallback. Blocks: run it off the loop.

    ``active``: the unit's state when the caller already asked (``active_states`` for a batch).
    """
    unit = unit_name(request.token)
    if active is _ASK:
        active = is_active(settings, request.token)
    if active is None:
        return RestartResult.UNKNOWN_STATE
    if not active:
        log.debug("unit.restart_skipped_inactive", slot=request.name, unit=unit)
        return RestartResult.INACTIVE
    try:
        restart_via_api(settings, request.name)
    except ApiNoAnswer as exc:
        log.warning("unit.restart_unconfirmed", slot=request.name, unit=unit, error=str(exc))
        return RestartResult.NO_ANSWER
    except errors.ReconcilerError as exc:
        api_error = str(exc)
    else:
        log.info("unit.restarted", slot=request.name, unit=unit, via="hal0-api")
        return RestartResult.RESTARTED
    if settings.restart_fallback is RestartFallback.NONE:
        log.warning(
            "unit.restart_failed",
            slot=request.name,
            unit=unit,
            error=api_error,
            fallback="none",
            action="restart the slot in hal0 to apply its new device",
        )
        return RestartResult.FAILED
    try:
        stop_unit(settings, request.token)
    except errors.ReconcilerError as exc:
        log.error(  # noqa: TRY400 - the human line, no traceback
            "unit.restart_failed",
            slot=request.name,
            unit=unit,
            error=api_error,
            stop_error=str(exc),
        )
        return RestartResult.FAILED
    log.warning(
        "unit.stopped_needs_reload",
        slot=request.name,
        unit=unit,
        error=api_error,
        action="the slot needs a reload in hal0 (its unit was stopped)",
    )
    return RestartResult.STOPPED


class _Stop(enum.Enum):
    TOKEN = enum.auto()


RESTARTER_STOP_WAIT = 2.0
"""Seconds a stop waits for a restart in flight (an API call or systemctl is then abandoned:
the slot is stopped or reloaded, or not, and the next start sees its state)."""


class Restarter(lifecycle.StartStop):
    """A small worker thread applying restart requests, rate-limited per slot.

    ``submit`` never blocks. A request for a slot restarted less than ``restart_min_interval``
    ago waits until its turn; several such requests are one restart. A context manager that
    stops and joins the thread on exit.

    The due times are also kept in a heap of ``(due, token)``, so taking what is due and finding
    the next due time cost O(log n) per request, whatever the number pending (a flood of
    deferred restarts is O(n log n), not a scan of every pending request per wake-up). An entry
    whose token is no longer pending at that due time is stale and skipped; the heap is rebuilt
    when stale entries outnumber live ones.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[float, RestartRequest]] = {}  # token -> (due, request)
        self._dues: list[tuple[float, str]] = []  # heap of (due, token), stale entries included
        self._last: dict[str, float] = {}  # token -> monotonic time of the last action
        self._pruned_at = 0.0
        self._stop: _Stop | None = None
        self._busy_since: float | None = None
        self._previous: dict[str, float | None] = {}  # token -> its last action before this one
        self.results: Counter[RestartResult] = Counter()
        self._thread = threading.Thread(target=self._run, name="hal0-restarter", daemon=True)

    def update_settings(self, settings: Settings) -> None:
        with self._cond:
            self._settings = settings

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

    def busy_for(self) -> float:
        with self._cond:
            return 0.0 if self._busy_since is None else time.monotonic() - self._busy_since

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, timeout: float = RESTARTER_STOP_WAIT) -> None:
        with self._cond:
            self._stop = _Stop.TOKEN
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _next_due(self) -> tuple[list[RestartRequest], Settings] | _Stop:
        """Every request that is due now (waiting for the first one)."""
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
                requests = []
                while self._dues and self._dues[0][0] <= now:  # in (due, token) order
                    due, token = heapq.heappop(self._dues)
                    known = self._pending.get(token)
                    if known is None or known[0] != due:
                        continue  # stale: taken already, or due at another time
                    del self._pending[token]
                    self._previous[token] = self._last.get(token)
                    self._last[token] = now  # a request arriving meanwhile waits its turn
                    requests.append(known[1])
                if requests:
                    self._busy_since = now
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

    def _run(self) -> None:
        while True:
            item = self._next_due()
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
                    self._busy_since = time.monotonic()  # "stuck" is per restart, not per batch
                try:
                    result = apply_change(settings, request, active=states.get(request.token))
                except Exception:
                    log.exception("unit.restart_crashed", slot=request.name)
                    result = RestartResult.FAILED
                self._done(request, result)
            with self._cond:
                self._busy_since = None

    def _done(self, request: RestartRequest, result: RestartResult) -> None:
        with self._cond:
            self.results[result] += 1
            previous = self._previous.pop(request.token, None)
            if result in {RestartResult.INACTIVE, RestartResult.UNKNOWN_STATE}:
                # nothing was done: it does not count against the rate limit
                if previous is None:
                    self._last.pop(request.token, None)
                else:
                    self._last[request.token] = previous
