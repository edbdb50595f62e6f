"""Applying a relabel: hal0's API, the systemctl fallback, inactive slots, the rate limit."""

from __future__ import annotations

import threading

from structlog.testing import capture_logs

from hal0_reconciler.host.envfile import read_env_file
from hal0_reconciler.host.restarts import units
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until
from helpers.hal0_api_server import Hal0Api

UNIT = "hal0-slot@agent.service"


def test_an_active_relabelled_slot_is_restarted_through_the_api(host: Host, notify_socket) -> None:
    """POST /api/slots/agent/restart with the bearer key from api.env; no systemctl action."""
    host.systemctl.set_states({UNIT: "active"})
    env = host.root / "etc/hal0/api.env"
    env.parent.mkdir(parents=True, exist_ok=True)
    env.write_text("# hal0 api\nexport HAL0_ADMIN_KEY='s3cret'\n")
    with Hal0Api(key="s3cret") as api, running(host.settings(api_url=api.url)):
        notify_socket.wait_for("READY=1")
        drop_slot(host.slots, "agent")
        wait_until(lambda: api.requests, what="the API call")
    assert [("POST", "/api/slots/agent/restart", "Bearer s3cret")] == api.requests
    assert [] == host.systemctl.actions()


def test_without_the_key_the_api_refuses_and_nothing_is_stopped(host: Host, notify_socket) -> None:
    """401 from the API: a failed restart, said with hal0's error; the default fallback stops
    nothing."""
    host.systemctl.set_states({UNIT: "active"})
    with (
        Hal0Api(key="s3cret") as api,
        running(host.settings(api_url=api.url)),
        capture_logs() as logs,
    ):
        notify_socket.wait_for("READY=1")
        drop_slot(host.slots, "agent")
        wait_until(lambda: any(e["event"] == "unit.restart_failed" for e in logs))
    assert [] == api.requests, "refused at the first look, before any restart"
    assert [] == host.systemctl.actions()
    warning = next(e for e in logs if e["event"] == "unit.restart_failed")
    assert ("warning", "agent") == (warning["log_level"], warning["slot"])
    assert "401 auth.required: authentication required" in warning["error"]  # hal0's error envelope


def test_fallback_none_leaves_the_unit_running(host: Host, notify_socket) -> None:
    """restart_fallback = none: the API is down past its bound and nothing is stopped."""
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "failed"})
    settings = host.settings(restart_fallback="none", api_wait_bound="0.3")
    with running(settings), capture_logs() as logs:
        notify_socket.wait_for("READY=1")
        drop_slot(host.slots, "agent")
        wait_until(lambda: any(e["event"] == "unit.restart_failed" for e in logs))
    assert [] == host.systemctl.actions()


def test_an_inactive_slot_is_never_restarted(host: Host, notify_socket) -> None:
    """is-active says inactive: no API call, no stop."""
    with Hal0Api() as api, running(host.settings(api_url=api.url)):
        notify_socket.wait_for("READY=1")
        target = drop_slot(host.slots, "agent")
        wait_until(lambda: device_of(target) == "gpu-rocm")
        wait_until(lambda: ["is-active", UNIT] in host.systemctl.calls(), what="is-active")
        threading.Event().wait(0.3)
    assert [] == api.requests
    assert [] == host.systemctl.actions()


def test_a_slot_is_restarted_at_most_once_per_interval(host: Host, notify_socket) -> None:
    """Two relabels within restart_min_interval: one restart now, the next one deferred."""
    host.systemctl.set_states({UNIT: "active"})
    with Hal0Api() as api, running(host.settings(api_url=api.url)) as daemon:
        notify_socket.wait_for("READY=1")
        drop_slot(host.slots, "agent")
        wait_until(lambda: api.requests, what="first restart")
        drop_slot(host.slots, "agent", port=8082)
        wait_until(lambda: daemon.stats().relabels == 2, what="second relabel")
        wait_until(daemon._restarter.pending, what="deferred restart")
        threading.Event().wait(0.5)
        assert 1 == len(api.requests)
        assert ["agent"] == list(daemon._restarter.pending())


