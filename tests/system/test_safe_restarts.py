"""Safe restarts under the real systemd 252 (Debian 12 in nspawn): hal0's API unit absent and
started late stops nothing; a busy slot is restarted only once the stand-in hal0-api says it is
idle; the journal at warning shows exactly the restart the stand-in failed.

One container for the module; the stand-in hal0-api is steered by files in /run/fake-hal0
(``busy/<slot>``: counters say 1 request in flight; ``fail/<slot>``: the restart fails the way
hal0's does, 500 ``slot.spawn_failed`` and the slot in ``error``). Timings are scaled down by
settings (idle_recheck, idle_confirm, api_wait_bound).
"""

from __future__ import annotations

import pytest

from helpers import nspawn
from system.test_in_systemd import (
    SLOT_UNIT,
    SLOTS,
    UNIT,
    amd_settings,
    configure,
    device_of,
    invocation,
    journal_entries,
    show,
    slot_text,
    status_json,
    wait_until,
)

pytestmark = pytest.mark.timeout(600)

STAND_IN = r'''#!/usr/bin/python3
"""A stand-in for hal0-api: /api/health, /state (active units are ready, a failed restart
leaves error), /api/slots/metrics (busy/<name> present: one request in flight), a synchronous
POST /restart that restarts the unit, or fails as hal0 does when fail/<name> is present."""
import http.server, json, os, subprocess, urllib.parse

RUN = "/run/fake-hal0"
ERRORS = {}

def active(name):
    unit = f"hal0-slot@{name}.service"
    return subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False).returncode == 0

def names():
    return ["chat", "voice", "coder"]

class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def state(self, name):
        if name in ERRORS:
            return "error"
        return "ready" if active(name) else "offline"

    def do_GET(self):
        parts = self.path.split("?")[0].split("/")
        if self.path == "/api/health":
            return self.answer(200, {"status": "ok"})
        if parts[1:4] == ["api", "slots", "metrics"]:
            rows = {}
            for n in names():
                busy = int(os.path.exists(f"{RUN}/busy/{n}"))
                rows[n] = {"name": n, "requests_processing": busy, "requests_deferred": 0}
            return self.answer(200, rows)
        if len(parts) >= 4 and parts[1:3] == ["api", "slots"]:
            name = urllib.parse.unquote(parts[3])
            meta = {"message": ERRORS.get(name, "")}
            return self.answer(200, {"name": name, "state": self.state(name), "metadata": meta})
        return self.answer(404, {"error": {"code": "not_found", "message": self.path}})

    def do_POST(self):
        parts = self.path.split("/")
        if len(parts) == 5 and parts[1:3] == ["api", "slots"] and parts[4] == "restart":
            name = urllib.parse.unquote(parts[3])
            with open("/run/fake-hal0-api.log", "a") as log:
                log.write(name + "\n")
            if os.path.exists(f"{RUN}/fail/{name}"):
                ERRORS[name] = "llama-server exited with status 1 (out of memory)"
                return self.answer(500, {"error": {"code": "slot.spawn_failed",
                                                   "message": ERRORS[name], "details": {}}})
            ERRORS.pop(name, None)
            subprocess.run(["systemctl", "restart", f"hal0-slot@{name}.service"], check=False)
            return self.answer(200, {"name": name, "state": "ready"})
        return self.answer(404, {"error": {"code": "not_found", "message": self.path}})

http.server.ThreadingHTTPServer(("127.0.0.1", 8080), Handler).serve_forever()
'''
API_UNIT = """[Unit]
Description=stand-in for hal0-api

[Service]
ExecStartPre=/bin/mkdir -p /run/fake-hal0/busy /run/fake-hal0/fail
ExecStart=/usr/local/bin/fake-hal0-api
"""
FAST = {"idle_recheck": 0.2, "idle_confirm": 0.0, "restart_min_interval": 0.0}


def _listening(box: nspawn.Container) -> bool:
    probe = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8080))\""
    return box.run(probe, check=False).returncode == 0


def _restarted(box: nspawn.Container) -> list[str]:
    return box.run("cat /run/fake-hal0-api.log", check=False).stdout.split()


def _stand_in(box: nspawn.Container, *, start: bool) -> None:
    box.write("/usr/local/bin/fake-hal0-api", STAND_IN, mode="0755")
    box.write("/etc/systemd/system/hal0-slot@.service", SLOT_UNIT)
    box.write("/etc/systemd/system/hal0-api.service", API_UNIT)
    box.run("rm -f /run/fake-hal0-api.log; mkdir -p /run/fake-hal0/busy /run/fake-hal0/fail")
    box.run("systemctl daemon-reload")
    if start:
        box.run("systemctl start hal0-api")
        wait_until("the stand-in to listen", lambda: _listening(box))


