"""hal0's real API as a systemd unit: a relabelled slot restarted through it, end to end.

A booted Debian 12 (systemd 252) with the package installed, and a published hal0 release
(1.3.0, the last allowlist one, and 1.7.0, the newest) installed where hal0 installs itself
(``/usr/lib/hal0/venv``, FHS paths: ``/etc/hal0/slots``, ``/var/lib/hal0``;
``/usr/lib/hal0/current/{VERSION,manifest.json}``), run by a ``hal0-api.service`` unit.
hal0 needs Python >= 3.12 and Debian 12 has 3.11: the release's test venv is bound in together
with the Python 3.12 it was built with (built on Debian 12, so it runs in this root), which
stands in for the Debian 13 root of the plan. No podman and no model here: the slot's unit
(``hal0-slot@.service``, as Quadlet would generate it) runs a small model server answering
llama-server's ``/health``, ``/metrics`` (``llamacpp:requests_*``, busy while
``/run/fake-model/busy/<slot>`` exists) and the sanity prompt; ``HAL0_CONTAINER_RUNTIME`` points
hal0 at a ``podman`` that only logs. Everything else is hal0's own code under real systemd:
it adopts the running unit as ``ready``, scrapes its counters, and its restart stops and starts
the unit, waits for health and runs its output-sanity probe.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import hal0_real_api, hal0_releases, nspawn, rootfs
from system.conftest import DEV, FILES, FakeDev
from system.test_in_systemd import (
    SLOTS,
    UNIT,
    amd_settings,
    configure,
    device_of,
    invocation,
    journal_entries,
    show,
    status_json,
    wait_until,
)

pytestmark = pytest.mark.timeout(900)

# The last allowlist release and the newest (pins era: its runner images come from
# /usr/lib/hal0/current/manifest.json, which the wheel does not ship: MANIFEST is written).
RELEASES = ("1.3.0", "1.7.0")
MANIFEST = {
    "runners": {
        "standard": {
            "image": "ghcr.io/hal0ai/hal0-standard",
            "tag": "test",
            "digest": None,
            "lanes_gated": ["vulkan"],
        },
        "cpu": {
            "image": "ghcr.io/hal0ai/hal0-cpu",
            "tag": "test",
            "digest": None,
            "lanes_gated": [],
        },
    }
}
VENV = "/usr/lib/hal0/venv"
MODEL_SERVER = r'''#!/usr/bin/python3
"""llama-server's surface that hal0 uses, for the slot named in argv[1] (its port from the
slot file): /health, /metrics, /v1/models, and the sanity prompt answered with Paris."""
import http.server, json, os, re, sys

name = sys.argv[1]
text = open(f"/etc/hal0/slots/{name}.toml").read()
port = int(re.search(r"^port\s*=\s*(\d+)", text, re.M)[1])

class Handler(http.server.BaseHTTPRequestHandler):
    def send(self, code, body, kind="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.startswith("/health"):
            return self.send(200, {"status": "ok"})
        if self.path.startswith("/metrics"):
            busy = int(os.path.exists(f"/run/fake-model/busy/{name}"))
            metrics = f"llamacpp:requests_processing {busy}\nllamacpp:requests_deferred 0\n"
            return self.send(200, metrics, "text/plain; version=0.0.4")
        if self.path.startswith("/v1/models"):
            return self.send(200, {"data": [{"id": "m"}]})
        return self.send(404, {"error": "not found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/completion"):
            return self.send(200, {"content": " Paris, of course."})
        if "chat/completions" in self.path:
            message = {"role": "assistant", "content": "Paris"}
            return self.send(200, {"choices": [{"index": 0, "message": message}]})
        return self.send(404, {"error": "not found"})

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''
SLOT_UNIT = """[Unit]
Description=model server of hal0 slot %i (stands in for the Quadlet-generated unit)

[Service]
ExecStartPre=/bin/mkdir -p /run/fake-model/busy
ExecStart=/usr/local/bin/fake-model-server %i
"""
API_UNIT = f"""[Unit]
Description=hal0 API (a real hal0ai release)
After=network.target