def test_env_file_parsing_follows_shell_quoting(tmp_path) -> None:
    """KEY=VALUE lines with comments, export and quotes; a missing file is empty."""
    env = tmp_path / "api.env"
    env.write_text('# c\nexport HAL0_ADMIN_KEY="a b"\nOTHER=x # note\n\nBROKEN\n')
    assert {"HAL0_ADMIN_KEY": "a b", "OTHER": "x"} == read_env_file(env)
    assert {} == read_env_file(tmp_path / "missing")


def test_an_unreadable_api_env_file_fails_the_restart_and_stops_nothing(host: Host) -> None:
    """A broken api.env (here a directory) is our configuration failing: said, nothing sent,
    nothing stopped, even with the stop fallback chosen."""
    host.systemctl.set_states({UNIT: "active"})
    broken = host.root / "etc/hal0/api.env"
    broken.mkdir(parents=True)
    with Hal0Api() as api:
        settings = host.settings(api_url=api.url, api_env_file=str(broken), restart_fallback="stop")
        with capture_logs() as logs:
            result = units.apply_change(settings, units.RestartRequest(name="agent", token="agent"))
    assert units.RestartResult.FAILED == result
    assert [] == host.systemctl.actions()
    assert [] == api.calls
    assert "api.env" in next(e for e in logs if e["event"] == "unit.restart_failed")["error"]


def test_an_api_that_accepts_but_never_answers_is_not_stopped(host: Host) -> None:
    """Something accepts the connection but never answers: the API is not there yet, nothing
    is stopped (the one-shot verb leaves it to the daemon)."""
    import socket

    host.systemctl.set_states({UNIT: "active"})
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection, never answers
    try:
        port = silent.getsockname()[1]
        settings = host.settings(
            api_url=f"http://127.0.0.1:{port}", api_timeout=0.5, restart_fallback="stop"
        )
        result = units.apply_change(settings, units.RestartRequest(name="agent", token="agent"))
    finally:
        silent.close()
    assert units.RestartResult.DEFERRED == result
    assert [] == host.systemctl.actions()


def test_the_slot_name_is_quoted_in_the_api_path(host: Host) -> None:
    """A name with a space or slash cannot escape /api/slots/{name}/restart."""
    host.systemctl.set_states({"hal0-slot@t.service": "active"})
    with Hal0Api() as api:
        units.apply_change(
            host.settings(api_url=api.url), units.RestartRequest(name="a b/c", token="t")
        )
    assert [("POST", "/api/slots/a%20b%2Fc/restart", None)] == api.requests


def test_a_slot_hal0_could_not_run_is_relabelled_but_never_restarted(
    host: Host, notify_socket
) -> None:
    """A name that breaks hal0's pattern has no unit hal0 could run: the file is relabelled, its
    name goes to neither systemctl nor the API; the next slot's restart goes on."""
    host.systemctl.set_states({UNIT: "active", "hal0-slot@Agent.service": "active"})
    env = host.root / "etc/hal0/api.env"
    env.parent.mkdir(parents=True, exist_ok=True)
    env.write_text("HAL0_ADMIN_KEY=s3cret\n")
    with Hal0Api(key="s3cret") as api, running(host.settings(api_url=api.url)):
        notify_socket.wait_for("READY=1")
        bad = drop_slot(host.slots, "Agent", port=8082)
        wait_until(lambda: device_of(bad) == "gpu-rocm", what="the relabel")
        drop_slot(host.slots, "agent")
        wait_until(lambda: api.requests, what="the next slot's restart")
    assert [("POST", "/api/slots/agent/restart", "Bearer s3cret")] == api.requests
    named = {a for call in host.systemctl.calls() for a in call[1:] if a.startswith("hal0-slot@")}
    assert {UNIT} == named, "no unit is named for the slot hal0 could not run"
