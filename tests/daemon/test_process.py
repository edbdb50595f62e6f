"""`hal0-reconciler run` as a real process: sd_notify, SIGHUP, SIGTERM, status, metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import status
from helpers.daemon_host import Host, device_of, drop_slot, wait_until
from helpers.lock_holder import holding_lock
from helpers.notify_socket import NotifySocket

REPO = Path(__file__).resolve().parents[2]


def _start(
    host: Host, sock: NotifySocket, *extra: str, stderr: Any = subprocess.PIPE
) -> subprocess.Popen[bytes]:
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
        "--hal0-venv": o["hal0_venv"],
        "--hal0-release-dir": o["hal0_release_dir"],
        "--hal0-config-file": o["hal0_config_file"],
    }
    if "--config" not in extra:
        flags["--log-format"] = "json"
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
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=stderr)


def _settings(host: Host) -> settings_mod.Settings:
    return host.settings()


def _status_slots(host: Host) -> dict[str, Any]:
    try:
        slots: dict[str, Any] = json.loads(status.status_path(_settings(host)).read_text())["slots"]
    except (OSError, ValueError, KeyError):
        return {}
    return slots


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


def test_sighup_applies_a_changed_log_level_and_format(host: Host, tmp_path: Path) -> None:
    """A reload whose settings change log_level/format reconfigures logging in the process."""
    config = tmp_path / "reconciler.toml"
    config.write_text('log_format = "json"\nlog_level = "warning"\n')
    err = tmp_path / "stderr"
    with NotifySocket() as sock, err.open("wb") as sink:
        child = _start(host, sock, "--config", str(config), stderr=sink)
        try:
            sock.wait_for("READY=1", timeout=30)
            first = drop_slot(host.slots, "first")
            wait_until(lambda: device_of(first) == "gpu-rocm", what="relabel while warning")
            # and the pass is over (its event logged): status.json lists the slot only then
            wait_until(lambda: "first.toml" in _status_slots(host), what="the pass noted")
            config.write_text('log_format = "console"\nlog_level = "info"\n')
            child.send_signal(signal.SIGHUP)
            sock.wait_for("READY=1", count=2, timeout=30)
            second = drop_slot(host.slots, "second")
            wait_until(lambda: device_of(second) == "gpu-rocm", what="relabel while info")
            wait_until(lambda: "slot.relabeled" in err.read_text(), what="the info event")
            child.send_signal(signal.SIGTERM)
            returncode = child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
            child.communicate(timeout=5)
    lines = err.read_text().splitlines()
    relabels = [line for line in lines if "slot.relabeled" in line]
    assert 0 == returncode
    assert 1 == len(relabels)  # the first relabel was below the warning level
    assert "second" in relabels[0]
    assert not relabels[0].startswith("{")  # console, not json
    assert 1 == sum("daemon.logging_changed" in line for line in lines)


def _has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open (the worker opens the lock file to wait)."""
    target = os.path.realpath(path)
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == target:
                return True
        except OSError:
            continue
    return False


def test_sigterm_while_waiting_for_hal0s_lock_exits_promptly(host: Host, tmp_path: Path) -> None:
    """A worker waiting for the slot lock gives up on SIGTERM: exit 0 within 5 s, file intact."""
    lock = host.settings().effective_lock_file
    err = tmp_path / "stderr"
    with (
        NotifySocket() as sock,
        err.open("wb") as sink,
        holding_lock(lock),
    ):
        child = _start(host, sock, "--set", "lock_timeout=60", stderr=sink)
        try:
            sock.wait_for("READY=1", timeout=30)
            slot = drop_slot(host.slots, "waiting")
            before = slot.read_bytes()
            wait_until(lambda: _has_open(child.pid, lock), what="the worker waiting for the lock")
            started = time.monotonic()
            child.send_signal(signal.SIGTERM)
            returncode = child.wait(timeout=15)
            elapsed = time.monotonic() - started
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
            child.communicate(timeout=5)
    assert 0 == returncode
    assert elapsed < 5.0
    assert before == slot.read_bytes()
    assert "daemon.worker_abandoned" not in err.read_text()  # it stopped waiting, not abandoned
    logged = [json.loads(line) for line in err.read_text().splitlines() if line.startswith("{")]
    assert "slot.write_abandoned" in {e["event"] for e in logged}
    assert [] == [e for e in logged if e["level"] in {"error", "critical"}]  # an orderly stop


def test_sighup_does_not_report_known_problems_again(host: Host, tmp_path: Path) -> None:
    """After a reload, an unreadable slot that was already reported is not reported again."""
    (host.slots / "broken.toml").write_text("name = \n")
    err = tmp_path / "stderr"
    with NotifySocket() as sock, err.open("wb") as sink:
        child = _start(host, sock, stderr=sink)
        try:
            sock.wait_for("READY=1", timeout=30)
            child.send_signal(signal.SIGHUP)
            sock.wait_for("READY=1", count=2, timeout=30)
            marker = drop_slot(host.slots, "after-reload")  # a pass after the reload
            wait_until(lambda: device_of(marker) == "gpu-rocm", what="a pass after the reload")
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
            child.communicate(timeout=5)
    assert 1 == sum('"slot.unreadable"' in line for line in err.read_text().splitlines())
