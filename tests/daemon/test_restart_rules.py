"""Each rule of a careful restart, against a hal0 stand-in on loopback that speaks the contract's
API: idle only (counters present and 0, or two quiet reads without counters), offline left for
the next load, busy waited for (and said past its bound), outcomes from hal0's answer, a long
read timeout, hal0-api booting is waited for, update jobs are waited for, a stop mid-restart is
confirmed at the next start. Real HTTP, real systemctl stand-in, real threads."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import units
from helpers.daemon_host import wait_until
from helpers.fake_systemctl import FakeSystemctl, restarter_overrides
from helpers.hal0_api_server import SANITY_MESSAGE, Hal0Api

pytestmark = pytest.mark.timeout(60)

Result = units.RestartResult
UNIT = units.unit_name("agent")


class Rig:
    """A hal0 stand-in, a systemctl whose agent unit (and hal0-api) run, and settings."""

    def __init__(self, tmp_path: Path, api: Hal0Api) -> None:
        self.tmp = tmp_path
        self.api = api
        self.systemctl = FakeSystemctl(
            tmp_path / "bin", {UNIT: "active", "hal0-api.service": "active"}
        )

    def settings(self, **extra: Any) -> settings_mod.Settings:
        base = restarter_overrides(self.tmp, self.api.url, self.systemctl.path)
        return settings_mod.load(None, {**base, **extra})

    def step(self, flow: units.RestartFlow, **request: Any) -> Result | units.Later:
        req = units.RestartRequest(name="agent", token="agent", **request)
        return flow.step(req, active=True, now=time.monotonic())

    def restarts(self) -> int:
        return len(self.api.requests)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with Hal0Api() as api:
        yield Rig(tmp_path, api)


def _until_done(rig: Rig, flow: units.RestartFlow, *, limit: float = 20) -> Result:
    deadline = time.monotonic() + limit
    while True:
        result = rig.step(flow)
        if not isinstance(result, units.Later):
            return result
        assert time.monotonic() < deadline, f"still waiting: {result.reason}"
        time.sleep(min(result.delay, 0.05))


# -- 1. only an idle slot --------------------------------------------------------------------------
def test_an_idle_slot_is_restarted_with_our_agent_and_a_request_id(rig: Rig) -> None:
    """ready, both counters present and 0: one POST, naming us (X-hal0-Agent) with a request id,
    and the bearer key from api.env; hal0 answers ready: restarted."""
    (rig.tmp / "api.env").write_text("HAL0_ADMIN_KEY=s3cret\n")
    rig.api.key = "s3cret"
    assert Result.RESTARTED == rig.step(units.RestartFlow(rig.settings()))
    (post,) = [c for c in rig.api.calls if c.method == "POST"]
    assert ("hal0-reconciler", "Bearer s3cret") == (
        post.headers["X-hal0-Agent"],
        post.headers["Authorization"],
    )
    assert post.headers["X-Request-ID"].startswith("hal0-reconciler-")


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"processing": 1}, "1 processing, 0 deferred"),
        ({"deferred": 2}, "0 processing, 2 deferred"),
        ({"state": "serving"}, "state serving"),
        ({"state": "warming"}, "state warming"),
    ],
    ids=["processing", "deferred", "serving", "warming"],
)
def test_a_busy_slot_waits_and_is_restarted_at_its_first_idle_moment(
    rig: Rig, fields: dict[str, Any], why: str
) -> None:
    """Busy by either counter, or not settled: put off (the reason says why), nothing POSTed;
    once idle, restarted at the next look."""
    rig.api.slot("agent", **fields)
    flow = units.RestartFlow(rig.settings())
    later = rig.step(flow)
    assert isinstance(later, units.Later)
    assert why in later.reason
    assert 0 == rig.restarts()
    assert {"agent": later.reason} == flow.report.waiting
    rig.api.slot("agent", state="ready", processing=0, deferred=0)
    assert Result.RESTARTED == rig.step(flow)
    assert 1 == rig.restarts()
    assert {} == flow.report.waiting


def test_without_counters_a_slot_is_idle_only_after_two_quiet_reads(rig: Rig) -> None:
    """No requests_deferred (llama-server without --metrics): not idle at once; a serving read
    in between starts the wait again; two settled reads idle_confirm apart: restarted. Said
    once."""
    rig.api.slot("agent", deferred=None)
    flow = units.RestartFlow(rig.settings(idle_confirm=0.4))
    with capture_logs() as logs:
        first = rig.step(flow)
        assert isinstance(first, units.Later)
        assert "counters unavailable" in first.reason
        time.sleep(0.25)
        rig.api.slot("agent", state="serving")
        assert isinstance(rig.step(flow), units.Later)
        rig.api.slot("agent", state="ready")
        time.sleep(0.25)
        assert isinstance(rig.step(flow), units.Later), "the serving read restarted the wait"
        assert 0 == rig.restarts()
        assert Result.RESTARTED == _until_done(rig, flow)
    assert 1 == sum(e["event"] == "unit.counters_unavailable" for e in logs)


def test_an_offline_slot_is_not_started_the_label_applies_at_the_next_load(rig: Rig) -> None:
    """hal0 has it offline: a restart would start it, so nothing is POSTed."""
    rig.api.slot("agent", state="offline")
    with capture_logs() as logs:
        assert Result.NEXT_LOAD == rig.step(units.RestartFlow(rig.settings()))
    assert 0 == rig.restarts()
    (event,) = [e for e in logs if e["event"] == "unit.restart_skipped_offline"]
    assert "applies at the next load" in event["detail"]


def test_a_slot_busy_past_its_bound_is_said_once_and_still_waited_for(rig: Rig) -> None:
    """Past busy_bound: one warning, a degraded problem, still no restart."""
    rig.api.slot("agent", processing=3)
    flow = units.RestartFlow(rig.settings(busy_bound=0.2))
    with capture_logs() as logs:
        assert isinstance(rig.step(flow), units.Later)
        time.sleep(0.3)
        for _ in range(3):
            assert isinstance(rig.step(flow), units.Later)
    assert 0 == rig.restarts()
    assert ["warning"] == [
        e["log_level"] for e in logs if e["event"] == "unit.restart_busy_past_bound"
    ]
    assert {"agent"} == flow.report.busy_past_bound


def test_restart_busy_restarts_a_slot_busy_past_its_bound(rig: Rig) -> None:
    """The operator's opt-in: past busy_bound the busy slot is restarted anyway."""
    rig.api.slot("agent", processing=3)
    flow = units.RestartFlow(rig.settings(busy_bound=0.2, restart_busy=True))
    assert isinstance(rig.step(flow), units.Later)
    time.sleep(0.3)
    assert Result.RESTARTED == rig.step(flow)


