"""A small HTTP client for hal0's API that talks only to hal0.

Every call connects, then checks whom it reached (``peer.peer_of``: the uid of the socket at
the other end, from the kernel's table) before a single byte is sent: root or hal0-api's
service user, else nothing is sent (no admin key, no request) and the API counts as
unavailable. Each request carries ``X-hal0-Agent: hal0-reconciler`` and an ``X-Request-ID`` so
hal0's activity log names us. One call at a time per client; ``abort()`` (from another thread)
drops the connection of the call in flight.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import pwd
import socket
import threading
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hal0_reconciler import _log, boundedread, errors
from hal0_reconciler.host import peer
from hal0_reconciler.host.envfile import read_env_file
from hal0_reconciler.settings import Settings

log = _log.get_logger("hal0_reconciler.host.hal0_api")

API_KEY_VARIABLE = "HAL0_ADMIN_KEY"
AGENT = "hal0-reconciler"
DEFAULT_SERVICE_USER = "hal0"
_BODY_MAX = 1 << 20
_UNIT_MAX = 1 << 20
UNIT_DIRS = (
    Path("/etc/systemd/system"),
    Path("/run/systemd/system"),
    Path("/usr/lib/systemd/system"),
    Path("/lib/systemd/system"),
)


class ApiError(errors.ReconcilerError):
    """hal0's API could not be used; ``str()`` is the human line."""


class ApiMisconfigured(ApiError):
    """``api_url`` names nothing this client can call."""


class ApiRefused(ApiError):
    """Nothing listens on the API's port (hal0-api is down, or still booting)."""


class ApiUntrusted(ApiError):
    """Something listens on the API's port, but it is not hal0's (nothing was sent)."""


class ApiNoAnswer(ApiError):
    """The API took the request but gave no answer within the read timeout."""


class ApiAborted(ApiError):
    """We dropped the connection ourselves (the daemon is stopping)."""


class _StaleConnection(Exception):
    """A kept-alive connection hal0 had closed: the GET is sent again on a new one."""


class ApiHttpError(ApiError):
    """hal0 answered 4xx/5xx: ``status``, its error ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(
            f"hal0 API answered {status}"
            + (f" {code}" if code else "")
            + (f": {message}" if message else "")
        )
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] = field(default_factory=dict)


def service_user(settings: Settings) -> str:
    """hal0-api's ``User=``: the setting, else its unit file's, else ``hal0``."""
    if settings.hal0_api_user != "auto":
        return settings.hal0_api_user
    for folder in settings.hal0_api_unit_dirs:
        try:
            text = boundedread.read_bounded_text(
                folder / settings.hal0_api_unit, max_bytes=_UNIT_MAX, missing_ok=True
            )
        except boundedread.ReadRefused as exc:
            log.warning("api.unit_unreadable", path=exc.path, reason=exc.reason)
            continue
        if text is None:
            continue
        user = ""
        for raw in text.splitlines():
            key, _, value = raw.strip().partition("=")
            if key.strip() == "User":
                user = value.strip()
        return user or DEFAULT_SERVICE_USER  # a unit without User= runs as root: root is in
    return DEFAULT_SERVICE_USER


def accepted_uids(settings: Settings) -> frozenset[int]:
    """Root and hal0-api's service user (a name, or a number)."""
    user = service_user(settings)
    if user.isdigit():
        return frozenset({0, int(user)})
    try:
        return frozenset({0, pwd.getpwnam(user).pw_uid})
    except KeyError:
        return frozenset({0})


def new_request_id() -> str:
    return f"hal0-reconciler-{uuid.uuid4().hex[:16]}"


