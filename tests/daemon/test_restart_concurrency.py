"""restart_concurrency: more than one slot restarted at once when the setting allows it, never
two restarts of one slot at once, one at a time by default; a stop during several restarts
writes each down and the next start confirms each. Real worker threads, a real systemctl
stand-in, a real HTTP server for hal0's API that records which restarts overlap."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import state as restart_state
from hal0_reconciler.host.restarts import units
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until
from helpers.fake_systemctl import FakeSystemctl, restarter_overrides
from helpers.hal0_api_server import Hal0Api

pytestmark = pytest.mark.timeout(60)


def _settings(
    tmp_path: Path, api: Hal0Api, names: list[str], **more: object
) -> settings_mod.Settings:
    systemctl = FakeSystemctl(tmp_path / "bin", {units.unit_name(n): "active" for n in names})
    overrides = restarter_overrides(tmp_path, api.url, systemctl.path)
    return settings_mod.load(None, {**overrides, "restart_min_interval": 0, **more})


def _request(name: str) -> units.RestartRequest:
    return units.RestartRequest(name=name, token=name)


def test_two_workers_restart_two_slow_slots_at_once(tmp_path: Path) -> None:
    """restart_concurrency = 2: while one slot's slow restart is in progress, the other's
    starts too (hal0 sees both at once), and both end restarted."""
    with Hal0Api() as api:
        for name in ("agent", "coder"):
            api.slot(name, restart_for=3.0)
        settings = _settings(tmp_path, api, ["agent", "coder"], restart_concurrency=2)
        with units.Restarter(settings) as restarter:
            restarter.submit(_request("agent"))
            restarter.submit(_request("coder"))
            wait_until(lambda: ("agent", "coder") in api.at_once, timeout=20, what="overlap")
            wait_until(
                lambda: restarter.results[units.RestartResult.RESTARTED] == 2,
                timeout=30,
                what="both restarted",
            )
        assert [1, 2] == sorted(len(names) for names in api.at_once)


def test_by_default_restarts_never_overlap(tmp_path: Path) -> None:
    """The default (1): three slow restarts, one after the other; hal0 never sees two."""
    names = ["agent", "coder", "embed"]
    with Hal0Api() as api:
        for name in names:
            api.slot(name, restart_for=0.4)
        settings = _settings(tmp_path, api, names)
        assert 1 == settings.restart_concurrency
        with units.Restarter(settings) as restarter:
            for name in names:
                restarter.submit(_request(name))
            wait_until(
                lambda: restarter.results[units.RestartResult.RESTARTED] == 3,
                timeout=30,
                what="three restarts",
            )
        assert [(n,) for n in names] == api.at_once


def test_a_slot_asked_again_during_its_restart_waits_for_it_to_end(tmp_path: Path) -> None:
    """Four workers, one slot asked for again (three times) while its slow restart runs: the
    next restart starts only after the first ended (never two of one slot at once), and once."""
    with Hal0Api() as api:
        api.slot("agent", restart_for=1.6)
        settings = _settings(tmp_path, api, ["agent"], restart_concurrency=4)
        with units.Restarter(settings) as restarter:
            restarter.submit(_request("agent"))
            wait_until(lambda: api.at_once, timeout=20, what="the first restart")
            for _ in range(3):
                restarter.submit(_request("agent"))
            wait_until(
                lambda: restarter.results[units.RestartResult.RESTARTED] == 2,
                timeout=30,
                what="the second restart",
            )
            threading.Event().wait(0.3)  # nothing more comes
            assert {} == restarter.pending()
        assert [("agent",), ("agent",)] == api.at_once


def test_a_stop_during_two_restarts_keeps_both_and_the_next_start_confirms_both(
    tmp_path: Path,
) -> None:
    """Two restarts in progress when the restarter stops: both are in the in-flight file; the
    next start says it confirms each, asks hal0 about each (both came up) and confirms both
    without restarting."""
    with Hal0Api() as api:
        for name in ("agent", "coder"):
            api.slot(name, restart_for=2.0)
        settings = _settings(tmp_path, api, ["agent", "coder"], restart_concurrency=2)
        with units.Restarter(settings) as restarter:
            restarter.submit(_request("agent"))
            restarter.submit(_request("coder"))
            wait_until(lambda: ("agent", "coder") in api.at_once, timeout=20, what="overlap")
        path = restart_state.in_flight_path(settings)
        assert {"agent": "agent", "coder": "coder"} == restart_state.read_in_flight(path)
        wait_until(  # hal0 finishes the restarts whoever listens
            lambda: all(api.slot(n).state == "ready" for n in ("agent", "coder")),
            timeout=20,
            what="hal0 done",
        )
        with capture_logs() as logs, units.Restarter(settings) as again:
            wait_until(
                lambda: again.results[units.RestartResult.RESTARTED] == 2,
                timeout=20,
                what="both confirmed",
            )
        assert 2 == len(api.requests), "restarted again instead of confirmed"
        said = sorted(e["slot"] for e in logs if e["event"] == "unit.restart_to_confirm")
        assert ["agent", "coder"] == said, "the start did not say what it confirms"
        assert not path.exists()


def test_in_flight_writes_from_many_threads_keep_every_restart(tmp_path: Path) -> None:
    """Eight threads writing down dropped restarts at once: every one is in the file."""
    path = tmp_path / "state" / restart_state.IN_FLIGHT_FILE
    path.parent.mkdir()
    tokens = [f"s{n}-{k}" for n in range(8) for k in range(15)]
    threads = [
        threading.Thread(
            target=lambda n=n: [
                restart_state.write_in_flight(path, t, t, "rid")
                for t in tokens[n * 15 : n * 15 + 15]
            ]
        )
        for n in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(tokens) == sorted(restart_state.read_in_flight(path))


def test_status_shows_the_failures_of_every_worker(tmp_path: Path) -> None:
    """Two restarts failing at once on two workers: status's report names both slots with
    hal0's error, and the problem line counts both."""
    with Hal0Api() as api:
        for name in ("agent", "coder"):
            api.slot(name, restart_for=1.0, outcome="error")
        settings = _settings(tmp_path, api, ["agent", "coder"], restart_concurrency=2)
        with units.Restarter(settings) as restarter:
            restarter.submit(_request("agent"))
            restarter.submit(_request("coder"))
            wait_until(
                lambda: restarter.results[units.RestartResult.FAILED] == 2,
                timeout=30,
                what="both failed",
            )
            failed = restarter.report()["failed"]
            problem = restarter.problems()["restart-failed"]
        assert ("agent", "coder") in api.at_once
        assert isinstance(failed, dict)
        assert ["agent", "coder"] == sorted(failed)
        assert all("slot.spawn_failed" in message for message in failed.values())
        assert problem.startswith("restart of slot agent failed")
        assert problem.endswith("(+1 more)")


