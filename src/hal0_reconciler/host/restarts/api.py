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
import ipaddress
import json
import os
import pwd
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hal0_reconciler import _log, boundedread, errors
from hal0_reconciler.host import caller, identity
from hal0_reconciler.host.envfile import read_env_file
from hal0_reconciler.host.restarts import peer
from hal0_reconciler.settings import Settings

if TYPE_CHECKING:  # annotations only: http.client (and its ssl, email) load at the first request
    import http.client

log = _log.get_logger("hal0_reconciler.host.restarts.api")

API_KEY_VARIABLE = "HAL0_ADMIN_KEY"
AGENT = "hal0-reconciler"
ROOT = "root"
TRUST_RETRY_EVERY = 0.005  # seconds between two looks at a connection not accepted yet
TRUST_WITHIN = 2.0  # seconds a connection has to be accepted: then "not trusted yet"
_BODY_MAX = 1 << 20
_UNIT_MAX = 1 << 20


class ApiError(errors.ReconcilerError):
    """hal0's API could not be used; ``str()`` is the human line."""


class ApiMisconfigured(ApiError):
    """``api_url`` names nothing this client can call."""


class ApiRefused(ApiError):
    """Nothing listens on the API's port (hal0-api is down, or still booting)."""


class ApiUntrusted(ApiError):
    """Something listens on the API's port, but it is not hal0's (nothing was sent)."""


class ApiNotTrustedYet(ApiError):
    """Something accepted the TCP handshake, but no server took the connection within
    ``TRUST_WITHIN`` (or the kernel's two tables disagreed): nothing was sent."""


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
    """hal0-api's ``User=``: the setting, else its unit's (drop-ins included, the last one
    wins); ``root`` when the unit sets none or no unit is found (nothing else is guessed: an
    account hal0 does not run as, such as the ``hal0`` user an older release made, is never
    trusted by ``auto``)."""
    if settings.hal0_api_user != "auto":
        return settings.hal0_api_user
    user: str | None = None
    for path in _unit_files(settings):
        try:
            text = boundedread.read_bounded_text(
                path, max_bytes=_UNIT_MAX, missing_ok=True, follow_links=True
            )  # systemd's folders are root's: a link there is root's (systemctl link), followed
        except boundedread.ReadRefused as exc:
            log.warning("api.unit_unreadable", path=exc.path, reason=exc.reason)
            continue
        found = identity.service_user_in(text or "")
        if found is not None:
            user = found  # the later file wins; an empty User= resets it (systemd): root
    return user or ROOT


def _unit_files(settings: Settings) -> list[Path]:
    """hal0-api's unit (the first folder that has it), then its drop-ins (``<unit>.d/*.conf``
    of every folder, by name; a name in an earlier folder hides the later ones)."""
    found: list[Path] = []
    for folder in settings.hal0_api_unit_dirs:
        unit = folder / settings.hal0_api_unit
        if os.path.lexists(unit):
            found.append(unit)
            break
    drop_ins: dict[str, Path] = {}
    for folder in settings.hal0_api_unit_dirs:
        try:
            names = sorted(os.listdir(folder / f"{settings.hal0_api_unit}.d"))
        except OSError:
            continue
        for name in names:
            if name.endswith(".conf"):
                drop_ins.setdefault(name, folder / f"{settings.hal0_api_unit}.d" / name)
    return found + [drop_ins[name] for name in sorted(drop_ins)]


def accepted_uids(settings: Settings) -> frozenset[int]:
    """Root and hal0-api's service user (a name, or a number); never the uid of a caller who
    ran this command through sudo (``caller.delegating_uid``)."""
    user = service_user(settings)
    if user.isdigit():
        uids = {0, int(user)}
    else:
        try:
            uids = {0, pwd.getpwnam(user).pw_uid}
        except KeyError:
            uids = {0}
    delegate = caller.delegating_uid()
    if delegate is not None:
        uids.discard(delegate)
    return frozenset(uids)


