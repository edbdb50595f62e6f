"""hal0's admin key only reaches hal0: a port squatter gets nothing and is not believed.

An unprivileged user binds the API's port while hal0-api is down (it refuses connections for its
whole boot) and answers every request with 200 ``ready``. The restarter connects, finds that a
listener that could have taken the connection (or the socket at the other end) belongs to that
user (not root, not hal0-api's ``User=``), and sends nothing: no key, no request line. Its 200 is
never read, so nothing counts as restarted. The squatter may also listen with
``TCP_DEFER_ACCEPT``: the kernel then keeps our connection a request socket that sock_diag
reports as uid 0, inode 0; only an accepted connection is trusted.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import api as hal0_api
from hal0_reconciler.host.restarts import peer, units
from helpers.attacker import Attacker, Tally
from helpers.fake_systemctl import FakeSystemctl, restarter_overrides
from helpers.squatter import squatter

pytestmark = pytest.mark.timeout(60)
WILDCARD_V4 = ".".join("0" * 4)  # the address compared with, never bound


@contextmanager
def roots_listener(host: str = "127.0.0.1", *, defer: bool = False) -> Iterator[socket.socket]:
    """A listener of root's (a trusted owner) that never accepts: hal0-api still booting."""
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    with srv:
        if defer:
            srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
        srv.bind((host, 0))
        srv.listen(8)
        yield srv


def _client(tmp_path: Path, url: str) -> hal0_api.Hal0Client:
    (tmp_path / "api.env").write_text("HAL0_ADMIN_KEY=the-admin-key\n")
    none = tmp_path / "no-units"
    return hal0_api.Hal0Client(
        settings_mod.load(
            None,
            {
                "api_url": url,
                "api_env_file": str(tmp_path / "api.env"),
                "hal0_api_unit_dirs": [str(none)],
            },
        )
    )


def test_a_port_squatter_gets_no_key_and_its_200_is_not_believed(
    tmp_path: Path, attacker: Attacker, attacks: Tally
) -> None:
    """The attacker's listener on the API port: every call refused before a byte is sent
    (the key above all), the API unavailable, nothing restarted, the listener's uid said."""
    attacks.tried("api-port-squatter")
    (tmp_path / "api.env").write_text("HAL0_ADMIN_KEY=the-admin-key\n")
    systemctl = FakeSystemctl(
        tmp_path / "bin", {units.unit_name("agent"): "active", "hal0-api.service": "activating"}
    )
    with squatter(attacker, tmp_path) as (port, seen):
        settings = settings_mod.load(
            None,
            {
                **restarter_overrides(tmp_path, f"http://127.0.0.1:{port}", systemctl.path),
                "api_wait_bound": 0.3,
                "restart_fallback": "stop",
            },
        )
        flow = units.RestartFlow(settings)
        request = units.RestartRequest(name="agent", token="agent")
        with capture_logs() as logs:
            deadline = time.monotonic() + 20
            while True:
                result = flow.step(request, active=True, now=time.monotonic())
                if not isinstance(result, units.Later):
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
        time.sleep(0.2)  # anything sent has reached the file by now
        received = seen.read_bytes()
    assert b"" == received, "the squatter received bytes"
    assert units.RestartResult.FAILED == result, "its 200 was believed"
    assert [] == systemctl.actions(), "hal0-api is activating: nothing stopped"
    untrusted = [e for e in logs if e["event"] == "api.untrusted_listener"]
    assert untrusted
    assert attacker.uid == untrusted[0]["uid"]
    assert untrusted[0]["action"].endswith("hal0's API counts as unavailable")  # no other address
    attacks.held("api-port-squatter")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
