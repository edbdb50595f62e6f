"""hal0's admin key only reaches hal0: a port squatter gets nothing and is not believed.

An unprivileged user binds the API's port while hal0-api is down (it refuses connections for its
whole boot) and answers every request with 200 ``ready``. The restarter connects, finds that the
socket at the other end belongs to that user (not root, not hal0-api's ``User=``), and sends
nothing: no key, no request line. Its 200 is never read, so nothing counts as restarted.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host import hal0_api, peer, units
from helpers.attacker import Attacker, Tally
from helpers.fake_systemctl import FakeSystemctl, restarter_overrides

pytestmark = pytest.mark.timeout(60)

_SQUATTER = textwrap.dedent(
    """
    import os, socket, sys
    uid, gid, seen = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.setgroups([]); os.setgid(gid); os.setuid(uid)  # the attacker from here on
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0)); srv.listen(8)
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
        with open(seen, "ab") as fh:
            fh.write(got)
        try:
            conn.sendall(answer)  # believed, if anything is sent
        except OSError:
            pass
        conn.close()
    """
)


@contextmanager
def squatter(attacker: Attacker, folder: Path) -> Iterator[tuple[int, Path]]:
    """A listener run as the attacker (root starts it, it drops its credentials first); yields
    its port and the file of every byte it received."""
    seen = folder / "seen"
    seen.write_bytes(b"")
    attacker.chown(seen)
    child = subprocess.Popen(
        [sys.executable, "-c", _SQUATTER, str(attacker.uid), str(attacker.gid), str(seen)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        yield port, seen
    finally:
        child.kill()
        child.wait(10)


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
    attacks.held("api-port-squatter")


def test_the_proc_table_fallback_names_the_squatter_too(
    tmp_path: Path, attacker: Attacker, attacks: Tally
) -> None:
    """Without sock_diag (a sandbox may refuse netlink), the /proc/net/tcp scan finds the
    same owner: the attacker's uid, never root's."""
    attacks.tried("api-port-squatter-proc")
    with squatter(attacker, tmp_path) as (port, _seen):
        import socket

        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            by_proc = peer.peer_of(sock, netlink=False)
            by_netlink = peer.peer_of(sock)
    assert (attacker.uid, attacker.uid) == (by_proc.uid, by_netlink.uid)
    attacks.held("api-port-squatter-proc")


def test_the_accepted_owners_are_root_and_hal0_apis_user(
    tmp_path: Path, attacker: Attacker
) -> None:
    """User= is read from hal0-api's unit (the last one wins); the setting overrides it."""
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
    assert "hal0" == hal0_api.service_user(missing)
