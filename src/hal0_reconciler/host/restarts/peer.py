"""May the other end of a TCP connection we made hear us: the kernel's socket tables say.

Before anything is sent to hal0's API (the admin key above all), the connection is judged from
the kernel's tables, asked two ways: ``NETLINK_SOCK_DIAG`` (an exact look-up, as ``ss`` does;
absent in a sandbox that restricts address families, as the shipped unit does) and
``/proc/net/tcp{,6}`` (every socket). From each: the *peer* (the row whose local end is the
server's end of our connection, carrying the uid of whoever made the listening socket) and every
LISTEN socket that could have taken the connection (its exact address, the wildcard, and the
v4-mapped IPv6 forms). The connection is trusted only when

- every such listener belongs to root or hal0-api's user (one that belongs to anyone else is a
  squatter: untrusted, at once);
- the peer is accepted: established, with an inode. A connection still in the listener's queue
  (a ``TCP_DEFER_ACCEPT`` listener keeps it a request socket, which sock_diag reports as uid 0
  and inode 0) is *not trusted yet*: the caller asks again;
- both ways give the same answer (a disagreement is not trusted yet either);
- the peer belongs to root or hal0-api's user.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import boundedread

PROC_NET = Path("/proc/net")
_TABLE_MAX_BYTES = 32 << 20  # a host with a quarter of a million sockets
ESTABLISHED = 1
LISTEN = 10

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[Address, int]


@dataclass(frozen=True)
class PeerSocket:
    """The peer's end of our connection as one table lists it."""

    uid: int
    inode: int  # 0 while the server has not accepted the connection yet
    state: int  # the kernel's TCP state (1: established)

    @property
    def accepted(self) -> bool:
        return self.state == ESTABLISHED and self.inode != 0


@dataclass(frozen=True, order=True)
class Listener:
    """A LISTEN socket that could have taken our connection."""

    address: str
    port: int
    uid: int
    inode: int


@dataclass(frozen=True)
class Tables:
    """One way's answer: ``source`` names it in messages."""

    source: str
    peer: PeerSocket | None
    listeners: frozenset[Listener]


class Trust(enum.StrEnum):
    TRUSTED = "trusted"
    NOT_YET = "not-yet"  # not accepted yet, or the two ways disagree: ask again shortly
    UNTRUSTED = "untrusted"  # a listener or the peer belongs to someone else, or no peer


@dataclass(frozen=True)
class Verdict:
    trust: Trust
    reason: str
    uid: int | None = None
    inode: int | None = None