def new_request_id() -> str:
    return f"hal0-reconciler-{os.urandom(8).hex()}"


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
        self._stopping = threading.Event()

    def abort(self) -> None:
        """Drop the connection of the call in flight (any thread); later calls fail too."""
        with self._lock:
            self._aborted = True
            conn = self._conn
        self._stopping.set()
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
        sock = self._checked_socket()
        import http.client  # noqa: PLC0415 - at the first request, not at the daemon's start

        conn = http.client.HTTPConnection(
            self._host, self._port, timeout=self._settings.api_timeout
        )
        conn.sock = sock
        with self._lock:
            self._conn = conn
        if self._stopping.is_set():  # abort() came while it connected
            self.close()
            raise ApiAborted("the daemon is stopping")
        return conn, False

    def _addresses(self) -> list[tuple[int, tuple[Any, ...]]]:
        """Every address ``api_url``'s host names, in the resolver's order (a name is said once:
        each address is tried in turn)."""
        try:
            found = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ApiRefused(f"hal0 API host {self._host!r} cannot be resolved: {exc}") from None
        addresses: list[tuple[int, tuple[Any, ...]]] = list(
            dict.fromkeys((int(family), tuple(address)) for family, _t, _p, _c, address in found)
        )
        if not _is_literal(self._host) and self._host not in _NAMES_SAID:
            _NAMES_SAID.add(self._host)
            log.warning(
                "api.url_names_a_host",
                host=self._host,
                addresses=", ".join(str(a[0]) for _f, a in addresses),
                action="each address is tried in turn, and one whose listener is not trusted "
                "gets nothing; set api_url to hal0-api's literal address (127.0.0.1) to skip "
                "the others",
            )
        return addresses

    def _checked_socket(self) -> socket.socket:
        """A connection to the first address of ``api_url`` whose other end is trusted; an
        address that refuses, or whose listener is not trusted, is skipped for the next one.
        Raises the most telling failure when none is left."""
        failures: list[ApiError] = []
        addresses = self._addresses()
        for number, (family, address) in enumerate(addresses, start=1):
            where = _where(address)
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(self._settings.api_timeout)
                self._connect(sock, address, where)
                self._check_peer(sock, where, last=number == len(addresses))
            except (ApiRefused, ApiNoAnswer, ApiUntrusted, ApiNotTrustedYet) as exc:
                sock.close()
                failures.append(exc)
                continue
            except BaseException:
                sock.close()
                raise
            return sock
        for kind in (ApiUntrusted, ApiNotTrustedYet, ApiNoAnswer):
            for failure in failures:
                if isinstance(failure, kind):
                    raise failure
        raise failures[-1] if failures else ApiRefused(f"{self._host!r} names no address")

    def _connect(self, sock: socket.socket, address: tuple[Any, ...], where: str) -> None:
        try:
            sock.connect(address)
        except ConnectionRefusedError:
            raise ApiRefused(f"hal0 API refused the connection at {where}") from None
        except TimeoutError:
            raise ApiNoAnswer(f"hal0 API did not accept a connection at {where}") from None
        except OSError as exc:
            raise ApiRefused(f"hal0 API unreachable at {where}: {exc}") from None

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
        import http.client  # noqa: PLC0415 - loaded once, by the first request

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

    def _check_peer(self, sock: socket.socket, where: str, *, last: bool = True) -> None:
        """Who took the connection, from the kernel's tables (``peer``), asked every
        ``TRUST_RETRY_EVERY`` while it is not accepted yet, up to ``TRUST_WITHIN``."""
        deadline = time.monotonic() + TRUST_WITHIN
        while True:
            verdict = peer.check(sock, self._accepted, proc_net=self._proc_net)
            if verdict.trust is not peer.Trust.NOT_YET or time.monotonic() >= deadline:
                break
            if self._stopping.wait(TRUST_RETRY_EVERY):
                raise ApiAborted("the daemon is stopping")
        if verdict.trust is peer.Trust.TRUSTED:
            return
        if verdict.trust is peer.Trust.NOT_YET:
            raise ApiNotTrustedYet(
                f"hal0-api not trusted yet: the connection at {where} was not taken within "
                f"{TRUST_WITHIN:g}s ({verdict.reason}): nothing sent"
            )
        log.error(
            "api.untrusted_listener",
            address=where,
            uid=verdict.uid,
            inode=verdict.inode,
            reason=verdict.reason,
            accepted=sorted(self._accepted),
            action="nothing was sent (no key, no request); "
            + ("hal0's API counts as unavailable" if last else "the next address is tried"),
        )
        raise ApiUntrusted(
            f"the listener at {where} is not root's nor hal0-api's user's ({verdict.reason}): "
            "nothing sent"
        )


_NAMES_SAID: set[str] = set()


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _where(address: tuple[Any, ...]) -> str:
    host = str(address[0])
    return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"


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