[Service]
Environment=HAL0_CONTAINER_RUNTIME=/usr/local/bin/podman
ExecStart={VENV}/bin/python -c "import sys; from hal0.cli.main import app; sys.argv[0] = 'hal0'; sys.exit(app())" serve --host 127.0.0.1 --port 8080
"""
PODMAN = '#!/bin/sh\necho "podman $*" >> /run/podman.log\nexit 0\n'
NOT_CAPABLE = "ghcr.io/ggml-org/llama.cpp:server-vulkan"  # an own image: neither capable nor stale
# No /dev/kfd in the container: hal0's gpu-rocm load would refuse, so the reconciler is told
# the ROCm lane is absent and relabels to cpu (a load hal0 runs without any GPU check).
FAST = {
    "idle_recheck": 0.2,
    "idle_confirm": 0.0,
    "restart_min_interval": 0.0,
    "kfd_path": f"{DEV}/no-kfd",
}


def _slot(name: str, port: int, *, pin: str | None = None) -> str:
    """A gpu-vulkan slot: unpinned, hal0 1.3.0's bundled image (capable); pinned to an image
    outside hal0's capable set, it cannot serve Vulkan."""
    pinned = f'image_pin = "{pin}"\n' if pin else ""
    return (
        f"# slot {name}, on the Vulkan lane\n"
        f'name = "{name}"\ntype = "llm"\ndevice = "gpu-vulkan"\nport = {port}\n{pinned}\n'
        '[model]\ndefault = "m"\n'
    )