def test_busy_for_is_the_age_of_the_oldest_restart_in_progress(tmp_path: Path) -> None:
    """Two restarts in progress, the second started later: the stuck check sees the first's
    age, not the newer one's."""
    with Hal0Api() as api:
        for name in ("agent", "coder"):
            api.slot(name, restart_for=4.0)
        settings = _settings(tmp_path, api, ["agent", "coder"], restart_concurrency=2)
        with units.Restarter(settings) as restarter:
            restarter.submit(_request("agent"))
            wait_until(lambda: api.at_once, timeout=20, what="the first restart")
            first_seen = time.monotonic()  # agent's restart began before this
            threading.Event().wait(0.5)
            restarter.submit(_request("coder"))
            wait_until(lambda: ("agent", "coder") in api.at_once, timeout=20, what="overlap")
            now = time.monotonic()
            busy_for = restarter.busy_for()
        assert busy_for >= now - first_seen, "the newer restart's age"


def test_a_reload_keeps_the_running_concurrency_and_says_so(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """restart_concurrency changed in the settings file: the reload warns that the daemon must
    be restarted for it, and no second restart worker appears."""
    config = tmp_path / "reconciler.toml"
    config.write_text("restart_concurrency = 1\n")
    with capture_logs() as logs, running(host.settings(), config_path=config) as daemon:
        notify_socket.wait_for("READY=1")
        drop_slot(host.slots, "agent")  # a relabel: its restart request starts the worker
        wait_until(lambda: device_of(host.slots / "agent.toml") == "gpu-rocm", what="relabel")
        config.write_text("restart_concurrency = 3\n")
        daemon.request_reload()
        wait_until(lambda: any(e["event"] == "daemon.reloaded" for e in logs), what="reload")
        workers = [t.name for t in threading.enumerate() if t.name.startswith("hal0-restarter")]
    (kept,) = [e for e in logs if e["event"] == "daemon.restart_concurrency_kept"]
    assert ("warning", 1, 3) == (kept["log_level"], kept["running"], kept["configured"])
    assert ["hal0-restarter"] == workers
