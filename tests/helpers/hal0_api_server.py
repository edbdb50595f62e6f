"""A local stand-in for hal0-api, for what the real one cannot show here (timings scaled down).

The real releases run in ``test_hal0_api_releases.py``; without a model server they only show
slots ``offline`` or in ``error``. This stand-in shows a slot really serving (live counters), a
slow load and each failure, and answers in the newest release's shapes (same fields, status
codes and error envelope; ``test_hal0_api_stand_in.py`` compares them with the real server):

- ``POST /api/slots/{name}/restart`` (and ``/load``): synchronous like hal0's handler, it walks
  the slot through ``unloading → offline → starting → warming`` over ``restart_for`` seconds and
  ends as the slot's ``outcome`` says: ``ready`` (200), ``warming`` (200, readiness timed out),
  ``offline`` (200, no default model), ``error`` (500 ``slot.spawn_failed``, state error with a
  ``metadata.message``), ``sanity`` (500 ``slot.output_sanity_failed``, unit stopped, state
  error), ``504`` (``slot.terminate_timeout``, state error).
- ``GET /api/slots/{name}/state`` and its SSE ``/state/stream``; ``GET /api/slots/{name}`` with
  ``metadata.message``; ``GET /api/slots/metrics`` with live counters, or without
  ``requests_deferred`` (a llama-server without ``--metrics``: ``requests_processing`` keeps 0).
- ``GET /api/health``: 200 ``{"status", "name", "version"}``, except that while ``boot_for``
  runs the port is bound but not listening, so every connection is refused, as hal0-api does
  during its boot.
- ``key``: every route but ``/api/health`` needs ``Authorization: Bearer <key>`` (else 401
  ``auth.required``, as hal0 with require_auth on).
- ``configured``: the slot names hal0 has files for (others: 404 ``slot.not_found``); by
  default every name asked for is a configured slot, ready and idle.

``requests`` lists the lifecycle POSTs as (method, path, authorization); ``calls`` every request
with its headers; ``at_once`` the slots being restarted at the start of each restart (that one
included, a slot restarted twice at once named twice).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from hal0_reconciler import lifecycle

SANITY_MESSAGE = (
    "output-sanity probe failed (incoherent_output): 'The capital of France is' → expected "
    "'Paris', got ')))))))'"
)


NO_MODEL_MESSAGE = "no default model — pick one from the dropdown"


def _not_found(name: str) -> dict[str, object]:
    return {
        "error": {
            "code": "slot.not_found",
            "message": f"slot {name!r} is not configured",
            "details": {"slot": name},
        }
    }


def _error(code: str, message: str) -> dict[str, object]:
    """hal0's error envelope: ``{"error": {"code", "message", "details"}}``."""
    return {"error": {"code": code, "message": message, "details": {}}}


@dataclass
class Slot:
    """One simulated slot. ``deferred=None``: hal0 has no counters for it."""

    state: str = "ready"
    processing: int = 0
    deferred: int | None = 0
    outcome: str = "ready"
    restart_for: float = 0.0
    message: str = ""
    port: int = 8081
    model_id: str | None = "m"  # None: no [model].default (a restart leaves it offline)

    def row(self, name: str) -> dict[str, object]:
        row: dict[str, object] = {"name": name, "mem_rss_mb": 1.0, "uptime_seconds": 5}
        row["requests_processing"] = self.processing if self.deferred is not None else 0
        if self.deferred is not None:
            row["requests_deferred"] = self.deferred
        return row


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    headers: dict[str, str]