@pytest.mark.parametrize("netlink", [True, False], ids=["sock_diag", "proc-only"])
def test_a_defer_accept_squatter_is_refused_by_its_listener_at_once(
    tmp_path: Path, attacker: Attacker, attacks: Tally, host: str, netlink: bool
) -> None:
    """``TCP_DEFER_ACCEPT``: our connection stays a request socket (uid 0, inode 0 to
    sock_diag). The listener that holds it is the attacker's: untrusted at once, naming its
    uid, IPv4 and IPv6, by sock_diag and by /proc alike; nothing reaches it."""
    attacks.tried("api-defer-accept-squatter")
    with squatter(attacker, tmp_path, host=host, defer=True) as (port, seen):
        with socket.create_connection((host, port), timeout=5) as sock:
            answers = peer.tables(sock, netlink=netlink)
            verdict = peer.judge(answers, frozenset({0}))
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        client = _client(tmp_path, url)
        with capture_logs() as logs, pytest.raises(hal0_api.ApiUntrusted):
            client.get("/api/health")
        time.sleep(0.2)
        received = seen.read_bytes()
    assert [s.source == "sock_diag" for s in answers] == ([True, False] if netlink else [False])
    assert peer.Trust.UNTRUSTED is verdict.trust
    assert attacker.uid == verdict.uid, verdict
    assert b"" == received
    assert [attacker.uid] == [e["uid"] for e in logs if e["event"] == "api.untrusted_listener"]
    attacks.held("api-defer-accept-squatter")


@pytest.mark.parametrize("defer", [True, False], ids=["request-socket", "queued"])
def test_a_connection_root_has_not_accepted_yet_is_never_written_to(
    tmp_path: Path, defer: bool
) -> None:
    """A trusted owner's listener that has not accepted our connection (a request socket under
    ``TCP_DEFER_ACCEPT``, or a connection waiting in its queue): asked again every 5 ms, then
    "hal0-api not trusted yet" after 2 s; not one byte is sent (the listener never wakes)."""
    with roots_listener(defer=defer) as srv:
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            for netlink in (True, False):
                verdict = peer.check(sock, frozenset({0}), netlink=netlink)
                assert peer.Trust.NOT_YET is verdict.trust, verdict
                assert 0 == verdict.inode
        client = _client(tmp_path, f"http://127.0.0.1:{port}")
        started = time.monotonic()
        with pytest.raises(hal0_api.ApiNotTrustedYet, match="hal0-api not trusted yet"):
            client.get("/api/health")
        waited = time.monotonic() - started
        srv.settimeout(0.3)
        got = b""
        for _ in range(3):
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                break
            with conn:
                conn.settimeout(0.3)
                with contextlib.suppress(TimeoutError):
                    got += conn.recv(65536)
    assert b"" == got, "bytes were sent before the connection was accepted"
    assert waited >= hal0_api.TRUST_WITHIN


def test_not_trusted_yet_counts_toward_the_unavailable_bound_with_its_own_message(
    tmp_path: Path,
) -> None:
    """The restart waits and then fails as "hal0 API unavailable", saying not trusted yet."""
    systemctl = FakeSystemctl(tmp_path / "bin", {"hal0-api.service": "active"})
    with roots_listener(defer=True) as srv:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        overrides = {**restarter_overrides(tmp_path, url, systemctl.path), "api_wait_bound": 0}
        flow = units.RestartFlow(settings_mod.load(None, overrides))
        result = flow.step(units.RestartRequest("agent", "agent"), active=True, now=0.0)
    assert units.RestartResult.FAILED == result
    assert "hal0-api not trusted yet" in flow.report.failures["agent"]


def _fake_proc(folder: Path, rows: dict[str, list[str]]) -> Path:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    folder.mkdir()
    for table, lines in rows.items():
        (folder / table).write_text(header + "".join(f"{line}\n" for line in lines))
    return folder


def _hex(endpoint: tuple[str, int]) -> str:
    import ipaddress

    raw = ipaddress.ip_address(endpoint[0]).packed
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{words.hex().upper()}:{endpoint[1]:04X}"


def _row(local: tuple[str, int], remote: tuple[str, int], state: int, uid: int, inode: int) -> str:
    return f"   0: {_hex(local)} {_hex(remote)} {state:02X} 00000000:00000000 00:00000000 00000000 {uid:5d}        0 {inode} 1 0000000000000000 20 4 30 10 -1"


@pytest.mark.parametrize("state", [6, 3, 8])  # TIME_WAIT, SYN_RECV, CLOSE_WAIT
def test_a_peer_row_in_another_state_than_established_is_not_trusted(
    tmp_path: Path, state: int
) -> None:
    """A /proc row for our very connection, owned by uid 0 with an inode, but in TIME_WAIT (or
    any state but established): not trusted; the same row established is."""
    with (
        roots_listener() as srv,
        socket.create_connection(srv.getsockname()[:2], timeout=5) as sock,
    ):
        ours, theirs = sock.getsockname()[:2], sock.getpeername()[:2]
        for name, row_state in (("bad", state), ("good", peer.ESTABLISHED)):
            proc = _fake_proc(tmp_path / name, {"tcp": [_row(theirs, ours, row_state, 0, 4242)]})
            verdict = peer.check(sock, frozenset({0}), proc_net=proc, netlink=False)
            expected = peer.Trust.TRUSTED if name == "good" else peer.Trust.NOT_YET
            assert expected is verdict.trust, (name, verdict)