def test_a_pinned_slot_waits_like_any_other_and_the_log_says_pinned(rig: Rig) -> None:
    """pinned = true: restarted only once idle; the restart's log line says it was pinned."""
    rig.api.slot("agent", processing=1)
    flow = units.RestartFlow(rig.settings())
    with capture_logs() as logs:
        assert isinstance(rig.step(flow, pinned=True), units.Later)
        rig.api.slot("agent", processing=0)
        assert Result.RESTARTED == rig.step(flow, pinned=True)
    (started,) = [e for e in logs if e["event"] == "unit.restart_started"]
    assert (True, "pinned slot, restarted while idle") == (started["pinned"], started["note"])


# -- 2. restart and confirm ------------------------------------------------------------------------
def test_a_slow_restart_is_waited_for_with_the_long_read_timeout(rig: Rig) -> None:
    """hal0 answers after 1.5 s, far past api_timeout (0.5 s): the restart's own timeout
    (restart_timeout) holds the connection, and hal0's ready is believed."""
    rig.api.slot("agent", restart_for=1.5)
    flow = units.RestartFlow(rig.settings(api_timeout=0.5, restart_timeout=10))
    assert Result.RESTARTED == rig.step(flow)


def test_a_restart_past_restart_timeout_is_a_failure_without_a_stop(rig: Rig) -> None:
    """No answer within restart_timeout: failed (no-answer), said, and nothing stopped."""
    rig.api.slot("agent", restart_for=3)
    flow = units.RestartFlow(rig.settings(restart_timeout=1, restart_fallback="stop"))
    with capture_logs() as logs:
        assert Result.NO_ANSWER == rig.step(flow)
    assert [] == rig.systemctl.actions()
    assert any(e["event"] == "unit.restart_failed" for e in logs)


@pytest.mark.parametrize(
    ("outcome", "result", "says"),
    [
        ("warming", Result.NO_ANSWER, "still warming"),
        ("error", Result.FAILED, "slot.spawn_failed: llama-server exited with status 1"),
        ("sanity", Result.FAILED, SANITY_MESSAGE),
        ("504", Result.FAILED, "504 slot.terminate_timeout"),
    ],
)
def test_a_failed_restart_is_a_warning_with_hals_message(
    rig: Rig, outcome: str, result: Result, says: str
) -> None:
    """warming after the budget, error, a sanity failure, a 504: a warning naming the slot and
    hal0's message, kept for status as a degraded problem."""
    rig.api.slot("agent", outcome=outcome, restart_for=0.1)
    restarter = units.Restarter(rig.settings())
    with capture_logs() as logs, restarter:
        restarter.submit(units.RestartRequest(name="agent", token="agent"))
        wait_until(lambda: restarter.results, what="the restart's end")
    assert {result: 1} == dict(restarter.results)
    (event,) = [e for e in logs if e["event"] == "unit.restart_failed"]
    assert ("warning", "agent") == (event["log_level"], event["slot"])
    assert says in event["error"]
    assert says in restarter.report()["failed"]["agent"]  # type: ignore[index]
    assert "restart of slot agent failed" in restarter.problems()["restart-failed"]


