"""Odd answers from systemctl and from the configuration: fewer or more lines than units, no
systemctl at all, an api_url no request can be made for. Real processes, real logs."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import units
from helpers.fake_systemctl import restarter_overrides
from helpers.hal0_api_server import Hal0Api

NO_API = "http://127.0.0.1:9"  # nothing listens there: the API cannot be reached


def _systemctl(tmp_path: Path, output: str) -> Path:
    """A systemctl that prints ``output`` for any ``is-active`` question."""
    path = tmp_path / "systemctl"
    path.write_text(f"#!/bin/sh\nprintf '{output}'\nexit 3\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("active\\n", {"a": True, "b": False, "c": False}),
        ("inactive\\nactive\\nactive\\nsome warning\\n", {"a": False, "b": True, "c": True}),
    ],
    ids=["fewer-lines", "more-lines"],
)
def test_units_systemctl_says_nothing_about_are_not_active(
    tmp_path: Path, output: str, expected: dict[str, bool]
) -> None:
    """One line per unit, in order: a unit without a line is not active (as a single query's
    empty answer is), and lines past the last unit are ignored."""
    settings = settings_mod.load(None, {"systemctl": str(_systemctl(tmp_path, output))})
    assert expected == units.active_states(settings, ["a", "b", "c"])


def test_a_systemctl_that_cannot_run_is_said_once_with_the_units(tmp_path: Path) -> None:
    """No systemctl: every state unknown, and one warning naming the first five units (and how
    many more) and why."""
    missing = tmp_path / "no-systemctl"
    settings = settings_mod.load(None, {"systemctl": str(missing)})
    tokens = [f"s{n}" for n in range(7)]
    with capture_logs() as logs:
        assert dict.fromkeys(tokens) == units.active_states(settings, tokens)
    (event,) = [e for e in logs if e["event"] == "unit.state_unknown"]
    shown = " ".join(units.unit_name(t) for t in tokens[:5])
    assert (f"{shown} (+2 more)", "warning") == (event["units"], event["log_level"])
    assert "no-systemctl" in event["error"]
    assert "not found" in event["error"]
    with capture_logs() as logs:
        units.active_states(settings, tokens[:5])
    (event,) = [e for e in logs if e["event"] == "unit.state_unknown"]
    assert " ".join(units.unit_name(t) for t in tokens[:5]) == event["units"]


def test_an_api_url_no_request_can_be_made_for_fails_the_restart_with_the_reason(
    tmp_path: Path,
) -> None:
    """A configured api_url urllib cannot even build a request for: the restart fails (no
    fallback here) and says the URL, never a crash."""
    settings = settings_mod.load(
        None,
        {
            "api_url": "http://[::1",
            "api_env_file": str(tmp_path / "api.env"),
            "restart_fallback": "none",
        },
    )
    request = units.RestartRequest(name="agent", token="agent")
    with capture_logs() as logs:
        result = units.apply_change(settings, request, active=True)
    assert units.RestartResult.FAILED == result
    (event,) = [e for e in logs if e["event"] == "unit.restart_failed"]
    assert "bad api_url 'http://[::1'" in event["error"]


def test_a_unit_whose_state_is_unknown_is_left_alone(tmp_path: Path) -> None:
    """systemctl could not say whether the unit runs: nothing is restarted or stopped."""
    calls = tmp_path / "calls"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    systemctl.chmod(0o755)
    settings = settings_mod.load(None, restarter_overrides(tmp_path, NO_API, systemctl))
    request = units.RestartRequest(name="agent", token="agent")
    assert units.RestartResult.UNKNOWN_STATE == units.apply_change(settings, request, active=None)
    assert not calls.exists()


def test_a_stop_that_fails_fails_the_restart_with_both_reasons(tmp_path: Path) -> None:
    """hal0-api is down past its bound, the stop fallback is chosen and `systemctl stop` fails
    too: the restart failed, and the log says why the API and why the stop did not work."""
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = is-active ]; then echo failed; exit 3; fi\n'
        "echo 'Failed to stop unit: Access denied' >&2\nexit 1\n"
    )
    systemctl.chmod(0o755)
    overrides = restarter_overrides(tmp_path, NO_API, systemctl, api_timeout=2)
    settings = settings_mod.load(
        None, {**overrides, "restart_fallback": "stop", "api_wait_bound": 0}
    )
    request = units.RestartRequest(name="agent", token="agent")
    with capture_logs() as logs:
        result = units.apply_change(settings, request, active=True)
    assert units.RestartResult.FAILED == result
    (event,) = [e for e in logs if e["event"] == "unit.restart_failed"]
    assert ("error", "agent") == (event["log_level"], event["slot"])
    assert "refused" in event["error"]
    assert "Access denied" in event["stop_error"]
    assert not [e for e in logs if e["event"] == "unit.stopped_needs_reload"]


def test_an_inactive_unit_is_skipped_and_said_at_debug_level(tmp_path: Path) -> None:
    settings = settings_mod.load(None, {"api_env_file": str(tmp_path / "api.env")})
    request = units.RestartRequest(name="agent", token="agent")
    with capture_logs() as logs:
        assert units.RestartResult.INACTIVE == units.apply_change(settings, request, active=False)
    assert [("unit.restart_skipped_inactive", "debug", "agent", units.unit_name("agent"))] == [
        (e["event"], e["log_level"], e["slot"], e["unit"]) for e in logs
    ]


def test_an_accepted_restart_is_said_with_the_way_it_went(tmp_path: Path) -> None:
    """hal0 answers ready: one line at info, naming the slot, the unit and the way."""
    with Hal0Api() as api:
        settings = settings_mod.load(
            None,
            {
                "api_url": api.url,
                "api_env_file": str(tmp_path / "e"),
                "update_jobs_dir": str(tmp_path / "jobs"),
            },
        )
        request = units.RestartRequest(name="agent", token="agent")
        with capture_logs() as logs:
            assert units.RestartResult.RESTARTED == units.apply_change(
                settings, request, active=True
            )
    assert [("unit.restarted", "info", "agent", units.unit_name("agent"), "hal0-api")] == [
        (e["event"], e["log_level"], e["slot"], e["unit"], e["via"])
        for e in logs
        if e["event"] == "unit.restarted"
    ]
