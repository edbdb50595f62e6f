"""The restart rate limit counts restarts that happened, and says truly how long one waits."""

from __future__ import annotations

from pathlib import Path

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import units
from helpers.daemon_host import wait_until
from helpers.fake_systemctl import FakeSystemctl, restarter_overrides
from helpers.hal0_api_server import Hal0Api

UNIT = "hal0-slot@agent.service"
AGENT = units.RestartRequest(name="agent", token="agent")


def _settings(tmp_path: Path, systemctl: FakeSystemctl, api: Hal0Api) -> settings_mod.Settings:
    overrides = restarter_overrides(tmp_path, api.url, systemctl.path, api_timeout=2)
    return settings_mod.load(None, {**overrides, "restart_min_interval": 60})


def test_an_inactive_slot_does_not_count_against_the_interval(tmp_path: Path) -> None:
    """Relabelled while inactive (nothing restarted), then started and relabelled again at once:
    the restart happens now, not restart_min_interval later."""
    systemctl = FakeSystemctl(tmp_path / "bin", {})
    with Hal0Api() as api, units.Restarter(_settings(tmp_path, systemctl, api)) as restarter:
        restarter.submit(AGENT)
        wait_until(lambda: restarter.results[units.RestartResult.INACTIVE] == 1, what="skip")
        systemctl.set_states({UNIT: "active"})
        restarter.submit(AGENT)
        wait_until(lambda: api.requests, timeout=10, what="a restart right away")
        assert {} == restarter.pending(), "a restart is still pending"
    assert [("POST", "/api/slots/agent/restart", None)] == api.requests


def test_pending_restarts_say_how_long_until_they_run(tmp_path: Path) -> None:
    """A second relabel right after a restart waits out restart_min_interval, and pending()
    (status.json's pending_restarts) says about that many seconds."""
    systemctl = FakeSystemctl(tmp_path / "bin", {UNIT: "active"})
    with Hal0Api() as api, units.Restarter(_settings(tmp_path, systemctl, api)) as restarter:
        restarter.submit(AGENT)
        wait_until(lambda: restarter.results[units.RestartResult.RESTARTED] == 1, what="restart")
        restarter.submit(AGENT)
        pending = restarter.pending()
        assert ["agent"] == list(pending), f"the second restart is not pending: {pending}"
        assert 50 < pending["agent"] <= 60, f"pending_restarts says {pending['agent']}s, not ~60s"
    assert 1 == len(api.requests)
