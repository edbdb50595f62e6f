"""hal0's real API: ``hal0 serve`` of a published release, on a free loopback port.

Each release's venv is ``<cache>/hal0ai/venv-<version>/``, fetched, checked and built by
``helpers.hal0_releases`` from the project's release list (``tests/data/hal0-releases.txt``). The server runs
with ``HAL0_HOME=<home>`` (its slot files in ``<home>/etc/hal0/slots``) in a private mount
namespace whose ``/etc`` is an overlay: hal0 writes its slot units to the fixed
``/etc/containers/systemd`` (and 0.9.8 to ``/etc/systemd/system``) when a load gets that far, and
none of that reaches the host. ``systemctl`` and ``podman`` on its ``PATH`` are stubs that fail,
so no release starts a unit on the host whatever the host runs: a slot with a model ends in
``error`` when loaded, one without a model stays ``offline``.

Every wait has a bound: the start (``START_TIMEOUT``), each request (``REQUEST_TIMEOUT``), the
stop (SIGTERM, then SIGKILL of the process group).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hal0_reconciler import lifecycle
from helpers import hal0_releases

RELEASES = tuple(r.version for r in hal0_releases.releases())  # the project's list, oldest first
START_TIMEOUT = 90.0  # a cold start (no .pyc yet) takes ~15 s; a warm one 2-3 s
REQUEST_TIMEOUT = 30.0
STUB = '#!/bin/sh\necho "$0: not available under test" >&2\nexit 1\n'


def venv_dir(version: str) -> Path:
    return hal0_releases.cache_dir() / f"venv-{version}"


def unavailable(version: str) -> str | None:
    """Why this release's server cannot run here (None: it can); builds a missing venv."""
    release = next((r for r in hal0_releases.releases() if r.version == version), None)
    if release is None:
        return f"hal0ai {version} is not in the project's release list"
    try:
        hal0_releases.ensure_venv(release)
    except hal0_releases.ReleaseUnavailableError as exc:
        return str(exc)
    if not (venv_dir(version) / "bin/hal0").is_file():
        return f"hal0ai {version}: its venv {venv_dir(version)} has no bin/hal0"
    for tool in ("unshare", "mount", "setpriv"):
        if shutil.which(tool) is None:
            return f"hal0ai {version}: {tool} is missing (the server runs in its own mount space)"
    if os.geteuid() != 0:
        return f"hal0ai {version}: needs root (a private mount namespace keeps hal0 off /etc)"
    return None


def skip_or_fail(version: str) -> None:
    """Skip with the reason when the release cannot run here; with CI=true, fail instead."""
    import pytest

    reason = unavailable(version)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any  # the JSON document (a dict, or a list for the slot list); None when not JSON
    raw: bytes


_NAMESPACE_SCRIPT = """
set -e
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc
if [ -e /usr/bin/podman ]; then mount --bind "$1/bin/podman" /usr/bin/podman; fi
if [ -n "$HAL0_TEST_OPEN_ROOT" ]; then
  # an unprivileged hal0 must reach a Python under root's 0700 home (pyenv): in this
  # namespace only, /root becomes a 0755 tmpfs holding root's folders bound back in
  mkdir -p "$1/root"
  mount --rbind /root "$1/root"
  mount -t tmpfs -o mode=0755 tmpfs /root
  for d in "$1"/root/.[!.]* "$1"/root/*; do
    [ -d "$d" ] || continue
    mkdir -p "/root/${d##*/}" && mount --rbind "$d" "/root/${d##*/}"
  done
fi
shift
exec "$@"
"""