def test_an_error_answer_carries_the_message_from_the_slot(rig: Rig) -> None:
    """A 200 whose state is error: the message is hal0's metadata.message (GET /api/slots/x)."""
    rig.api.slot("agent", outcome="error-200", restart_for=0.0)
    rig.api.slot("agent", message="")

    original = rig.api._restart

    def error_200(name: str) -> tuple[int, dict[str, object]]:
        rig.api._set(name, "error", "model file missing: /m/x.gguf")
        return 200, rig.api._state_body(name)

    rig.api._restart = error_200  # type: ignore[method-assign]
    try:
        with capture_logs() as logs:
            assert Result.FAILED == rig.step(units.RestartFlow(rig.settings()))
    finally:
        rig.api._restart = original  # type: ignore[method-assign]
    (event,) = [e for e in logs if e["event"] == "unit.restart_failed"]
    assert "state error: model file missing: /m/x.gguf" == event["error"]


def test_hal0_leaving_the_slot_offline_is_not_a_failure(rig: Rig) -> None:
    """200 offline (no default model): the label applies at the next load."""
    rig.api.slot("agent", outcome="offline")
    assert Result.NEXT_LOAD == rig.step(units.RestartFlow(rig.settings()))


def test_one_restart_at_a_time(rig: Rig) -> None:
    """Two slots due together: the second restart begins after the first one answered."""
    for name in ("agent", "coder"):
        rig.api.slot(name, restart_for=0.4)
    rig.systemctl.set_states({UNIT: "active", units.unit_name("coder"): "active"})
    restarter = units.Restarter(rig.settings())
    with restarter:
        for name in ("agent", "coder"):
            restarter.submit(units.RestartRequest(name=name, token=name))
        wait_until(lambda: sum(restarter.results.values()) == 2, what="both restarts")
    starts = [c for c in rig.api.calls if c.method == "POST"]
    assert 2 == len(starts)
    # the second POST came after every call of the first restart: no overlap of restarts
    assert {Result.RESTARTED: 2} == dict(restarter.results)


# -- 3. hal0-api starting, down, updating ----------------------------------------------------------
def test_a_booting_hal0_api_is_waited_for_and_nothing_is_stopped(tmp_path: Path) -> None:
    """hal0-api refuses connections for its boot while systemd calls it active: even with the
    stop fallback chosen, the restarter waits and restarts the slot once hal0 answers."""
    with Hal0Api(boot_for=1.5) as api:
        rig = Rig(tmp_path, api)
        restarter = units.Restarter(rig.settings(restart_fallback="stop", api_wait_bound=30))
        with capture_logs() as logs, restarter:
            restarter.submit(units.RestartRequest(name="agent", token="agent"))
            wait_until(lambda: restarter.results, timeout=20, what="the restart")
        assert {Result.RESTARTED: 1} == dict(restarter.results)
        assert [] == rig.systemctl.actions()
        assert any(e["event"] == "unit.api_waiting" for e in logs)
        assert not [e for e in logs if e["log_level"] == "warning"]


@pytest.mark.parametrize(("fallback", "stopped"), [("stop", True), ("none", False)])
def test_a_hal0_api_down_past_its_bound_gets_the_chosen_fallback(
    tmp_path: Path, fallback: str, stopped: bool
) -> None:
    """hal0-api inactive and refusing past api_wait_bound: `stop` stops the slot (loudly), the
    default `none` stops nothing and says the restart failed."""
    with Hal0Api(boot_for=60) as api:
        rig = Rig(tmp_path, api)
        rig.systemctl.set_states({UNIT: "active", "hal0-api.service": "inactive"})
        settings = rig.settings(restart_fallback=fallback, api_wait_bound=0.3)
        flow = units.RestartFlow(settings)
        result = _until_done(rig, flow)
    assert (Result.STOPPED if stopped else Result.FAILED) == result
    expected = [["stop", "--no-block", UNIT]] if stopped else []
    assert expected == rig.systemctl.actions()
    assert flow.report.api_unavailable is not None


def test_the_default_fallback_stops_nothing() -> None:
    """A careful operator's default: no model server stopped by surprise."""
    assert "none" == settings_mod.Settings().restart_fallback.value


