"""`hal0-reconciler run` as a real process: sd_notify, SIGHUP, SIGTERM, status, metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import status
from helpers.daemon_host import Host, device_of, drop_slot, wait_until
from helpers.notify_socket import NotifySocket

REPO = Path(__file__).resolve().parents[2]


def _start(host: Host, sock: NotifySocket, *extra: str) -> subprocess.Popen[bytes]:
    o = host.overrides()
    flags = {
        "--slots-dir": o["slots_dir"],
        "--state-dir": o["state_dir"],
        "--runtime-dir": o["runtime_dir"],
        "--amdgpu-module-dir": o["amdgpu_module_dir"],
        "--kfd-path": o["kfd_path"],
        "--dri-dir": o["dri_dir"],
        "--profiles-file": o["profiles_file"],
        "--user": o["service_user"],
        "--log-format": "json",
    }
    argv = [sys.executable, "-m", "hal0_reconciler", "run"]
    for flag, value in flags.items():
        argv += [flag, value]
    for key in ("settle_window", "settle_cap", "api_url", "systemctl", "api_env_file"):
        argv += ["--set", f"{key}={o[key]}"]
    argv += list(extra)
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(sock.path),
        "WATCHDOG_USEC": "400000",
        "PYTHONPATH": str(REPO / "src"),
    }
    env.pop("JOURNAL_STREAM", None)
    env.pop("WATCHDOG_PID", None)
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _settings(host: Host) -> settings_mod.Settings:
    return host.settings()


def test_the_daemon_process_lifecycle(host: Host, tmp_path: Path) -> None:
    """READY after the first pass, RELOADING/READY on SIGHUP, STOPPING and exit 0 on SIGTERM."""
    drop_slot(host.slots, "agent")
    metrics_file = tmp_path / "textfile/hal0_reconciler.prom"
    with NotifySocket() as sock:
        child = _start(host, sock, "--set", f"metrics_textfile={metrics_file}")
        try:
            sock.wait_for("READY=1", timeout=30)
            assert "gpu-rocm" == device_of(host.slots / "agent.toml")
            sock.wait_for("WATCHDOG=1", count=2)
            text, code = status.report(_settings(host))
            assert 0 == code, text
            assert "running" in text
            assert "agent" in text
            assert 'hal0_reconciler_relabels_total{target="gpu-rocm"} 1' in metrics_file.read_text()
            target = drop_slot(host.slots, "second")
            wait_until(lambda: device_of(target) == "gpu-rocm", what="live relabel")
            child.send_signal(signal.SIGHUP)
            sock.wait_for("READY=1", count=2, timeout=30)
            started = time.monotonic()
            child.send_signal(signal.SIGTERM)
            returncode = child.wait(timeout=10)
            elapsed = time.monotonic() - started
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
            _, stderr = child.communicate(timeout=5)
    assert 0 == returncode, stderr.decode()[-2000:]
    assert elapsed < 5.0
    assert ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"] == sock.lifecycle()
    leftovers = [p for d in (host.slots, tmp_path) for p in d.rglob("*") if p.name.endswith(".tmp")]
    assert [] == leftovers
    text, code = status.report(_settings(host))
    assert status.EXIT_NOT_RUNNING == code, text