def test_the_listener_rows_that_could_take_the_connection_are_every_form_of_its_address(
    tmp_path: Path,
) -> None:
    """Exact address, IPv4 wildcard, IPv6 wildcard, v4-mapped: each a listener that must be
    trusted; another address or another port is none of its business."""
    with (
        roots_listener() as srv,
        socket.create_connection(srv.getsockname()[:2], timeout=5) as sock,
    ):
        ours, theirs = sock.getsockname()[:2], sock.getpeername()[:2]
        port = theirs[1]
        good = _row(theirs, ours, peer.ESTABLISHED, 0, 4242)
        far = (WILDCARD_V4, 0)
        cases = {
            "exact": ("tcp", _row(("127.0.0.1", port), far, peer.LISTEN, 999, 1)),
            "v4-wildcard": ("tcp", _row((WILDCARD_V4, port), far, peer.LISTEN, 999, 2)),
            "v6-wildcard": ("tcp6", _row(("::", port), ("::", 0), peer.LISTEN, 999, 3)),
            "v4-mapped": ("tcp6", _row(("::ffff:127.0.0.1", port), ("::", 0), peer.LISTEN, 999, 4)),
        }
        for name, (table, row) in cases.items():
            rows = {"tcp": [good], "tcp6": []}
            rows[table].append(row)
            proc = _fake_proc(tmp_path / name, rows)
            verdict = peer.check(sock, frozenset({0}), proc_net=proc, netlink=False)
            assert (peer.Trust.UNTRUSTED, 999) == (verdict.trust, verdict.uid), name
            trusted = peer.check(sock, frozenset({0, 999}), proc_net=proc, netlink=False)
            assert peer.Trust.TRUSTED is trusted.trust, name
        unrelated = [
            _row(("127.0.0.2", port), far, peer.LISTEN, 999, 5),
            _row(("127.0.0.1", port + 1 if port < 65535 else 1), far, peer.LISTEN, 999, 6),
        ]
        proc = _fake_proc(
            tmp_path / "unrelated",
            {
                "tcp": [good, *unrelated],
                "tcp6": [_row(("::1", port), ("::", 0), peer.LISTEN, 999, 7)],
            },
        )
        assert (
            peer.Trust.TRUSTED
            is peer.check(sock, frozenset({0}), proc_net=proc, netlink=False).trust
        )