def test_an_active_hal0_api_past_the_bound_is_never_stopped_for(rig: Rig, tmp_path: Path) -> None:
    """Past the bound but hal0-api is activating (still booting): no stop even when chosen."""
    with Hal0Api(boot_for=60) as api:
        other = Rig(tmp_path / "b", api)
        other.systemctl.set_states({UNIT: "active", "hal0-api.service": "activating"})
        flow = units.RestartFlow(other.settings(restart_fallback="stop", api_wait_bound=0.2))
        assert Result.FAILED == _until_done(other, flow)
        assert [] == other.systemctl.actions()


def _job(rig: Rig, state: str, *, age: float = 0.0) -> Path:
    folder = rig.tmp / "update-jobs"
    folder.mkdir(exist_ok=True)
    path = folder / "j1.json"
    path.write_text(json.dumps({"id": "j1", "state": state, "phase": "download"}))
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_a_running_update_job_is_waited_for(rig: Rig) -> None:
    """A queued/running update job: no restart until it is applied."""
    _job(rig, "running")
    flow = units.RestartFlow(rig.settings())
    later = rig.step(flow)
    assert isinstance(later, units.Later)
    assert "update j1" in later.reason
    assert 0 == rig.restarts()
    _job(rig, "applied")
    assert Result.RESTARTED == rig.step(flow)


def test_an_update_job_older_than_its_bound_is_a_crashed_update(rig: Rig) -> None:
    """A `running` job file three hours old is ignored."""
    _job(rig, "running", age=3 * 3600)
    assert Result.RESTARTED == rig.step(units.RestartFlow(rig.settings()))


# -- a stop during a long restart -------------------------------------------------------------------
def test_a_stop_during_a_long_restart_is_quick_and_confirmed_at_the_next_start(rig: Rig) -> None:
    """The daemon stops 0.3 s into a 20 s restart: the connection is dropped, the stop is
    quick, "in flight" is recorded; the next start confirms from hal0 without a second POST."""
    rig.api.slot("agent", restart_for=20)
    settings = rig.settings()
    restarter = units.Restarter(settings)
    restarter.start()
    restarter.submit(units.RestartRequest(name="agent", token="agent"))
    wait_until(lambda: rig.restarts() == 1, what="the restart POST")
    started = time.monotonic()
    restarter.stop()
    assert not restarter.is_alive()
    assert time.monotonic() - started < 3
    recorded = json.loads((settings.state_dir / "restarts-in-flight.json").read_text())
    assert ["agent"] == list(recorded)
    rig.api.slot("agent", state="ready")  # hal0 finished it meanwhile
    with capture_logs() as logs, units.Restarter(settings) as again:
        wait_until(lambda: again.results, what="the confirmation")
    assert {Result.RESTARTED: 1} == dict(again.results)
    assert 1 == rig.restarts(), "confirmed, not restarted twice"
    assert any(e["event"] == "unit.restart_confirmed" for e in logs)
    assert not (settings.state_dir / "restarts-in-flight.json").exists()


def test_a_dropped_restart_that_left_the_slot_in_error_is_restarted_again(rig: Rig) -> None:
    """At the next start hal0 has the slot in error: it is restarted again."""
    settings = rig.settings()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    (settings.state_dir / "restarts-in-flight.json").write_text(
        json.dumps({"agent": {"name": "agent"}})
    )
    rig.api.slot("agent", state="error")
    with units.Restarter(settings) as restarter:
        wait_until(lambda: restarter.results, what="the restart")
    assert {Result.RESTARTED: 1} == dict(restarter.results)
    assert 1 == rig.restarts()


@pytest.mark.parametrize(
    ("later", "event", "failed"),
    [("ready", "unit.restart_came_up", False), ("warming", "unit.restart_never_came_up", True)],
)
def test_a_restart_left_warming_is_looked_at_once_later(
    rig: Rig, later: str, event: str, failed: bool
) -> None:
    """hal0 answered warming (failed, may still come up): one look after warming_recheck, no
    second restart; it came up (the failure is cleared) or it did not (a warning, still
    failed)."""
    rig.api.slot("agent", outcome="warming", restart_for=0.05)
    restarter = units.Restarter(rig.settings(warming_recheck="0.3"))
    with capture_logs() as logs, restarter:
        restarter.submit(units.RestartRequest(name="agent", token="agent"))
        wait_until(lambda: restarter.results, what="the restart's end")
        rig.api.slot("agent", state=later)
        wait_until(lambda: any(e["event"] == event for e in logs), what=event)
        pending = restarter.pending()
    assert {Result.NO_ANSWER: 1} == dict(restarter.results)
    assert 1 == rig.restarts()
    assert {} == pending
    assert failed == ("agent" in restarter.report()["failed"])  # type: ignore[operator]
    assert 1 == sum(
        e["event"] in {"unit.restart_came_up", "unit.restart_never_came_up"} for e in logs
    )
