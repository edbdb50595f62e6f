"""The restarter thread under faults and stops: a crash in one step is logged and the rest of
the batch still runs; a stop in the middle of a batch applies nothing more; "busy for" counts
the restart under way, not the whole batch. Real thread, real Condition; the unit steps are
replaced by functions that block on events, so every interleaving is forced, not timed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import units
from helpers.daemon_host import wait_until
from helpers.fake_systemctl import restarter_overrides

pytestmark = pytest.mark.timeout(60)

Result = units.RestartResult


def _settings(tmp_path: Path) -> settings_mod.Settings:
    # neither systemctl nor the API is reached: the steps are replaced below
    return settings_mod.load(
        None, restarter_overrides(tmp_path, "http://127.0.0.1:9", tmp_path / "no-systemctl")
    )


def _batch(restarter: units.Restarter, names: list[str]) -> None:
    """Submitted before the thread starts: taken as one batch."""
    for name in names:
        restarter.submit(units.RestartRequest(name=name, token=name))


class Steps:
    """Stand-ins for ``active_states`` and ``apply_change`` that record and can block."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.entered = threading.Semaphore(0)
        self.release: dict[str, threading.Event] = {}

    def states(self, _settings: object, tokens: list[str]) -> dict[str, bool | None]:
        return dict.fromkeys(tokens, True)

    def apply(
        self, _settings: object, request: units.RestartRequest, *, active: object, now: float = 0.0
    ) -> Result:
        self.applied.append(request.name)
        self.entered.release()
        gate = self.release.get(request.name)
        if gate is not None:
            assert gate.wait(30), f"{request.name} never released"
        return Result.RESTARTED

    def wait_entered(self) -> None:
        assert self.entered.acquire(timeout=30), "no restart began"


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Steps:
    s = Steps()
    monkeypatch.setattr(units, "active_states", s.states)

    def step(flow: object, request: units.RestartRequest, **kw: Any) -> Result:
        return s.apply(flow, request, **kw)

    monkeypatch.setattr(units.RestartFlow, "step", step)
    return s


def test_a_state_query_that_crashes_is_logged_and_the_batch_still_runs(
    tmp_path: Path, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the batch's state query must not end the thread silently: it is logged with
    its traceback and the batch's size, and each restart then runs with its state unknown."""
    seen: list[object] = []

    def crashing(_settings: object, _tokens: list[str]) -> dict[str, bool | None]:
        raise RuntimeError("parse error in systemctl's answer")

    def apply(
        _settings: object, request: units.RestartRequest, *, active: object, now: float = 0.0
    ) -> Result:
        seen.append(active)
        return Result.UNKNOWN_STATE

    monkeypatch.setattr(units, "active_states", crashing)
    monkeypatch.setattr(units.RestartFlow, "step", apply)
    restarter = units.Restarter(_settings(tmp_path))
    _batch(restarter, ["agent", "coder"])
    with capture_logs() as logs, restarter:
        wait_until(lambda: len(seen) == 2, timeout=20, what="both restarts tried")
        assert restarter.is_alive()
    crashed = [e for e in logs if e["event"] == "unit.state_query_crashed"]
    assert [2] == [e["units"] for e in crashed], logs
    assert crashed[0]["exc_info"] is True
    assert "error" == crashed[0]["log_level"]
    assert [None, None] == seen
    assert 2 == restarter.results[Result.UNKNOWN_STATE]


def test_a_restart_that_crashes_is_logged_counted_failed_and_the_next_one_runs(
    tmp_path: Path, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    def apply(
        settings: object, request: units.RestartRequest, *, active: object, now: float = 0.0
    ) -> Result:
        if request.name == "agent":
            raise OSError(24, "Too many open files")
        return steps.apply(settings, request, active=active)

    monkeypatch.setattr(units.RestartFlow, "step", apply)
    restarter = units.Restarter(_settings(tmp_path))
    _batch(restarter, ["agent", "coder"])
    with capture_logs() as logs, restarter:
        wait_until(lambda: steps.applied == ["coder"], timeout=20, what="the next restart")
        wait_until(lambda: sum(restarter.results.values()) == 2, timeout=20, what="both done")
    crashed = [e for e in logs if e["event"] == "unit.restart_crashed"]
    assert ["agent"] == [e["slot"] for e in crashed], logs
    assert crashed[0]["exc_info"] is True
    assert "error" == crashed[0]["log_level"]
    assert (1, 1) == (restarter.results[Result.FAILED], restarter.results[Result.RESTARTED])


def test_a_stop_in_the_middle_of_a_batch_applies_nothing_more(tmp_path: Path, steps: Steps) -> None:
    """Stopping while the first of three restarts runs: that one finishes, the other two are
    not applied (their files are written; the next start's pass finds them), and stop waits
    for the thread."""
    steps.release["a"] = threading.Event()
    restarter = units.Restarter(_settings(tmp_path))
    _batch(restarter, ["a", "b", "c"])
    restarter.start()
    steps.wait_entered()
    stopper = threading.Thread(target=restarter.stop, kwargs={"timeout": 20})
    stopper.start()
    wait_until(lambda: restarter._stop is not None, timeout=20, what="the stop asked")
    steps.release["a"].set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert not restarter.is_alive()
    assert ["a"] == steps.applied
    assert 1 == sum(restarter.results.values())


def test_busy_for_counts_the_restart_under_way_not_the_whole_batch(
    tmp_path: Path, steps: Steps
) -> None:
    """The watchdog's "stuck restarter" check reads busy_for: a long batch of quick restarts
    is not stuck. While the second restart runs, busy_for is at most the time since the first
    one ended, whatever the first one took."""
    steps.release["a"] = threading.Event()
    steps.release["b"] = threading.Event()
    restarter = units.Restarter(_settings(tmp_path))
    _batch(restarter, ["a", "b"])
    with restarter:
        steps.wait_entered()
        time.sleep(0.5)  # the first restart takes a while
        assert restarter.busy_for() >= 0.5
        ended = time.monotonic()
        steps.release["a"].set()
        steps.wait_entered()
        assert 0 < restarter.busy_for() <= time.monotonic() - ended
        steps.release["b"].set()
        wait_until(lambda: restarter.busy_for() == 0.0, timeout=20, what="idle again")
    assert ["a", "b"] == steps.applied


def test_the_restarter_sleeps_until_the_next_turn_and_no_longer(
    tmp_path: Path, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart deferred by the rate limit (0.2 s) is waited for with a timeout that ends at
    its turn: every wait with a timeout is at most the interval (recorded on the real
    Condition, so nothing here depends on how fast the machine is)."""
    settings = settings_mod.load(
        None,
        {
            **restarter_overrides(tmp_path, "http://127.0.0.1:9", tmp_path / "no-systemctl"),
            "restart_min_interval": 0.2,
        },
    )
    restarter = units.Restarter(settings)
    timeouts: list[float] = []
    real_wait = restarter._cond.wait

    def wait(timeout: float | None = None) -> bool:
        if timeout is not None:
            timeouts.append(timeout)
        return real_wait(timeout)

    monkeypatch.setattr(restarter._cond, "wait", wait)
    with restarter:
        _batch(restarter, ["agent"])
        steps.wait_entered()
        _batch(restarter, ["agent"])  # deferred: its turn is 0.2 s after the first
        steps.wait_entered()
    assert ["agent", "agent"] == steps.applied
    assert timeouts, "the deferred restart was not waited for"
    assert max(timeouts) <= 0.2, timeouts