class Hal0Api(lifecycle.StartStop):
    """hal0-api on loopback. ``status``: answer every lifecycle POST with this error instead."""

    def __init__(
        self,
        *,
        key: str | None = None,
        status: int = 200,
        boot_for: float = 0.0,
        version: str = "1.7.0",
        configured: tuple[str, ...] | None = None,
    ) -> None:
        self.key = key
        self.version = version
        self.configured = configured
        self.status = status
        self.boot_for = boot_for
        self.requests: list[tuple[str, str, str | None]] = []
        self.requested_at: list[float] = []  # time.monotonic() of each of ``requests``
        self.calls: list[Call] = []
        self.slots: dict[str, Slot] = {}
        self.restarting: Counter[str] = Counter()  # slots whose restart is in progress now
        self.at_once: list[tuple[str, ...]] = []
        self.lock = threading.RLock()
        self.listening = threading.Event()
        self._stopping = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as uvicorn: no delayed-ACK stall on kept-alive

            def do_GET(self) -> None:
                api._record(self)
                parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]
                if parts == ["api", "health"]:
                    self._answer(200, {"status": "ok", "name": "hal0", "version": api.version})
                elif not api._authorized(self):
                    self._answer(401, _error("auth.required", "authentication required"))
                elif parts == ["api", "slots", "metrics"]:
                    with api.lock:
                        rows = {n: s.row(n) for n, s in api.slots.items()}
                    self._answer(200, rows)
                elif (
                    len(parts) in {3, 4, 5}
                    and parts[:2] == ["api", "slots"]
                    and api.unknown(parts[2])
                ):
                    self._answer(404, _not_found(parts[2]))
                elif len(parts) == 4 and parts[:2] == ["api", "slots"] and parts[3] == "state":
                    self._answer(200, api._state_body(parts[2]))
                elif len(parts) == 5 and parts[3:] == ["state", "stream"]:
                    self._stream(parts[2])
                elif len(parts) == 3 and parts[:2] == ["api", "slots"]:
                    self._answer(200, api._slot_body(parts[2]))
                else:
                    self._answer(404, _error("system.http_404", "Not Found"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                api._record(self)
                auth = self.headers.get("Authorization")
                parts = [unquote(p) for p in self.path.strip("/").split("/")]
                lifecycle_call = (
                    len(parts) == 4
                    and parts[:2] == ["api", "slots"]
                    and parts[3] in {"restart", "load"}
                )
                if lifecycle_call:
                    with api.lock:
                        api.requests.append(("POST", self.path, auth))
                        api.requested_at.append(time.monotonic())
                if not api._authorized(self):
                    self._answer(401, _error("auth.required", "authentication required"))
                elif not lifecycle_call:
                    self._answer(404, _error("system.http_404", "Not Found"))
                elif api.unknown(parts[2]):
                    self._answer(404, _not_found(parts[2]))
                elif api.status != 200:
                    self._answer(api.status, _error("slot.restart_failed", "restart failed"))
                else:
                    code, body = api._restart(parts[2])
                    self._answer(code, body)

            def _stream(self, name: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                last = None
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not api._stopping.is_set():
                    body = api._state_body(name)
                    if body["state"] != last:
                        last = body["state"]
                        frame = f"event: state\ndata: {json.dumps(body)}\n\n".encode()
                        try:
                            self.wfile.write(frame)
                            self.wfile.flush()
                        except OSError:
                            return
                    api._stopping.wait(0.02)
                self.close_connection = True

            def _answer(self, code: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()  # kept alive, as uvicorn does
                with contextlib.suppress(OSError):  # the client went away (a dropped restart)
                    self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.server_bind()  # the port is ours, but refuses connections until it listens
        self._thread = threading.Thread(target=self._serve, name="test-hal0-api")

    # -- the simulated hal0 ---------------------------------------------------------------------
    def slot(self, name: str, **fields: object) -> Slot:
        """The slot called ``name`` (made ready and idle when new); ``fields`` set on it."""
        with self.lock:
            slot = self.slots.setdefault(name, Slot())
            for key, value in fields.items():
                setattr(slot, key, value)
            return slot

    def unknown(self, name: str) -> bool:
        """hal0 has no file for this slot (only when ``configured`` is given)."""
        return self.configured is not None and name not in self.configured

    def _authorized(self, handler: BaseHTTPRequestHandler) -> bool:
        return self.key is None or handler.headers.get("Authorization") == f"Bearer {self.key}"

    def _record(self, handler: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.calls.append(Call(handler.command, handler.path, dict(handler.headers.items())))

    def _state_body(self, name: str) -> dict[str, object]:
        with self.lock:
            slot = self.slots.setdefault(name, Slot())
            return {
                "name": name,
                "state": slot.state,
                "port": slot.port,
                "model_id": slot.model_id,
                "backend": "rocm",
            }

    def _slot_body(self, name: str) -> dict[str, object]:
        """``GET /api/slots/{name}`` and a lifecycle call's 200: the fields hal0 1.7.0 answers
        (the config and container fields of ``GET`` left out)."""
        body = self._state_body(name)
        with self.lock:
            slot = self.slots[name]
            message, state = slot.message, slot.state
        backend = str(body["backend"])
        metadata = {"updated_at": time.time(), "message": message, "backend": backend}
        return body | {
            "metadata": metadata | {"provider": "llama-server"},
            "last_used_at": None,
            "id": 1,
            "kind": "local",
            "status": state,
            "provider": "llama-server",
            "models": [body["model_id"]] if body["model_id"] else [],
        }

    def _set(self, name: str, state: str, message: str = "") -> None:
        with self.lock:
            slot = self.slots.setdefault(name, Slot())
            slot.state = state
            slot.message = message

    def _restart(self, name: str) -> tuple[int, dict[str, object]]:
        """hal0's synchronous restart, recorded in ``restarting`` and ``at_once``."""
        with self.lock:
            self.restarting[name] += 1
            self.at_once.append(tuple(sorted(self.restarting.elements())))
        try:
            return self._restart_one(name)
        finally:
            with self.lock:
                self.restarting[name] -= 1
                if self.restarting[name] <= 0:
                    del self.restarting[name]

    def _restart_one(self, name: str) -> tuple[int, dict[str, object]]:
        """Unload, load, readiness, sanity; then the outcome."""
        with self.lock:
            slot = self.slots.setdefault(name, Slot())
            outcome, duration = slot.outcome, slot.restart_for
        if outcome == "504":
            self._set(name, "unloading")
            self._stopping.wait(duration)
            self._set(name, "error", "stop of hal0-slot@x.service timed out after 30s")
            return 504, _error("slot.terminate_timeout", "slot unit did not stop within 30s")
        for state in ("unloading", "offline", "starting", "warming"):
            self._set(name, state)
            self._stopping.wait(duration / 4)
        if outcome == "error":
            self._set(name, "error", "llama-server exited with status 1 (out of memory)")
            return 500, _error("slot.spawn_failed", "llama-server exited with status 1")
        if outcome == "sanity":
            self._set(name, "error", SANITY_MESSAGE)
            return 500, _error("slot.output_sanity_failed", SANITY_MESSAGE)
        final = outcome if outcome in {"ready", "warming", "offline", "idle"} else "ready"
        self._set(name, final, NO_MODEL_MESSAGE if final == "offline" else "")
        return 200, self._slot_body(name)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _serve(self) -> None:
        if not self.listening.is_set():
            if self._stopping.wait(self.boot_for):
                return
            self._server.server_activate()
            self.listening.set()
        self._server.serve_forever(poll_interval=0.05)

    def start(self) -> None:
        if self.boot_for <= 0:  # listening before the first client can try
            self._server.server_activate()
            self.listening.set()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self.listening.is_set():
            self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