def _venv_python_home(venv: Path) -> Path:
    """The folder of the interpreter the venv was built with (``home`` in pyvenv.cfg)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent  # .../versions/3.12.1 (bin/ is in it)
    msg = f"{venv}/pyvenv.cfg names no home"
    raise RuntimeError(msg)


@pytest.fixture(scope="module", params=RELEASES)
def real_box(
    request: pytest.FixtureRequest, deb: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[nspawn.Container]:
    release = request.param
    hal0_real_api.skip_or_fail(release)
    venv = hal0_releases.cache_dir() / f"venv-{release}"
    python_home = _venv_python_home(venv)
    root = rootfs.ensure()
    files = tmp_path_factory.mktemp("files")
    shutil.copy2(deb, files / deb.name)
    dev = Path(tempfile.mkdtemp(prefix="hal0-nspawn-dev-"))
    box = nspawn.Container(
        root=root,
        binds={files: FILES, dev: DEV},
        binds_ro={venv: VENV, python_home: str(python_home)},  # the shared test cache
        log_path=files.parent / "console.log",
    )
    box.dev = FakeDev(dev)  # type: ignore[attr-defined]
    box.release = release  # type: ignore[attr-defined]
    try:
        box.boot()
        box.run(f"apt install -y {FILES}/{deb.name}", timeout=120)
        box.write("/usr/lib/hal0/current/VERSION", f"{release}\n")
        box.write("/usr/lib/hal0/current/manifest.json", json.dumps(MANIFEST, indent=2))
        box.write("/usr/local/bin/fake-model-server", MODEL_SERVER, mode="0755")
        box.write("/usr/local/bin/podman", PODMAN, mode="0755")
        box.write("/etc/systemd/system/hal0-slot@.service", SLOT_UNIT)
        box.write("/etc/systemd/system/hal0-api.service", API_UNIT)
        box.run("systemctl daemon-reload")
        yield box
    finally:
        box.shutdown()
        shutil.rmtree(dev, ignore_errors=True)


def _api(box: nspawn.Container, method: str, path: str) -> tuple[int, object]:
    code = (
        "import json, urllib.request as u, urllib.error as e\n"
        f"r = u.Request('http://127.0.0.1:8080{path}', method={method!r}, "
        f"data=b'' if {method!r} == 'POST' else None)\n"
        "try:\n    a = u.urlopen(r, timeout=60); print(a.status); print(a.read().decode())\n"
        "except e.HTTPError as x:\n    print(x.code); print(x.read().decode())\n"
    )
    done = box.run(f"python3 -c {shlex.quote(code)}", check=False, timeout=90)
    if done.returncode != 0:
        return 0, done.stderr.strip().splitlines()[-1:]
    status, _, body = done.stdout.partition("\n")
    return int(status), json.loads(body or "null")


def _serving(box: nspawn.Container, name: str, port: int) -> None:
    """Start the slot's unit and wait for its model server's own ``/health``. hal0 adopts an
    active unit whose ``/health`` refuses as ``warming`` and never promotes it by polling, so a
    slot asked about between its start and its listen would stay warming: a running slot hal0
    adopts is one already serving."""
    box.run(f"systemctl start hal0-slot@{name}")
    code = (
        "import urllib.request as u\n"
        f"print(u.urlopen('http://127.0.0.1:{port}/health', timeout=5).status)\n"
    )
    wait_until(
        f"hal0-slot@{name} answering /health",
        lambda: box.run(f"python3 -c {shlex.quote(code)}", check=False, timeout=30).returncode == 0,
        30,
    )


def _hal0_up(box: nspawn.Container) -> None:
    box.run("systemctl reset-failed hal0-api; systemctl restart hal0-api")
    wait_until(
        "hal0-api answering /api/health", lambda: _api(box, "GET", "/api/health")[0] == 200, 90
    )


def _state(box: nspawn.Container, name: str) -> str:
    status, body = _api(box, "GET", f"/api/slots/{name}/state")
    return str(body.get("state")) if status == 200 and isinstance(body, dict) else f"{status}"


def _restart_posts(box: nspawn.Container, name: str) -> int:
    said = box.run("journalctl --no-pager -o cat -u hal0-api", check=False).stdout
    return said.count(f'"POST /api/slots/{name}/restart HTTP/1.1" 200')


def test_a_relabelled_slot_is_restarted_through_the_real_hal0_api(real_box) -> None:
    """hal0 adopts the running slot as ready with counters at 0; the reconciler relabels it,
    asks the real hal0-api (peer check, no key needed: enforcement off), hal0 restarts the
    unit and answers ready after its own health and sanity checks; hal0's activity log names
    the reconciler."""
    box = real_box
    box.write(f"{SLOTS}/chat.toml", _slot("chat", 8090))
    _serving(box, "chat", 8090)
    _hal0_up(box)
    health = _api(box, "GET", "/api/health")[1]
    assert {"status": "ok", "name": "hal0", "version": box.release} == health
    wait_until("hal0 adopting the running slot", lambda: _state(box, "chat") == "ready", 30)
    metrics = _api(box, "GET", "/api/slots/metrics")[1]
    assert isinstance(metrics, dict)
    assert (0, 0) == (metrics["chat"]["requests_processing"], metrics["chat"]["requests_deferred"])
    before = show(box, "hal0-slot@chat")["InvocationID"]
    assert "gpu-vulkan" == device_of(box, "chat"), "hal0's boot pass kept it (capable)"
    box.write(f"{SLOTS}/chat.toml", _slot("chat", 8090, pin=NOT_CAPABLE))
    configure(box, amd_settings(**FAST))
    since = invocation(box)
    wait_until("the relabel", lambda: device_of(box, "chat") == "cpu", 30)
    wait_until(
        "hal0 restarting hal0-slot@chat",
        lambda: show(box, "hal0-slot@chat").get("InvocationID", "") not in {before, ""},
        120,
    )
    wait_until("the reconciler hearing hal0's answer", lambda: _restart_posts(box, "chat") == 1, 60)
    logged = journal_entries(box, f"-u {UNIT} _SYSTEMD_INVOCATION_ID={since}")
    done = [e for e in logged if e.get("EVENT") == "unit.restarted" and e.get("SLOT") == "chat"]
    assert done, [e.get("EVENT") for e in logged]
    assert ("hal0-api", "ready") == (done[0].get("VIA"), done[0].get("STATE"))
    assert "ready" == _state(box, "chat")
    records = _api(box, "GET", "/api/activity?limit=50")[1]
    assert isinstance(records, dict)
    ours = [r for r in records["records"] if r.get("action") == "slot.restart"]
    assert [("chat", "mcp:hal0-reconciler", "ok")] == [
        (r["target"], r["actor"], r["outcome"]) for r in ours
    ]


def test_a_busy_slot_waits_for_hal0s_counters_to_say_idle(real_box) -> None:
    """The counters hal0 scrapes from the slot say one request in flight: the restart waits
    (status says busy), nothing is posted; once they say 0 the slot is restarted."""
    box = real_box
    box.run("mkdir -p /run/fake-model/busy && touch /run/fake-model/busy/voice")
    box.write(f"{SLOTS}/voice.toml", _slot("voice", 8091))
    _serving(box, "voice", 8091)
    wait_until("hal0 adopting voice", lambda: _state(box, "voice") == "ready", 30)
    configure(box, amd_settings(**FAST))
    box.write(f"{SLOTS}/voice.toml", _slot("voice", 8091, pin=NOT_CAPABLE))
    wait_until("the relabel", lambda: device_of(box, "voice") == "cpu", 30)
    waits = wait_until(
        "status saying the restart waits while busy",
        lambda: ((status_json(box).get("restarts") or {}).get("waiting") or {}).get("voice"),
    )
    assert str(waits).startswith("busy ("), waits
    assert 0 == _restart_posts(box, "voice")
    box.run("rm /run/fake-model/busy/voice")
    wait_until("the restart once idle", lambda: _restart_posts(box, "voice") == 1, 60)