class RealHal0Api(lifecycle.StartStop):
    """``hal0 serve`` of one release; ``admin_key``: HAL0_ADMIN_KEY set and require_auth on;
    ``uid``: run as that uid (its gid the same) instead of root."""

    def __init__(
        self,
        version: str,
        home: Path,
        *,
        admin_key: str | None = None,
        uid: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.version = version
        self.home = home
        self.admin_key = admin_key
        self.uid = uid
        self.extra_env = env or {}
        self.port = 0
        self.started_in = 0.0
        self.boot_errors: list[str] = []  # what each health poll before the first 200 met
        self.log_path = home / "hal0-serve.log"
        self.slots = home / "etc/hal0/slots"
        self._work = home / ".namespace"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_slot(self, name: str, text: str) -> Path:
        path = self.slots / f"{name}.toml"
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        if self.uid is not None:
            os.chown(tmp, self.uid, self.uid)
        tmp.rename(path)
        return path

    def _prepare(self) -> list[str]:
        self.slots.mkdir(parents=True, exist_ok=True)
        for sub in ("upper", "work", "bin"):
            (self._work / sub).mkdir(parents=True, exist_ok=True)
        for tool in ("systemctl", "podman", "journalctl"):
            stub = self._work / "bin" / tool
            stub.write_text(STUB)
            stub.chmod(0o755)
        if self.uid is not None:
            for path in [self.home, *self.home.rglob("*")]:
                if self._work not in path.parents and path != self._work:
                    os.lchown(path, self.uid, self.uid)
        command = self._serve_argv()
        if self.uid is not None:
            setpriv = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
            command = [*setpriv, "--", *command]
        return [
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", _NAMESPACE_SCRIPT, "hal0-test-namespace", str(self._work), *command,
        ]  # fmt: skip

    def _serve_argv(self) -> list[str]:
        hal0 = str(venv_dir(self.version) / "bin/hal0")
        return [hal0, "serve", "--host", "127.0.0.1", "--port", str(self.port)]

    def _environment(self) -> dict[str, str]:
        env = {
            "PATH": f"{self._work / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "HAL0_HOME": str(self.home),
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
            "TERM": "dumb",
            "COLUMNS": "200",
        }
        if self.admin_key is not None:
            env |= {"HAL0_ADMIN_KEY": self.admin_key, "HAL0_REQUIRE_AUTH": "1"}
        if self.uid is not None and not Path("/root").stat().st_mode & 0o001:
            env["HAL0_TEST_OPEN_ROOT"] = "1"
        return env | self.extra_env

    def start(self) -> None:
        last = ""
        for _attempt in range(3):  # the free port may be taken between the probe and the bind
            self.port = free_port()
            argv = self._prepare()
            began = time.monotonic()
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    argv,
                    env=self._environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            last = self._wait_up(began)
            if not last:
                self.started_in = time.monotonic() - began
                return
            self.stop()
            if "address already in use" not in last.lower():
                break
        msg = f"hal0ai {self.version} did not come up: {last}"
        raise RuntimeError(msg)

    def _wait_up(self, began: float) -> str:
        """'' when GET /api/health answers 200; else why not (the log's last lines)."""
        assert self._proc is not None
        while time.monotonic() - began < START_TIMEOUT:
            if self._proc.poll() is not None:
                return f"exited {self._proc.returncode}: {self.log_tail()}"
            try:
                status = self.request("GET", "/api/health", timeout=2).status
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self.boot_errors.append(type(exc).__name__)
            else:
                if status == 200:
                    return ""
                self.boot_errors.append(f"HTTP {status}")
            time.sleep(0.2)
        return f"no answer to GET /api/health within {START_TIMEOUT:g}s: {self.log_tail()}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return " | ".join(self.log_text().strip().splitlines()[-lines:])

    def access_log(self) -> list[str]:
        """uvicorn's access lines: ``POST /api/slots/x/restart 500`` per request, in order."""
        found = []
        for line in self.log_text().splitlines():
            if ' - "' in line and "HTTP/1.1" in line:
                request = line.split(' - "', 1)[1]
                method_path, _, status = request.partition('" ')
                found.append(f"{method_path.removesuffix(' HTTP/1.1')} {status.split()[0]}")
        return found

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        key: str | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Reply:
        """One request on its own connection; ``key``: sent as the bearer token."""
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=b"" if method == "POST" else None, headers=sent)
            response = conn.getresponse()
            raw = response.read(4 << 20)
        finally:
            conn.close()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return Reply(response.status, body, raw)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def describe(self) -> str:
        return f"hal0ai {self.version} at {self.url} ({shlex.join(self._serve_argv())})"
