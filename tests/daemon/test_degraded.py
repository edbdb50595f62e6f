"""A daemon that cannot do its job says so: degraded, at warning, until the cause goes away;
settings reloaded on SIGHUP are range-checked and a bad file keeps the old ones."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import _log
from hal0_reconciler.daemon import status
from hal0_reconciler.settings import Settings
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until


def _snapshot(settings: Settings) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = json.loads(status.status_path(settings).read_text())
    except (OSError, ValueError):
        return None
    return doc


def _health_is(settings: Settings, health: str) -> dict[str, Any] | None:
    doc = _snapshot(settings)
    return doc if doc is not None and doc.get("health") == health else None


@pytest.mark.parametrize("missing", ["slots-typo", "not/yet/there/slots"])
def test_a_missing_slots_folder_is_degraded_until_it_appears(
    host: Host, notify_socket: Any, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """Warned once; status degraded and `status` exits 1; WATCHDOG=1 goes on (a restart would
    not bring the folder); when the folder appears, even with its parents, it is reconciled."""
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    folder = host.root / "etc/hal0" / missing
    settings = host.settings(slots_dir=folder)
    with capture_logs() as logs, running(settings):
        notify_socket.wait_for("READY=1")
        doc = wait_until(lambda: _health_is(settings, "degraded"), what="degraded status")
        assert [f"slots directory {folder} does not exist"] == doc["problems"]
        assert False is doc["healthy"]
        text, code = status.report(settings)
        assert (status.EXIT_UNHEALTHY, True) == (code, "degraded" in text.splitlines()[0]), text
        wait_until(
            lambda: any("DEGRADED: slots directory" in m for m in notify_socket.messages()),
            what="STATUS= says DEGRADED",
        )
        pings = notify_socket.messages().count("WATCHDOG=1")
        notify_socket.wait_for("WATCHDOG=1", count=pings + 2)
        folder.mkdir(parents=True)
        slot = drop_slot(folder, "agent")
        wait_until(lambda: device_of(slot) == "gpu-rocm", timeout=20, what="relabel after mkdir")
        wait_until(lambda: _health_is(settings, "healthy"), what="healthy again")
    missing_events = [e for e in logs if e["event"] == "daemon.slots_dir_missing"]
    assert 1 == len(missing_events)
    assert "warning" == missing_events[0]["log_level"]
    assert 1 == sum(e["event"] == "daemon.slots_dir_found" for e in logs)


def test_a_service_user_that_does_not_exist_is_degraded(host: Host, notify_socket: Any) -> None:
    """The probe cannot run: warned once, no slot demoted, status degraded naming the user."""
    slot = drop_slot(host.slots, "agent")
    overrides = host.overrides(service_user="no-such-user-here")
    settings = host.settings(service_user="no-such-user-here")
    with capture_logs() as logs, running(settings, overrides=overrides) as daemon:
        notify_socket.wait_for("READY=1")
        doc = wait_until(lambda: _health_is(settings, "degraded"), what="degraded status")
        passes = daemon.stats().full_passes
        daemon.request_reload()  # the same settings again: another full pass, another probe
        notify_socket.wait_for("READY=1", count=2)
        wait_until(lambda: daemon.stats().full_passes > passes, what="another full pass")
        assert _health_is(settings, "degraded")
    assert any("no-such-user-here" in p for p in doc["problems"]), doc["problems"]
    assert "gpu-vulkan" == device_of(slot)
    warned = [e for e in logs if e["event"] == "host.probe_failed"]
    assert ["warning"] == [e["log_level"] for e in warned]  # once, not once per pass
    assert not any(e["event"] == "host.probe_runs_again" for e in logs)


def test_sighup_with_an_out_of_range_setting_keeps_the_old_settings(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """`resync_interval = 0` in the file on reload: one error line naming file, key, value, range;
    the daemon keeps its settings and goes on working."""
    config = tmp_path / "reconciler.toml"
    config.write_text("resync_interval = 120\n")
    overrides = host.overrides()
    del overrides["resync_interval"]
    settings = host.settings()
    with capture_logs() as logs, running(settings, config_path=config, overrides=overrides) as d:
        notify_socket.wait_for("READY=1")
        config.write_text("resync_interval = 0\n")
        d.request_reload()
        wait_until(lambda: any(e["event"] == "daemon.reload_failed" for e in logs))
        slot = drop_slot(host.slots, "agent")
        wait_until(lambda: device_of(slot) == "gpu-rocm", what="still reconciling")
        assert 120.0 == d._settings.resync_interval
    failed = next(e for e in logs if e["event"] == "daemon.reload_failed")
    assert (
        f"{config}: setting 'resync_interval' = 0 is out of range: allowed 0.5 to 86400 seconds"
        == failed["error"]
    )
    assert "keeping the old settings" == failed["action"]


def test_status_json_says_running_before_ready_is_sent(host: Host, notify_socket: Any) -> None:
    """Whoever READY=1 wakes (systemctl start, a test, a deploy script) reads a status.json
    that already has the first pass: the STATUS= sent with it comes before READY=1."""
    drop_slot(host.slots, "agent")
    with running(host.settings()):
        notify_socket.wait_for("READY=1")
        messages = notify_socket.messages()
    before_ready = messages[: messages.index("READY=1")]
    statuses = [m for m in before_ready if m.startswith("STATUS=")]
    assert statuses, messages
    assert "last pass pending" not in statuses[-1], messages


def test_a_reload_names_the_file_and_the_settings_it_changed(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """`daemon.reload_started` and `daemon.reloaded` name the settings file; `reloaded` lists
    the settings whose values changed (nested ones dotted), none when none did (a list: the
    journal's text line says ``changed="resync_interval, aiter.heal"`` and ``changed=none``)."""
    config = tmp_path / "reconciler.toml"
    config.write_text("resync_interval = 120\n")
    overrides = host.overrides()
    del overrides["resync_interval"]
    settings = host.settings()
    with capture_logs() as logs, running(settings, config_path=config, overrides=overrides) as d:
        notify_socket.wait_for("READY=1")
        config.write_text("resync_interval = 90\n[aiter]\nheal = false\n")
        d.request_reload()
        wait_until(lambda: any(e["event"] == "daemon.reloaded" for e in logs))
        d.request_reload()
        wait_until(lambda: sum(e["event"] == "daemon.reloaded" for e in logs) == 2)
    started = [e for e in logs if e["event"] == "daemon.reload_started"]
    reloaded = [e for e in logs if e["event"] == "daemon.reloaded"]
    assert [str(config)] * 2 == [e["config"] for e in started]
    assert [str(config)] * 2 == [e["config"] for e in reloaded]
    assert [["resync_interval", "aiter.heal"], []] == [e["changed"] for e in reloaded]
    shown = [{k: v for k, v in e.items() if k != "log_level"} for e in reloaded]
    lines = [_log.journal_line("info", e) for e in shown]
    assert [
        f'<6>daemon.reloaded config={config} changed="resync_interval, aiter.heal"',
        f"<6>daemon.reloaded config={config} changed=none",
    ] == lines
