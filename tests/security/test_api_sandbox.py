"""The API peer check where the daemon really runs: inside the unit's address-family sandbox
(no netlink: /proc alone says who listens), and with ``api_url`` naming ``localhost``, which
Debian's /etc/hosts makes two addresses (``::1`` first).

The shipped unit's ``RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6`` is reproduced for real
by a seccomp filter equal to systemd's (``socket(AF_NETLINK)`` fails with EAFNOSUPPORT); no
systemd runs as PID 1 on the test host, so ``systemd-run -p RestrictAddressFamilies=`` is not
available there (tests/system runs the real unit). The second /etc/hosts is bind-mounted in a
private mount namespace (``unshare -m``): the host's own file is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from helpers import restrict_families
from helpers.attacker import Attacker, Tally
from helpers.hosts import REPO
from helpers.squatter import squatter

pytestmark = pytest.mark.timeout(60)

_CLIENT = """
import errno, json, socket, sys
from structlog.testing import capture_logs
from hal0_reconciler import settings
from hal0_reconciler.host.restarts import api as hal0_api, peer
url, env, units = sys.argv[1:4]
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4).close()
    netlink = "allowed"
except OSError as exc:
    netlink = errno.errorcode[exc.errno]
host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
host = host.strip("[]")
order = [a[4][0] for a in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)]
client = hal0_api.Hal0Client(
    settings.load(None, {"api_url": url, "api_env_file": env, "hal0_api_unit_dirs": [units]})
)
with capture_logs() as logs:
    try:
        outcome = ["answered", client.get("/api/health").body]
    except hal0_api.ApiError as exc:
        outcome = [type(exc).__name__, str(exc)]
events = [{k: v for k, v in e.items() if k in ("event", "uid", "address", "action")} for e in logs]
print(json.dumps({"netlink": netlink, "order": order, "outcome": outcome, "events": events}))
"""


def _run(prefix: list[str], url: str, tmp_path: Path) -> dict[str, object]:
    env_file = tmp_path / "api.env"
    env_file.write_text("HAL0_ADMIN_KEY=the-admin-key\n")
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    argv = [*prefix, sys.executable, "-c", _CLIENT, url, str(env_file), str(tmp_path / "none")]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=environment, timeout=40, check=False
    )
    assert 0 == done.returncode, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_inside_the_units_sandbox_the_proc_table_refuses_a_defer_accept_squatter(
    tmp_path: Path, attacker: Attacker, attacks: Tally, host: str
) -> None:
    """No netlink (the unit's RestrictAddressFamilies, for real): the /proc/net/tcp{,6} answer
    names the attacker's listener and nothing is sent; IPv4 and IPv6."""
    attacks.tried("api-defer-accept-squatter-sandboxed")
    helper = restrict_families.build(tmp_path)
    with squatter(attacker, tmp_path, host=host, defer=True) as (port, seen):
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        result = _run([str(helper)], url, tmp_path)
        time.sleep(0.2)
        received = seen.read_bytes()
    assert "EAFNOSUPPORT" == result["netlink"], "the sandbox did not refuse netlink"
    assert "ApiUntrusted" == result["outcome"][0], result  # type: ignore[index]
    assert [attacker.uid] == [
        e["uid"]
        for e in result["events"]
        if e["event"] == "api.untrusted_listener"  # type: ignore[attr-defined]
    ]
    assert b"" == received
    attacks.held("api-defer-accept-squatter-sandboxed")


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status": "ok", "by": "root"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@contextmanager
def roots_api() -> Iterator[int]:
    """hal0-api's stand-in, root's, on 127.0.0.1; yields its port."""
    server = HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_localhost_tries_127_0_0_1_after_refusing_the_attackers_ipv6_listener(
    tmp_path: Path, attacker: Attacker, attacks: Tally
) -> None:
    """``api_url = "http://localhost:PORT"`` with Debian's ``::1 localhost``: the attacker on
    ``[::1]:PORT`` is refused (nothing sent), and 127.0.0.1, where hal0-api is, answers."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount for a private /etc/hosts")
    attacks.tried("api-localhost-ipv6-squatter")
    hosts = tmp_path / "hosts"
    hosts.write_text("::1 localhost ip6-localhost ip6-loopback\n127.0.0.1 localhost\n")
    with roots_api() as port, squatter(attacker, tmp_path, host="::1", port=port) as (_p, seen):
        with_hosts = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind "{hosts}" /etc/hosts && exec "$0" "$@"',
        ]
        result = _run(with_hosts, f"http://localhost:{port}", tmp_path)
        time.sleep(0.2)
        received = seen.read_bytes()
    assert ["::1", "127.0.0.1"] == result["order"], "the private /etc/hosts is not in effect"
    assert ["answered", {"status": "ok", "by": "root"}] == result["outcome"]
    events = result["events"]
    assert [(attacker.uid, f"[::1]:{port}", True)] == [
        (e["uid"], e["address"], e["action"].endswith("the next address is tried"))
        for e in events
        if e["event"] == "api.untrusted_listener"  # type: ignore[attr-defined]
    ]
    assert ["api.url_names_a_host"] == [
        e["event"] for e in events if e["event"] == "api.url_names_a_host"
    ]  # type: ignore[attr-defined]
    assert b"" == received
    attacks.held("api-localhost-ipv6-squatter")


def test_a_literal_address_is_said_nothing_about(tmp_path: Path) -> None:
    """A literal api_url is tried once, without the warning a host name gets."""
    with roots_api() as port:
        result = _run([], f"http://127.0.0.1:{port}", tmp_path)
    assert "answered" == result["outcome"][0]  # type: ignore[index]
    assert [] == [e for e in result["events"] if e["event"] == "api.url_names_a_host"]  # type: ignore[attr-defined]


def test_every_address_refused_reports_the_untrusted_one(
    tmp_path: Path, attacker: Attacker
) -> None:
    """localhost where the attacker holds [::1] and nothing listens on 127.0.0.1: untrusted
    (the squatter named), never a bare "refused"."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare")
    hosts = tmp_path / "hosts"
    hosts.write_text("::1 localhost\n127.0.0.1 localhost\n")
    with squatter(attacker, tmp_path, host="::1") as (port, _seen):
        with socket.socket() as probe:  # is 127.0.0.1:port free? (nothing listens there)
            free = probe.connect_ex(("127.0.0.1", port)) != 0
        if not free:
            pytest.skip("the port is taken on 127.0.0.1")
        with_hosts = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind "{hosts}" /etc/hosts && exec "$0" "$@"',
        ]
        result = _run(with_hosts, f"http://localhost:{port}", tmp_path)
    assert "ApiUntrusted" == result["outcome"][0], result  # type: ignore[index]
    last = [e for e in result["events"] if e["event"] == "api.untrusted_listener"]  # type: ignore[attr-defined]
    assert last[-1]["action"].endswith("the next address is tried")  # [::1] came first