def _address(hex_address: str) -> Endpoint:
    """``0100007F:1F90`` (IPv4) or 32 hex digits (IPv6), each 32-bit word in host order."""
    host, _, port = hex_address.partition(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _plain(ipaddress.ip_address(words)), int(port, 16)


def _plain(address: Address) -> Address:
    """A v4-mapped IPv6 address as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _endpoint(sockaddr: tuple[object, ...]) -> Endpoint:
    port = sockaddr[1]
    assert isinstance(port, int)  # noqa: S101 - an inet socket's address
    return _plain(ipaddress.ip_address(str(sockaddr[0]))), port


def could_take(listening: Address, destination: Address) -> bool:
    """A socket listening on ``listening`` (v4-mapped forms made plain) can take a connection to
    ``destination``: the same address, the IPv4 wildcard for an IPv4 destination, or the IPv6
    wildcard (a dual-stack socket takes IPv4 too, unless it is v6-only: counted anyway)."""
    if listening == destination or listening == ipaddress.IPv6Address("::"):
        return True
    return listening == ipaddress.IPv4Address("0.0.0.0") and destination.version == 4  # noqa: S104 - the wildcard compared, not bound


# -- NETLINK_SOCK_DIAG ------------------------------------------------------------------------
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_NLM_F_REQUEST = 1
_NLM_F_DUMP = 0x300
_NOCOOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_NLMSGHDR = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_SOCKID = struct.Struct(">HH16s16s")  # sport, dport, src, dst (network order)
_SOCKID_TAIL = struct.Struct("=III")  # if, cookie[2]
_MSG_HEAD = struct.Struct("=BBBB")  # family, state, timer, retrans
_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_MSG_SIZE = _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size + _MSG_TAIL.size
_MAX_DATAGRAMS = 4096  # a dump of LISTEN sockets is a few datagrams


def _packed(address: Address, family: int) -> bytes:
    if family == socket.AF_INET6 and address.version == 4:
        return ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed).packed
    return address.packed.ljust(16, b"\0")


def _ask(family: int, states: int, flags: int, ids: tuple[int, int, bytes, bytes]) -> list[bytes]:
    """The inet_diag_msg bodies of one sock_diag request (OSError: it cannot be asked)."""
    request = (
        _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, states)
        + _SOCKID.pack(*ids)
        + _SOCKID_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE)
    )
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), _SOCK_DIAG_BY_FAMILY, flags, 1, 0)
    bodies: list[bytes] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)
        nl.sendto(header + request, (0, 0))
        for _ in range(_MAX_DATAGRAMS):
            data = nl.recv(1 << 16)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
                body = data[offset + _NLMSGHDR.size : offset + length]
                if kind == _NLMSG_DONE:
                    return bodies
                if kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", body)
                    if -code in {errno.ENOENT, errno.ESRCH}:
                        return bodies
                    raise OSError(-code, os.strerror(-code))
                if len(body) < _MSG_SIZE:
                    raise OSError(errno.EPROTO, "short sock_diag message")
                bodies.append(body)
                offset += max(_NLMSGHDR.size, (length + 3) & ~3)
            if not flags & _NLM_F_DUMP:
                return bodies
    raise OSError(errno.EPROTO, "sock_diag answer without an end")


def _parsed(body: bytes) -> tuple[int, Endpoint, int, int]:
    """(state, local end, uid, inode) of one inet_diag_msg."""
    family, state, _timer, _retrans = _MSG_HEAD.unpack_from(body)
    sport, _dport, src, _dst = _SOCKID.unpack_from(body, _MSG_HEAD.size)
    raw = src[:4] if family == socket.AF_INET else src
    *_rest, uid, inode = _MSG_TAIL.unpack_from(body, _MSG_HEAD.size + _SOCKID.size + 12)
    return state, (_plain(ipaddress.ip_address(raw)), sport), uid, inode


def _by_netlink(theirs: Endpoint, ours: Endpoint) -> Tables:
    """The exact look-up of the peer (the IPv6 table too for an IPv4 connection: a dual-stack
    server's socket) and every LISTEN socket (OSError: sock_diag cannot be asked here)."""
    peer: PeerSocket | None = None
    families = [socket.AF_INET, socket.AF_INET6] if theirs[0].version == 4 else [socket.AF_INET6]
    for family in families:
        ids = (theirs[1], ours[1], _packed(theirs[0], family), _packed(ours[0], family))
        found = _ask(family, _ALL_STATES, _NLM_F_REQUEST, ids)
        if found:
            state, _local, uid, inode = _parsed(found[0])
            peer = PeerSocket(uid=uid, inode=inode, state=state)
            break
    listeners: set[Listener] = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        nothing = (0, 0, b"\0" * 16, b"\0" * 16)
        for body in _ask(family, 1 << LISTEN, _NLM_F_REQUEST | _NLM_F_DUMP, nothing):
            _state, local, uid, inode = _parsed(body)
            if local[1] == theirs[1] and could_take(local[0], theirs[0]):
                listeners.add(Listener(str(local[0]), local[1], uid, inode))
    return Tables("sock_diag", peer, frozenset(listeners))


# -- /proc/net/tcp{,6} ------------------------------------------------------------------------
def _by_proc(proc_net: Path, theirs: Endpoint, ours: Endpoint) -> Tables:
    """The first row of the peer and every LISTEN row that could have taken the connection
    (``boundedread.ReadRefused`` when a table cannot be read)."""
    peer: PeerSocket | None = None
    listeners: set[Listener] = set()
    for table in ("tcp", "tcp6"):
        text = boundedread.read_bounded_text(
            proc_net / table, max_bytes=_TABLE_MAX_BYTES, missing_ok=True, follow_links=True
        )
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10:
                continue
            try:
                local, remote = _address(fields[1]), _address(fields[2])
                state, uid, inode = int(fields[3], 16), int(fields[7]), int(fields[9])
            except ValueError:
                continue
            if state == LISTEN:
                if local[1] == theirs[1] and could_take(local[0], theirs[0]):
                    listeners.add(Listener(str(local[0]), local[1], uid, inode))
            elif peer is None and local == theirs and remote == ours:
                peer = PeerSocket(uid=uid, inode=inode, state=state)
    return Tables(f"{proc_net}/tcp", peer, frozenset(listeners))


def tables(sock: socket.socket, *, proc_net: Path = PROC_NET, netlink: bool = True) -> list[Tables]:
    """What each way says about ``sock``'s (a connected TCP socket) other end: sock_diag's
    answer first when it can be asked, then /proc's (``boundedread.ReadRefused``: unreadable)."""
    ours, theirs = _endpoint(sock.getsockname()), _endpoint(sock.getpeername())
    answers: list[Tables] = []
    if netlink:
        # no sock_diag here (a sandbox, an old kernel): /proc alone says it
        with contextlib.suppress(OSError):
            answers.append(_by_netlink(theirs, ours))
    answers.append(_by_proc(proc_net, theirs, ours))
    return answers


def judge(answers: Iterable[Tables], accepted: frozenset[int]) -> Verdict:
    """The verdict on the tables' answers (pure: see the module's rules)."""
    found = list(answers)
    for listener in sorted({x for a in found for x in a.listeners}):
        if listener.uid not in accepted:
            return Verdict(
                Trust.UNTRUSTED,
                f"a listener on {listener.address} port {listener.port} belongs to uid "
                f"{listener.uid} ({found[0].source})",
                uid=listener.uid,
                inode=listener.inode,
            )
    for answer in found:
        if answer.peer is not None and not answer.peer.accepted:
            return Verdict(
                Trust.NOT_YET,
                f"the connection is not accepted yet ({answer.source}: state "
                f"{answer.peer.state}, inode {answer.peer.inode})",
                uid=answer.peer.uid,
                inode=answer.peer.inode,
            )
    first = found[0]
    for other in found[1:]:
        if (other.peer, other.listeners) != (first.peer, first.listeners):
            return Verdict(Trust.NOT_YET, f"{first.source} and {other.source} disagree")
    peer = first.peer
    if peer is None:
        return Verdict(Trust.UNTRUSTED, "no socket on this host answers for it")
    if peer.uid not in accepted:
        return Verdict(
            Trust.UNTRUSTED, f"it belongs to uid {peer.uid}", uid=peer.uid, inode=peer.inode
        )
    return Verdict(Trust.TRUSTED, f"uid {peer.uid}", uid=peer.uid, inode=peer.inode)


def check(
    sock: socket.socket,
    accepted: frozenset[int],
    *,
    proc_net: Path = PROC_NET,
    netlink: bool = True,
) -> Verdict:
    """``judge`` of ``tables``; a table that cannot be read is untrusted (nothing is sent)."""
    try:
        found = tables(sock, proc_net=proc_net, netlink=netlink)
    except boundedread.ReadRefused as exc:
        return Verdict(Trust.UNTRUSTED, f"the socket table cannot be read: {exc}")
    return judge(found, accepted)