def test_hal0_api_absent_then_started_late_stops_nothing(box: nspawn.Container) -> None:
    """No hal0-api unit at all, then one that starts after the relabel: the slot is restarted
    through it once it answers; no slot unit is stopped (even with the stop fallback opted in,
    within api_wait_bound), and the reconciler logs no stop."""
    _stand_in(box, start=False)
    box.run("systemctl stop hal0-api; rm -f /etc/systemd/system/hal0-api.service")
    box.run("systemctl daemon-reload && systemctl start hal0-slot@coder")
    configure(box, amd_settings(**FAST, restart_fallback="stop", api_wait_bound=120.0))
    since = invocation(box)
    before = show(box, "hal0-slot@coder")["InvocationID"]
    box.write(f"{SLOTS}/coder.toml", slot_text("coder"))
    wait_until("the relabel", lambda: device_of(box, "coder") == "gpu-rocm")
    wait_until(
        "the restart waiting for hal0-api",
        lambda: "coder" in ((status_json(box).get("restarts") or {}).get("waiting") or {}),
    )
    unit = show(box, "hal0-slot@coder")
    assert ("active", before) == (unit["ActiveState"], unit["InvocationID"]), "stopped"
    box.write("/etc/systemd/system/hal0-api.service", API_UNIT)
    box.run("systemctl daemon-reload && systemctl start hal0-api")
    wait_until(
        "hal0-slot@coder restarted through the stand-in",
        lambda: show(box, "hal0-slot@coder")["InvocationID"] not in {before, ""},
        60,
    )
    assert ["coder"] == _restarted(box)
    logged = journal_entries(box, f"-u {UNIT} _SYSTEMD_INVOCATION_ID={since}")
    events = {e.get("EVENT") for e in logged}
    assert "unit.stopped_needs_reload" not in events
    assert "active" == show(box, "hal0-slot@coder")["ActiveState"]


def test_a_busy_slot_is_restarted_only_once_the_stand_in_says_it_is_idle(
    box: nspawn.Container,
) -> None:
    """The relabel is written at once; while the stand-in counts a request in flight the
    restart waits (status says busy); once it reports idle the slot is restarted."""
    _stand_in(box, start=True)
    box.run("systemctl start hal0-slot@chat && touch /run/fake-hal0/busy/chat")
    configure(box, amd_settings(**FAST))
    box.write(f"{SLOTS}/chat.toml", slot_text("chat"))
    wait_until("the relabel", lambda: device_of(box, "chat") == "gpu-rocm")
    waits = wait_until(
        "status saying the restart waits while busy",
        lambda: ((status_json(box).get("restarts") or {}).get("waiting") or {}).get("chat"),
    )
    assert str(waits).startswith("busy ("), waits
    assert "chat" not in _restarted(box)
    box.run("rm /run/fake-hal0/busy/chat")
    wait_until("the restart once idle", lambda: "chat" in _restarted(box), 30)
    assert ["chat"] == _restarted(box)


def test_the_journal_at_warning_shows_exactly_the_failed_restart(box: nspawn.Container) -> None:
    """Two relabelled slots: the stand-in fails voice's restart and does chat's. Among the
    restart events at warning and above, there is voice's failure with hal0's message, and
    nothing about chat."""
    _stand_in(box, start=True)
    box.run("systemctl start hal0-slot@chat hal0-slot@voice && touch /run/fake-hal0/fail/voice")
    configure(box, amd_settings(**FAST))
    since = invocation(box)
    box.write(f"{SLOTS}/chat.toml", slot_text("chat"))
    box.write(f"{SLOTS}/voice.toml", slot_text("voice"))
    wait_until(
        "both restarts asked for",
        lambda: {"chat", "voice"} <= set(_restarted(box)),
        30,
    )
    wait_until(
        "the failed restart in status",
        lambda: "voice" in ((status_json(box).get("restarts") or {}).get("failed") or {}),
    )
    warned = journal_entries(box, f"-u {UNIT} -p warning _SYSTEMD_INVOCATION_ID={since}")
    restarts = [e for e in warned if str(e.get("EVENT", "")).startswith("unit.")]
    assert [("unit.restart_failed", "voice")] == [(e["EVENT"], e.get("SLOT")) for e in restarts]
    assert "out of memory" in str(restarts[0].get("ERROR")), restarts[0]
