"""The peer check's verdict on the kernel tables' answers (pure): each rule on its own."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import pytest

from hal0_reconciler import boundedread
from hal0_reconciler.host.restarts import peer

OK = frozenset({0, 990})
LISTENER = peer.Listener("127.0.0.1", 8080, 990, 11)
ACCEPTED = peer.PeerSocket(uid=990, inode=12, state=peer.ESTABLISHED)


def _tables(
    source: str = "sock_diag",
    peer_socket: peer.PeerSocket | None = ACCEPTED,
    listeners: tuple[peer.Listener, ...] = (LISTENER,),
) -> peer.Tables:
    return peer.Tables(source, peer_socket, frozenset(listeners))


def test_an_accepted_connection_of_a_trusted_owner_is_trusted() -> None:
    verdict = peer.judge([_tables(), _tables("/proc/net/tcp")], OK)
    assert (peer.Trust.TRUSTED, 990, 12) == (verdict.trust, verdict.uid, verdict.inode)


def test_a_foreign_listener_is_untrusted_whatever_the_peer_says() -> None:
    foreign = peer.Listener("0.0.0.0", 8080, 1000, 13)  # noqa: S104 - a table row, not a bind
    verdict = peer.judge([_tables(listeners=(LISTENER, foreign))], OK)
    assert (peer.Trust.UNTRUSTED, 1000, 13) == (verdict.trust, verdict.uid, verdict.inode)
    assert "0.0.0.0 port 8080 belongs to uid 1000" in verdict.reason


def test_a_foreign_listener_only_one_way_sees_is_untrusted() -> None:
    foreign = peer.Listener("::", 8080, 1000, 13)
    verdict = peer.judge([_tables(), _tables("/proc/net/tcp", listeners=(LISTENER, foreign))], OK)
    assert peer.Trust.UNTRUSTED is verdict.trust


@pytest.mark.parametrize(
    "socket_",
    [
        peer.PeerSocket(uid=0, inode=0, state=12),  # a request socket (TCP_DEFER_ACCEPT)
        peer.PeerSocket(uid=0, inode=0, state=peer.ESTABLISHED),  # queued, not accepted
        peer.PeerSocket(uid=0, inode=77, state=6),  # TIME_WAIT
        peer.PeerSocket(uid=990, inode=77, state=3),  # SYN_RECV
    ],
)
def test_a_connection_not_accepted_is_not_trusted_yet(socket_: peer.PeerSocket) -> None:
    for answers in ([_tables(peer_socket=socket_)], [_tables(), _tables("/proc", socket_)]):
        verdict = peer.judge(answers, OK)
        assert peer.Trust.NOT_YET is verdict.trust, answers
        assert (socket_.uid, socket_.inode) == (verdict.uid, verdict.inode)


def test_two_ways_that_disagree_are_not_trusted_yet() -> None:
    other_peer = peer.PeerSocket(uid=0, inode=99, state=peer.ESTABLISHED)
    other_listener = peer.Listener("127.0.0.1", 8080, 0, 14)
    for other in (_tables("/proc", other_peer), _tables("/proc", listeners=(other_listener,))):
        verdict = peer.judge([_tables(), other], OK)
        assert peer.Trust.NOT_YET is verdict.trust
        assert "disagree" in verdict.reason


def test_no_peer_is_untrusted() -> None:
    assert peer.Trust.UNTRUSTED is peer.judge([_tables(peer_socket=None)], OK).trust


def test_a_peer_of_another_uid_is_untrusted() -> None:
    theirs = peer.PeerSocket(uid=1000, inode=5, state=peer.ESTABLISHED)
    verdict = peer.judge([_tables(peer_socket=theirs, listeners=())], OK)
    assert (peer.Trust.UNTRUSTED, 1000) == (verdict.trust, verdict.uid)


@pytest.mark.parametrize(
    ("listening", "destination", "takes"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("0.0.0.0", "127.0.0.1", True),  # noqa: S104
        ("::", "127.0.0.1", True),
        ("::", "::1", True),
        ("::1", "::1", True),
        ("0.0.0.0", "::1", False),  # noqa: S104
        ("127.0.0.2", "127.0.0.1", False),
        ("::1", "127.0.0.1", False),
        ("127.0.0.1", "::1", False),
    ],
)
def test_which_listeners_could_take_a_connection(
    listening: str, destination: str, takes: bool
) -> None:
    a, b = ipaddress.ip_address(listening), ipaddress.ip_address(destination)
    assert takes is peer.could_take(a, b)


def test_the_proc_tables_hex_addresses() -> None:
    assert (ipaddress.ip_address("127.0.0.1"), 8080) == peer._address("0100007F:1F90")
    assert (ipaddress.ip_address("::1"), 80) == peer._address(
        "00000000000000000000000001000000:0050"
    )
    mapped = "0000000000000000FFFF00000100007F:0050"
    assert (ipaddress.ip_address("127.0.0.1"), 80) == peer._address(mapped)


def test_the_sock_diag_request_carries_sixteen_byte_addresses() -> None:
    """inet_diag_sockid holds each address in 16 bytes, whatever the family: an IPv4 address is
    zero-padded, an IPv4 one asked about over IPv6 is v4-mapped (a request of another size is
    refused by the kernel, and the look-up falls back to /proc alone)."""
    v4 = ipaddress.IPv4Address("127.0.0.1")
    assert v4.packed + b"\0" * 12 == peer._packed(v4, socket.AF_INET)
    mapped = peer._packed(v4, socket.AF_INET6)
    assert b"\0" * 10 + b"\xff\xff" + v4.packed == mapped
    v6 = ipaddress.IPv6Address("::1")
    assert v6.packed == peer._packed(v6, socket.AF_INET6)


def test_a_proc_table_over_32_mib_is_refused_and_one_at_the_cap_is_read(tmp_path: Path) -> None:
    """/proc/net/tcp is read capped at 32 MiB (a host with a quarter of a million sockets):
    one byte over is refused, never read whole; a table of exactly the cap is read."""
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname(), timeout=5) as sock:
        header = "  sl  local_address rem_address   st\n"
        for size, refused in ((32 << 20, False), ((32 << 20) + 1, True)):
            (tmp_path / "tcp").write_text(header + " " * (size - len(header) - 1) + "\n")
            if refused:
                with pytest.raises(boundedread.ReadRefused):
                    peer.tables(sock, proc_net=tmp_path, netlink=False)
            else:
                (answer,) = peer.tables(sock, proc_net=tmp_path, netlink=False)
                assert answer.peer is None
