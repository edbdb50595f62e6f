"""Who owns the other end of a TCP connection we made: the kernel's socket table.

The table is asked for the one socket whose local end is the peer's and whose remote end is
ours: by ``NETLINK_SOCK_DIAG`` (an exact look-up, as ``ss`` does), else by scanning
``/proc/net/tcp{,6}`` (slow on a host with many sockets: the kernel prints all of them).

Before anything is sent to hal0's API (the admin key above all), the connection is checked: our
socket's local address and port name one row of the kernel's socket table whose *local* end is
the peer's (the server's accepted socket, which carries the uid of whoever made the listening
socket). Accepted are root and hal0-api's service user; a listener that any other local user
bound to the port while hal0-api was restarting gets nothing.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import boundedread

PROC_NET = Path("/proc/net")
_TABLE_MAX_BYTES = 32 << 20  # a host with a quarter of a million sockets
_ESTABLISHED = "01"
_SYN_RECV = "03"


@dataclass(frozen=True)
class PeerSocket:
    """The peer's end of our connection as the kernel lists it."""

    uid: int
    inode: int  # 0 while the server has not accepted the connection yet


class PeerUnknown(Exception):
    """The kernel's socket table has no row for the other end of this connection."""


def _address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1F90`` (IPv4) or 32 hex digits (IPv6), each 32-bit word in host order."""
    host, _, port = hex_address.partition(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped, int(port, 16)
    return address, int(port, 16)


def _endpoint(
    sockaddr: tuple[object, ...],
) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    address = ipaddress.ip_address(str(sockaddr[0]))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    port = sockaddr[1]
    assert isinstance(port, int)  # noqa: S101 - an inet socket's address
    return address, port


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NOCOOKIE = 0xFFFFFFFF
_NLMSGHDR = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_SOCKID = struct.Struct(">HH16s16s")  # sport, dport, src, dst (network order)
_SOCKID_TAIL = struct.Struct("=III")  # if, cookie[2]
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode


def _packed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    return address.packed.ljust(16, b"\0")


def _by_netlink(
    family: int,
    theirs: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int],
    ours: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int],
) -> PeerSocket | None:
    """The exact look-up; None when the kernel has no such socket; OSError when it cannot ask."""
    request = (
        _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
        + _SOCKID.pack(theirs[1], ours[1], _packed(theirs[0]), _packed(ours[0]))
        + _SOCKID_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE)
    )
    header = _NLMSGHDR.pack(
        _NLMSGHDR.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)
        nl.sendto(header + request, (0, 0))
        data = nl.recv(65536)
    if len(data) < _NLMSGHDR.size:
        raise OSError(errno.EPROTO, "short netlink answer")
    _length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data)
    body = data[_NLMSGHDR.size :]
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", body)
        if -code in {errno.ENOENT, errno.ESRCH}:
            return None
        raise OSError(-code, os.strerror(-code))
    offset = _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size
    if len(body) < offset + _MSG_TAIL.size:
        raise OSError(errno.EPROTO, "short sock_diag message")
    *_rest, uid, inode = _MSG_TAIL.unpack_from(body, offset)
    return PeerSocket(uid=uid, inode=inode)


def peer_of(sock: socket.socket, *, proc_net: Path = PROC_NET, netlink: bool = True) -> PeerSocket:
    """The uid and inode of the socket at the other end of ``sock`` (a connected TCP socket).

    Raises PeerUnknown when no socket matches (the peer is not on this host, or it went away),
    ``boundedread.ReadRefused`` when a table cannot be read.
    """
    ours = _endpoint(sock.getsockname())
    theirs = _endpoint(sock.getpeername())
    if netlink:
        try:
            found = _by_netlink(sock.family, theirs, ours)
        except OSError:
            pass  # no sock_diag here (a sandbox, an old kernel): the table, the slow way
        else:
            if found is None:
                raise PeerUnknown(f"no socket on this host answers for {theirs[0]}:{theirs[1]}")
            return found
    for table in ("tcp", "tcp6"):
        text = boundedread.read_bounded_text(
            proc_net / table, max_bytes=_TABLE_MAX_BYTES, missing_ok=True, follow_links=True
        )
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] not in {_ESTABLISHED, _SYN_RECV}:
                continue
            try:
                local, remote = _address(fields[1]), _address(fields[2])
            except ValueError:
                continue
            if local == theirs and remote == ours:
                return PeerSocket(uid=int(fields[7]), inode=int(fields[9]))
    raise PeerUnknown(f"no socket on this host answers for {theirs[0]}:{theirs[1]}")
