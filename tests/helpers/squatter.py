"""A port squatter: a listener run as the attacker, recording every byte it is sent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.attacker import Attacker

_SQUATTER = textwrap.dedent(
    """
    import os, socket, sys
    uid, gid, seen, host, port, defer = sys.argv[1:7]
    record = open(seen, "ab", buffering=0)  # opened by root: the test's folder is root's
    os.setgroups([]); os.setgid(int(gid)); os.setuid(int(uid))  # the attacker from here on
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if defer == "1":
        srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
    srv.bind((host, int(port))); srv.listen(8)
    print(srv.getsockname()[1], flush=True)
    srv.settimeout(30)
    body = b'{"name": "agent", "state": "ready", "status": "ready"}'
    answer = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body)
    while True:
        try:
            conn, _ = srv.accept()
        except (TimeoutError, OSError):
            break
        conn.settimeout(2)
        got = b""
        try:
            while chunk := conn.recv(65536):
                got += chunk
                if b"\\r\\n\\r\\n" in got:
                    break
        except OSError:
            pass
        record.write(got)
        try:
            conn.sendall(answer)  # believed, if anything is sent
        except OSError:
            pass
        conn.close()
    """
)


@contextmanager
def squatter(
    attacker: Attacker, folder: Path, *, host: str = "127.0.0.1", port: int = 0, defer: bool = False
) -> Iterator[tuple[int, Path]]:
    """A listener run as the attacker (root starts it, it drops its credentials first); yields
    its port and the file of every byte it received."""
    seen = folder / f"seen-{host.replace(':', '_')}-{int(defer)}"
    seen.write_bytes(b"")
    argv = [sys.executable, "-c", _SQUATTER, str(attacker.uid), str(attacker.gid), str(seen)]
    child = subprocess.Popen(
        [*argv, host, str(port), "1" if defer else "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        yield int(child.stdout.readline()), seen
    finally:
        child.kill()
        child.wait(10)
