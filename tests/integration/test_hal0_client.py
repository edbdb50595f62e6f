"""hal0's API client over real HTTP on loopback: what it refuses to call, how it reuses a
kept-alive connection, and what it sends."""

from __future__ import annotations

import contextlib
import gc
import socket
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import api as hal0_api

pytestmark = pytest.mark.timeout(30)


def _settings(tmp_path: Path, url: str, **extra: object) -> settings_mod.Settings:
    (tmp_path / "api.env").write_text("HAL0_ADMIN_KEY=k\n")
    return settings_mod.load(
        None,
        {
            "api_url": url,
            "api_env_file": str(tmp_path / "api.env"),
            "hal0_api_unit_dirs": [str(tmp_path / "none")],
            **extra,
        },
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:8080",
        "ftp://127.0.0.1:8080",
        "unix:///run/hal0.sock",
        "http://",
        "127.0.0.1:8080",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:port",
    ],
)
def test_only_http_to_a_host_is_called(tmp_path: Path, url: str) -> None:
    with pytest.raises(hal0_api.ApiMisconfigured, match="bad api_url"):
        hal0_api.Hal0Client(_settings(tmp_path, url))


@contextmanager
def keep_alive_server(
    *,
    close_after: int,
    answer: bool = True,
    status: bytes = b"200 OK",
    body: bytes | None = None,
    accepted: list[int] | None = None,
    headers: bytes = b"",
) -> Iterator[tuple[int, list[bytes]]]:
    """Root's HTTP/1.1 server that answers ``close_after`` requests on a connection (keeping it
    alive, as it says), then closes it without a word; yields its port and each request
    (``accepted``: one item per connection it accepted)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(10)
    seen: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            if accepted is not None:
                accepted.append(1)
            with conn:
                conn.settimeout(5)
                for n in range(close_after):
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    seen.append(data)
                    if not answer:
                        break  # read, then closed without a word
                    text = body if body is not None else b'{"n": %d}' % len(seen)
                    conn.sendall(
                        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n%s"
                        b"Content-Length: %d\r\n\r\n%s" % (status, headers, len(text), text)
                    )
                    del n

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield srv.getsockname()[1], seen
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)  # wakes the accept
        srv.close()
        thread.join(10)


def test_a_get_on_a_kept_alive_connection_hal0_closed_is_sent_again(tmp_path: Path) -> None:
    """hal0 closed the idle kept-alive connection: the GET goes out again on a new one and
    its answer is returned (never None)."""
    with keep_alive_server(close_after=1) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        first = client.get("/api/health")
        second = client.get("/api/slots/metrics")
        client.close()
    assert {"n": 1} == first.body
    assert isinstance(second, hal0_api.Answer)
    assert {"n": 2} == second.body
    assert [b"GET /api/health ", b"GET /api/slots/metrics "] == [
        s[: len(s.split(b"HTTP")[0])] for s in seen
    ]


def test_a_kept_alive_connection_is_reused(tmp_path: Path) -> None:
    with keep_alive_server(close_after=3) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        bodies = [client.get(f"/api/x{n}").body for n in range(3)]
        client.close()
    assert [{"n": 1}, {"n": 2}, {"n": 3}] == bodies
    assert 3 == len(seen)


def test_a_post_on_a_connection_hal0_closed_is_never_sent_twice(tmp_path: Path) -> None:
    with keep_alive_server(close_after=1) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        client.get("/api/health")
        with pytest.raises(hal0_api.ApiError, match="closed the connection before answering"):
            client.post("/api/slots/a/restart", timeout=5)
    assert [b"GET"] == [s.split(b" ")[0] for s in seen]  # the POST went to the closed one


def test_every_request_names_the_agent_and_carries_the_key(tmp_path: Path) -> None:
    with keep_alive_server(close_after=1) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}/base/"))
        client.get("/api/health")
        client.close()
    request = seen[0].decode()
    assert request.startswith("GET /base/api/health HTTP/1.1")
    assert "X-hal0-Agent: hal0-reconciler" in request
    assert "Authorization: Bearer k" in request
    assert "X-Request-ID: hal0-reconciler-" in request


def test_nothing_listening_is_refused(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
    with pytest.raises(hal0_api.ApiRefused, match="refused the connection"):
        client.get("/api/health")


def test_an_aborted_client_sends_nothing(tmp_path: Path) -> None:
    with keep_alive_server(close_after=1) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        client.abort()
        with pytest.raises(hal0_api.ApiAborted):
            client.get("/api/health")
    assert [] == seen


def test_a_url_without_a_port_means_port_80(tmp_path: Path) -> None:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 80)) == 0:
            pytest.skip("something listens on port 80 here")
    client = hal0_api.Hal0Client(_settings(tmp_path, "http://127.0.0.1/"))
    with pytest.raises(hal0_api.ApiRefused, match=r"at 127\.0\.0\.1:80$"):
        client.get("/api/health")


def test_a_new_connection_closed_without_an_answer_is_an_error_sent_once(tmp_path: Path) -> None:
    """Only a kept-alive connection is asked again: on a new one, hal0 closing without an
    answer is an API error, and the request went out once."""
    with keep_alive_server(close_after=1, answer=False) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        with pytest.raises(hal0_api.ApiError, match=r"hal0 API call failed at 127\.0\.0\.1"):
            client.get("/api/health")
    assert 1 == len(seen)


@pytest.mark.parametrize(
    ("status", "body", "line"),
    [
        (
            b"400 Bad Request",
            b'{"error": {"code": "slot.bad", "message": "no"}}',
            "400 slot.bad: no",
        ),
        (b"404 Not Found", b'{"detail": "Not Found"}', "404: Not Found"),
        (b"500 Internal Server Error", b"not json", "500"),
    ],
)
def test_an_error_answer_is_an_http_error_with_hals_words(
    tmp_path: Path, status: bytes, body: bytes, line: str
) -> None:
    with keep_alive_server(close_after=1, status=status, body=body) as (port, _seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        with pytest.raises(hal0_api.ApiHttpError) as caught:
            client.get("/api/slots/x")
        client.close()
    assert f"hal0 API answered {line}" == str(caught.value)
    assert int(status[:3]) == caught.value.status
    assert line.partition(": ")[2] == caught.value.message


def test_a_399_answer_is_an_answer(tmp_path: Path) -> None:
    with keep_alive_server(close_after=1, status=b"399 Odd", body=b'{"a": 1}') as (port, _s):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        assert hal0_api.Answer(399, {"a": 1}) == client.get("/api/x")
        client.close()


def _client_sockets(port: int) -> int:
    """This process's open TCP sockets whose other end is ``port`` (the client's side)."""
    me = psutil.Process()
    found = me.net_connections("tcp") if hasattr(me, "net_connections") else me.connections("tcp")
    return sum(1 for c in found if c.raddr and c.raddr[1] == port)


@contextmanager
def _every_socket_closed() -> Iterator[None]:
    """What runs inside closes every TCP socket it opened itself: none is left for the garbage
    collector to close (which warns, ResourceWarning, "unclosed"). Earlier tests' garbage is
    collected first, and only TCP sockets count (a shut-down one names no peer)."""
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    tcp = (f"family={int(socket.AF_INET)},", f"family={int(socket.AF_INET6)},")
    assert [] == [
        u for u in unclosed if u.startswith("unclosed <socket") and any(t in u for t in tcp)
    ]


def test_gets_share_one_kept_alive_connection(tmp_path: Path) -> None:
    accepted: list[int] = []
    with keep_alive_server(close_after=3, accepted=accepted) as (port, seen):
        with _every_socket_closed():
            client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
            for n in range(3):
                client.get(f"/api/x{n}")
            client.close()
            del client
        assert 0 == _client_sockets(port), "close() leaves no socket open"
    assert (3, 1) == (len(seen), len(accepted))


def test_a_post_closes_its_connection_after_the_answer(tmp_path: Path) -> None:
    with keep_alive_server(close_after=3) as (port, _seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        assert 200 == client.post("/api/slots/a/restart", timeout=5).status
        assert 0 == _client_sockets(port)


def test_an_abort_closes_the_kept_connection_and_connects_no_more(tmp_path: Path) -> None:
    """Aborted after a GET: the next call is refused before any connection, and the kept-alive
    one is closed."""
    accepted: list[int] = []
    with (
        keep_alive_server(close_after=3, accepted=accepted) as (port, seen),
        _every_socket_closed(),
    ):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        client.get("/api/health")
        client.abort()
        with pytest.raises(hal0_api.ApiAborted, match=r"^the daemon is stopping$"):
            client.get("/api/health")
        del client
    assert (1, 1) == (len(seen), len(accepted))


def test_an_abort_while_connecting_sends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """abort() from another thread lands between the connection and the request: the new
    connection is closed unused."""
    with keep_alive_server(close_after=1) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        checked = client._check_peer

        def check_then_abort(*args: object, **kwargs: object) -> None:
            checked(*args, **kwargs)  # type: ignore[arg-type]
            client.abort()

        monkeypatch.setattr(client, "_check_peer", check_then_abort)
        with pytest.raises(hal0_api.ApiAborted, match="the daemon is stopping"):
            client.get("/api/health")
        assert 0 == _client_sockets(port)
    assert [] == seen


def test_a_name_in_api_url_is_warned_about_once_with_its_addresses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hal0_api, "_NAMES_SAID", set())
    with keep_alive_server(close_after=3) as (port, _seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://localhost:{port}"))
        with capture_logs() as logs:
            client.get("/api/a")
            client.close()
            client.get("/api/b")
            client.close()
    said = [e for e in logs if e["event"] == "api.url_names_a_host"]
    assert 1 == len(said)
    assert "127.0.0.1" in said[0]["addresses"].split(", ")
    assert str(port) not in said[0]["addresses"]


def test_a_host_that_cannot_be_resolved_is_refused(tmp_path: Path) -> None:
    client = hal0_api.Hal0Client(_settings(tmp_path, "http://no-such-host.invalid:8080"))
    with pytest.raises(hal0_api.ApiRefused, match=r"'no-such-host\.invalid' cannot be resolved"):
        client.get("/api/health")


def test_an_unreachable_address_is_refused_and_leaves_no_socket(tmp_path: Path) -> None:
    """A connect that fails for another reason than a refusal or a timeout (TCP to a multicast
    address: no route)."""
    client = hal0_api.Hal0Client(_settings(tmp_path, "http://224.0.0.1:8080"))
    before = psutil.Process().num_fds()
    with pytest.raises(hal0_api.ApiRefused, match=r"unreachable at 224\.0\.0\.1:8080"):
        client.get("/api/health")
    assert before == psutil.Process().num_fds()


def test_a_refused_address_leaves_no_socket(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
    before = psutil.Process().num_fds()
    with pytest.raises(hal0_api.ApiRefused):
        client.get("/api/health")
    assert before == psutil.Process().num_fds()


def test_an_unexpected_failure_while_connecting_is_raised_as_it_is_its_socket_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with keep_alive_server(close_after=1) as (port, seen):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))

        def odd(*_args: object, **_kwargs: object) -> None:
            raise hal0_api.ApiError("odd")

        monkeypatch.setattr(client, "_check_peer", odd)
        with pytest.raises(hal0_api.ApiError, match=r"^odd$"):
            client.get("/api/health")
        assert 0 == _client_sockets(port)
    assert [] == seen


def test_an_unreadable_key_file_is_misconfigured_and_sends_nothing(tmp_path: Path) -> None:
    with keep_alive_server(close_after=1) as (port, seen), _every_socket_closed():
        settings = _settings(tmp_path, f"http://127.0.0.1:{port}")
        (tmp_path / "api.env").unlink()
        (tmp_path / "api.env").mkdir()
        client = hal0_api.Hal0Client(settings)
        with pytest.raises(hal0_api.ApiMisconfigured, match=r"cannot read .*api\.env"):
            client.get("/api/health")
        del client
    assert [] == seen


@pytest.mark.parametrize(
    "body",
    [b'{"error": {"code": "c", "message": "%s"}}', b'{"detail": "%s"}'],
    ids=["error", "detail"],
)
def test_hals_words_are_cut_at_300_characters(tmp_path: Path, body: bytes) -> None:
    long = b"w" * 400
    with keep_alive_server(close_after=1, status=b"400 Bad", body=body % long) as (port, _s):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        with pytest.raises(hal0_api.ApiHttpError) as caught:
            client.get("/api/x")
        client.close()
    assert "w" * 300 == caught.value.message


def test_an_answer_that_closes_its_connection_is_followed_by_a_close(tmp_path: Path) -> None:
    """hal0 says ``Connection: close``: the client closes its end at once (no socket waits in
    CLOSE_WAIT for the next call), and the next call connects anew."""
    accepted: list[int] = []
    with keep_alive_server(close_after=1, headers=b"Connection: close\r\n", accepted=accepted) as (
        port,
        seen,
    ):
        client = hal0_api.Hal0Client(_settings(tmp_path, f"http://127.0.0.1:{port}"))
        assert {"n": 1} == client.get("/api/a").body
        assert 0 == _client_sockets(port)
        assert {"n": 2} == client.get("/api/b").body
        client.close()
    assert (2, 2) == (len(seen), len(accepted))


def test_a_connection_that_gave_no_answer_in_time_is_never_asked_again(tmp_path: Path) -> None:
    """hal0 answers the first GET after the client's timeout: that connection is dropped, so the
    late answer can never be read as the next call's; the next GET goes out on a new one."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(10)
    accepted: list[socket.socket] = []

    def answer(conn: socket.socket, n: int, delay: float) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(5)
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                threading.Event().wait(delay)
                text = b'{"n": %d}' % n
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(text), text)
                )

    def serve() -> None:
        while len(accepted) < 2:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(conn)
            late = 2.0 if len(accepted) == 1 else 0.0
            threading.Thread(target=answer, args=(conn, len(accepted), late), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    port = srv.getsockname()[1]
    try:
        client = hal0_api.Hal0Client(
            _settings(tmp_path, f"http://127.0.0.1:{port}", api_timeout="1")
        )
        with pytest.raises(hal0_api.ApiNoAnswer):
            client.get("/api/health")
        threading.Event().wait(1.5)  # the late answer has arrived on the first connection
        assert {"n": 2} == client.get("/api/health").body
        client.close()
    finally:
        srv.close()
        for conn in accepted:
            conn.close()
        server.join(10)
    assert 2 == len(accepted)