def test_ipv6_hal0_api_is_reached_and_trusted(tmp_path: Path) -> None:
    """hal0-api on ``[::1]``: the connection is checked by both ways and the call answers."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(HTTPServer):
        address_family = socket.AF_INET6

    server = Server(("::1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        client = _client(tmp_path, f"http://[::1]:{server.server_address[1]}")
        assert {"status": "ok"} == client.get("/api/health").body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_accepted_owners_are_root_and_hal0_apis_user(
    tmp_path: Path, attacker: Attacker
) -> None:
    """User= is read from hal0-api's unit and its drop-ins (the last one wins); the setting
    overrides it; a unit without User= and no unit at all trust root alone (an account hal0 does
    not run as, such as the hal0 user an older release made, is never trusted)."""
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    (unit_dir / "hal0-api.service").write_text(
        f"[Service]\nUser=nobody\nUser={attacker.name}\nExecStart=/bin/true\n"
    )
    settings = settings_mod.load(None, {"hal0_api_unit_dirs": [str(unit_dir)]})
    assert frozenset({0, attacker.uid}) == hal0_api.accepted_uids(settings)
    assert attacker.name == hal0_api.service_user(settings)
    pinned = settings_mod.load(None, {"hal0_api_unit_dirs": [str(unit_dir)], "hal0_api_user": "0"})
    assert frozenset({0}) == hal0_api.accepted_uids(pinned)
    missing = settings_mod.load(None, {"hal0_api_unit_dirs": [str(tmp_path / "none")]})
    assert "root" == hal0_api.service_user(missing)
    assert frozenset({0}) == hal0_api.accepted_uids(missing)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "hal0-api.service").write_text("[Service]\nExecStart=/bin/true\n")
    assert frozenset({0}) == hal0_api.accepted_uids(
        settings_mod.load(None, {"hal0_api_unit_dirs": [str(bare)]})
    )
    drop_in = bare / "hal0-api.service.d"
    drop_in.mkdir()
    (drop_in / "10-user.conf").write_text(f"[Service]\nUser={attacker.name}\n")
    (drop_in / "20-reset.conf").write_text("[Service]\nUser=\n")
    assert frozenset({0}) == hal0_api.accepted_uids(
        settings_mod.load(None, {"hal0_api_unit_dirs": [str(bare)]})
    )
    (drop_in / "20-reset.conf").unlink()
    assert frozenset({0, attacker.uid}) == hal0_api.accepted_uids(
        settings_mod.load(None, {"hal0_api_unit_dirs": [str(bare)]})
    )
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "hal0-api.service").symlink_to(unit_dir / "hal0-api.service")  # systemctl link
    later = tmp_path / "later"
    later.mkdir()
    (later / "hal0-api.service").write_text("[Service]\nUser=nobody\n")  # hidden by the first
    both = settings_mod.load(None, {"hal0_api_unit_dirs": [str(linked), str(later)]})
    assert frozenset({0, attacker.uid}) == hal0_api.accepted_uids(both)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # User= only counts in [Service], as systemd reads it; a comment is none
    (elsewhere / "hal0-api.service").write_text(
        f"[Unit]\nUser={attacker.name}\n[Service]\n# User={attacker.name}\nExecStart=/bin/true\n"
    )
    assert frozenset({0}) == hal0_api.accepted_uids(
        settings_mod.load(None, {"hal0_api_unit_dirs": [str(elsewhere)]})
    )


def test_no_hal0_api_unit_trusts_root_alone_against_a_listening_user(
    tmp_path: Path, attacker: Attacker, attacks: Tally
) -> None:
    """With ``hal0_api_user = "auto"`` and no hal0-api unit, the attacker's listener (whatever
    account it is) is untrusted: only root is hal0-api's owner then."""
    attacks.tried("api owner guessed without a unit")
    with squatter(attacker, tmp_path) as (port, seen):
        with pytest.raises(hal0_api.ApiUntrusted):
            _client(tmp_path, f"http://127.0.0.1:{port}").get("/api/health")
        time.sleep(0.2)
        assert b"" == seen.read_bytes()
    attacks.held("api owner guessed without a unit")


def test_a_unit_file_over_its_cap_is_not_read(tmp_path: Path, attacker: Attacker) -> None:
    """hal0-api's unit larger than its cap (sparse: no bytes on disk) is refused: its User=
    is not trusted."""
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    unit = unit_dir / "hal0-api.service"
    tail = f"\nUser={attacker.name}\n".encode()

    def sized(size: int) -> None:
        with unit.open("wb") as fh:
            fh.write(b"[Service]\n")
            fh.seek(size - len(tail))
            fh.write(tail)

    sized((1 << 20) + 1)
    settings = settings_mod.load(None, {"hal0_api_unit_dirs": [str(unit_dir)]})
    with capture_logs() as logs:
        assert frozenset({0}) == hal0_api.accepted_uids(settings)
    assert ["api.unit_unreadable"] == [e["event"] for e in logs]
    sized(1 << 20)  # at the cap: read, and its User= taken
    assert frozenset({0, attacker.uid}) == hal0_api.accepted_uids(settings)


@pytest.mark.parametrize("netlink", [True, False], ids=["sock_diag", "proc"])
def test_a_dual_stack_hal0_api_is_trusted_over_ipv4(netlink: bool) -> None:
    """hal0-api listening on ``::`` for both families, reached at 127.0.0.1: the accepted
    socket is in the IPv6 table under the v4-mapped address, and both ways find it root's."""
    srv = socket.socket(socket.AF_INET6)
    with srv:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        srv.bind(("::", 0))
        srv.listen(8)
        with socket.create_connection(("127.0.0.1", srv.getsockname()[1]), timeout=5) as sock:
            accepted, _ = srv.accept()
            with accepted:
                verdict = peer.check(sock, frozenset({0}), netlink=netlink)
    assert (peer.Trust.TRUSTED, 0) == (verdict.trust, verdict.uid), verdict
