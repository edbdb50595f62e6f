"""A small local stand-in for hal0-api: ``POST /api/slots/{name}/restart`` (and ``/load``)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hal0_reconciler import lifecycle


def _error(code: str, message: str) -> dict[str, object]:
    """hal0's error envelope: ``{"error": {"code", "message", "details"}}``."""
    return {"error": {"code": code, "message": message, "details": {}}}


class Hal0Api(lifecycle.StartStop):
    """Records every request as (method, path, authorization). ``key``: require this bearer."""

    def __init__(self, *, key: str | None = None, status: int = 200) -> None:
        self.key = key
        self.status = status
        self.requests: list[tuple[str, str, str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                auth = self.headers.get("Authorization")
                api.requests.append(("POST", self.path, auth))
                parts = self.path.strip("/").split("/")
                if (
                    len(parts) != 4
                    or parts[:2] != ["api", "slots"]
                    or parts[3]
                    not in {
                        "restart",
                        "load",
                    }
                ):
                    self._answer(404, _error("slot.not_found", "no such slot"))
                elif api.key is not None and auth != f"Bearer {api.key}":
                    self._answer(401, _error("auth.required", "admin key required"))
                elif api.status != 200:
                    self._answer(api.status, _error("slot.restart_failed", "restart failed"))
                else:
                    self._answer(200, {"name": parts[2], "kind": "local", "status": "loading"})

            def _answer(self, code: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-hal0-api"
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