class Hal0Client:
    """hal0's API at ``settings.api_url`` (http only), checked before each request."""

    def __init__(self, settings: Settings, *, proc_net: Path = peer.PROC_NET) -> None:
        try:
            parsed = urllib.parse.urlsplit(settings.api_url)
            port = parsed.port or 80
        except ValueError as exc:
            raise ApiMisconfigured(f"bad api_url {settings.api_url!r}: {exc}") from None
        if parsed.scheme != "http" or not parsed.hostname:
            raise ApiMisconfigured(
                f"bad api_url {settings.api_url!r}: only http://host:port is supported"
            )
        self._host = parsed.hostname
        self._port = port
        self._base = parsed.path.rstrip("/")
        self._settings = settings
        self._proc_net = proc_net
        self._accepted = accepted_uids(settings)
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = False

    def abort(self) -> None:
        """Drop the connection of the call in flight (any thread); later calls fail too."""
        with self._lock:
            self._aborted = True
            conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def get(self, path: str) -> Answer:
        """A GET on the connection already checked (a new one when hal0 closed it)."""
        try:
            return self._call("GET", path, timeout=self._settings.api_timeout, reuse=True)
        except _StaleConnection:
            return self._call("GET", path, timeout=self._settings.api_timeout, reuse=False)

    def post(self, path: str, *, timeout: float, request_id: str | None = None) -> Answer:
        """A POST on the connection just checked (or a new one); never sent twice."""
        try:
            return self._call("POST", path, timeout=timeout, request_id=request_id, reuse=True)
        except _StaleConnection:
            raise ApiError("hal0 API closed the connection before answering") from None
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connected(self, *, reuse: bool) -> tuple[http.client.HTTPConnection, bool]:
        """The open, checked connection (``True``: it was reused), else a new one, checked."""
        with self._lock:
            if self._aborted:
                raise ApiAborted("the daemon is stopping")
            conn = self._conn
        if reuse and conn is not None and conn.sock is not None:
            return conn, True
        self.close()
        where = f"{self._host}:{self._port}"
        conn = http.client.HTTPConnection(
            self._host, self._port, timeout=self._settings.api_timeout
        )
        with self._lock:
            self._conn = conn
        try:
            conn.connect()
        except ConnectionRefusedError:
            raise ApiRefused(f"hal0 API refused the connection at {where}") from None
        except TimeoutError:
            raise ApiNoAnswer(f"hal0 API did not accept a connection at {where}") from None
        except OSError as exc:
            raise ApiRefused(f"hal0 API unreachable at {where}: {exc}") from None
        assert conn.sock is not None  # noqa: S101 - connect() made it
        self._check_peer(conn.sock, where)
        return conn, False

    def _headers(self, request_id: str | None) -> dict[str, str]:
        headers = {
            "Accept": "application/json",
            "X-hal0-Agent": AGENT,
            "X-Request-ID": request_id or new_request_id(),
        }
        try:
            key = read_env_file(self._settings.api_env_file).get(API_KEY_VARIABLE, "")
        except (OSError, UnicodeDecodeError) as exc:
            raise ApiMisconfigured(f"cannot read {self._settings.api_env_file}: {exc}") from None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _call(
        self,
        method: str,
        path: str,
        *,
        timeout: float,
        reuse: bool,
        request_id: str | None = None,
    ) -> Answer:
        where = f"{self._host}:{self._port}"
        try:
            conn, reused = self._connected(reuse=reuse)
        except ApiError:
            self.close()
            raise
        try:
            assert conn.sock is not None  # noqa: S101 - connected
            conn.sock.settimeout(timeout)
            body = b"" if method == "POST" else None
            conn.request(method, self._base + path, body=body, headers=self._headers(request_id))
            response = conn.getresponse()
            data = response.read(_BODY_MAX)
            if response.will_close:
                self.close()
        except ApiError:
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise ApiNoAnswer(f"hal0 API gave no answer within {timeout:g}s") from None
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            with self._lock:
                aborted = self._aborted
            if aborted:
                raise ApiAborted("the connection was dropped: the daemon is stopping") from None
            if reused and isinstance(exc, http.client.RemoteDisconnected | ConnectionError):
                raise _StaleConnection from None  # hal0 closed a kept-alive connection
            raise ApiError(f"hal0 API call failed at {where}: {exc}") from None
        return _answer(response.status, data)

    def _check_peer(self, sock: socket.socket, where: str) -> None:
        try:
            owner = peer.peer_of(sock, proc_net=self._proc_net)
        except (peer.PeerUnknown, boundedread.ReadRefused) as exc:
            raise ApiUntrusted(
                f"cannot tell who listens at {where} ({exc}): nothing sent"
            ) from None
        if owner.uid not in self._accepted:
            log.error(
                "api.untrusted_listener",
                address=where,
                uid=owner.uid,
                inode=owner.inode,
                accepted=sorted(self._accepted),
                action="nothing was sent (no key, no request); hal0's API counts as unavailable",
            )
            raise ApiUntrusted(
                f"the listener at {where} belongs to uid {owner.uid}, not to root or hal0-api's "
                "user: nothing sent"
            )


def _answer(status: int, data: bytes) -> Answer:
    try:
        doc = json.loads(data) if data else {}
    except ValueError:
        doc = {}
    body = doc if isinstance(doc, dict) else {}
    if status >= 400:
        error = body.get("error")
        code = message = ""
        if isinstance(error, dict):
            code = str(error.get("code") or "")[:100]
            message = str(error.get("message") or "")[:300]
        elif isinstance(body.get("detail"), str):
            message = str(body["detail"])[:300]
        raise ApiHttpError(status, code, message)
    return Answer(status, body)
