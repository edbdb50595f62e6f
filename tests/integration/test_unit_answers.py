"""Odd answers from systemctl and from the configuration: fewer or more lines than units, no
systemctl at all, an api_url no request can be made for. Real processes, real logs."""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host import units
from helpers.fake_systemctl import restarter_overrides

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
    """The API cannot be reached and the fallback's `systemctl stop` fails too: the restart
    failed, and the error says why the API and why the stop did not work."""
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho 'Failed to stop unit: Access denied' >&2\nexit 1\n")
    systemctl.chmod(0o755)
    settings = settings_mod.load(
        None, restarter_overrides(tmp_path, NO_API, systemctl, api_timeout=2)
    )
    request = units.RestartRequest(name="agent", token="agent")
    with capture_logs() as logs:
        result = units.apply_change(settings, request, active=True)
    assert units.RestartResult.FAILED == result
    (event,) = [e for e in logs if e["event"] == "unit.restart_failed"]
    assert ("error", "agent") == (event["log_level"], event["slot"])
    assert "unreachable" in event["error"]
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


@contextmanager
def _answering(status: int | None, body: bytes, *, after: float = 0.0) -> Iterator[str]:
    """An HTTP server answering every POST with ``status`` and ``body`` (``after`` seconds
    late; ``status`` None: hanging up without an answer); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(after)
            if status is None:
                self.close_connection = True
                return
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"error": {"code": "slot.busy", "message": "loading"}}', ": slot.busy: loading"),
        (b'{"detail": "no such slot"}', ": no such slot"),
        (b"{not json", ""),
        (b"plain words", ": plain words"),
        (b'{"detail": "' + b"x" * 2035 + b'"}', ""),  # 2,049 bytes: only 2 KiB are read
    ],
    ids=["hal0-envelope", "detail", "broken-json", "text", "json-past-2kib"],
)
def test_an_api_refusal_is_said_with_what_its_body_says(
    tmp_path: Path, body: bytes, says: str
) -> None:
    """The API's refusal, with hal0's error envelope, a detail or the text it answered; a body
    that looks like JSON but is not (or not within its first 2 KiB, all that is read) adds
    nothing."""
    with _answering(409, body) as url:
        settings = settings_mod.load(
            None,
            {
                "api_url": url,
                "api_env_file": str(tmp_path / "api.env"),
                "restart_fallback": "none",
            },
        )
        request = units.RestartRequest(name="agent", token="agent")
        with capture_logs() as logs:
            assert units.RestartResult.FAILED == units.apply_change(settings, request, active=True)
    (event,) = [e for e in logs if e["event"] == "unit.restart_failed"]
    assert f"hal0 API answered 409 for {url}/api/slots/agent/restart{says}" == event["error"]


def test_an_api_that_takes_the_request_but_does_not_answer_is_said_unconfirmed(
    tmp_path: Path,
) -> None:
    """No answer within api_timeout: the restart may or may not happen, so nothing is stopped
    and a warning says it is unconfirmed."""
    with _answering(200, b"{}", after=1.5) as url:
        settings = settings_mod.load(
            None, {"api_url": url, "api_env_file": str(tmp_path / "e"), "api_timeout": 0.5}
        )
        request = units.RestartRequest(name="agent", token="agent")
        with capture_logs() as logs:
            result = units.apply_change(settings, request, active=True)
    assert units.RestartResult.NO_ANSWER == result
    assert [("unit.restart_unconfirmed", "warning", "agent")] == [
        (e["event"], e["log_level"], e["slot"]) for e in logs
    ]
    assert "0.5" in logs[0]["error"]


def test_an_api_that_hangs_up_fails_the_restart_with_the_reason(tmp_path: Path) -> None:
    """The API closes the connection without an answer: not a restart, a failure that says
    the call failed."""
    with _answering(None, b"") as url:
        settings = settings_mod.load(
            None, {"api_url": url, "api_env_file": str(tmp_path / "e"), "restart_fallback": "none"}
        )
        request = units.RestartRequest(name="agent", token="agent")
        with capture_logs() as logs:
            result = units.apply_change(settings, request, active=True)
    assert units.RestartResult.FAILED == result
    (event,) = [e for e in logs if e["event"] == "unit.restart_failed"]
    assert event["error"].startswith(f"hal0 API call failed at {url}/api/slots/agent/restart: ")


def test_an_accepted_restart_is_said_with_the_way_it_went(tmp_path: Path) -> None:
    with _answering(200, b'{"status": "ok"}') as url:
        settings = settings_mod.load(None, {"api_url": url, "api_env_file": str(tmp_path / "e")})
        request = units.RestartRequest(name="agent", token="agent")
        with capture_logs() as logs:
            assert units.RestartResult.RESTARTED == units.apply_change(
                settings, request, active=True
            )
    assert [("unit.restarted", "info", "agent", units.unit_name("agent"), "hal0-api")] == [
        (e["event"], e["log_level"], e["slot"], e["unit"], e["via"]) for e in logs
    ]
