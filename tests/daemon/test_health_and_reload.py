"""Honest health for what the real systemd showed, and the synchronous reload.

- A slot folder the daemon cannot write (a real read-only bind mount: EROFS) makes it
  unhealthy: status.json, ``status`` exit 1, STATUS=, WATCHDOG=1 stops; it heals when writable.
- A process table hidden like ``ProcSubset=pid`` hides it (a real ``subset=pid`` procfs) means
  the aiter check cannot run: a warning without a traceback and a status problem at once.
- ``hal0-reconciler reload`` returns only once the daemon has its new settings live.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.quarantine.heal import ProcessScanUnavailable
from hal0_reconciler.daemon import notify, runner, selfheal, status, workqueue
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until
from helpers.lock_holder import holding_lock
from helpers.notify_socket import NotifySocket

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` as a read-only bind mount of itself (writes fail with EROFS) until exit."""
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, timeout=30)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=False, timeout=30)


def test_a_read_only_slot_folder_makes_the_daemon_unhealthy_until_it_is_writable(
    host: Host, notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s while healthy
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    settings = host.settings()
    slot = drop_slot(host.slots, "stuck")
    with read_only(host.slots), running(settings):
        notify_socket.wait_for("READY=1", timeout=30)

        def unhealthy_status() -> dict[str, object] | None:
            try:
                snap = json.loads(status.status_path(settings).read_text())
            except (OSError, ValueError):
                return None
            return snap if snap.get("healthy") is False else None

        snap = wait_until(unhealthy_status, what="status.json to say unhealthy")
        problems = " ".join(snap["problems"])
        assert "slot writes fail" in problems
        assert "Read-only file system" in problems
        text, code = status.report(settings)
        assert (status.EXIT_UNHEALTHY, True) == (code, "unhealthy" in text.splitlines()[0])
        wait_until(
            lambda: any("UNHEALTHY: slot writes fail" in m for m in notify_socket.messages()),
            what="STATUS= to say so",
        )
        seen = len(notify_socket.messages())
        time.sleep(0.6)  # three ping intervals: no WATCHDOG=1 (systemd would restart it)
        assert "WATCHDOG=1" not in notify_socket.messages()[seen:]
        assert "gpu-vulkan" == device_of(slot)
    # writable again (the mount is gone): the next event writes it and health comes back
    with running(settings):
        wait_until(lambda: device_of(slot) == "gpu-rocm", what="the slot written")
        wait_until(lambda: status.report(settings)[1] == status.EXIT_OK, what="healthy again")


@pytest.fixture
def subset_pid_proc() -> Iterator[Path]:
    """A real procfs with ``subset=pid`` (what ProcSubset=pid gives a service)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a procfs")
    where = Path(tempfile.mkdtemp(prefix="hal0-proc-"))
    done = subprocess.run(
        ["mount", "-t", "proc", "-o", "subset=pid", "proc", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a subset=pid procfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False, timeout=30)
        where.rmdir()


def test_a_hidden_process_table_never_reads_as_no_build_running(
    subset_pid_proc: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under a subset=pid procfs (no /proc/stat), a compiler working in the tree is either
    found or the scan fails loudly (psutil 5.9, Debian 12's, needs /proc/stat for any process;
    newer ones do not): never "nothing is building"."""
    jit = tmp_path / "jit"
    jit.mkdir()
    ninja = tmp_path / "ninja"
    ninja.write_bytes(Path("/bin/sleep").read_bytes())
    ninja.chmod(0o755)
    import psutil  # the module heal imports when it scans

    monkeypatch.setattr(psutil, "PROCFS_PATH", str(subset_pid_proc))
    assert not (subset_pid_proc / "stat").exists()
    with subprocess.Popen([str(ninja), "30"], cwd=jit) as build:
        try:
            try:
                busy = heal.build_activity(jit, tmp_path, ["module_x"])
            except heal.ProcessScanUnavailable as exc:
                assert "ProcSubset=pid" in str(exc)  # noqa: PT017 - either outcome is checked
            else:
                assert any(f"compiler pid {build.pid}" in b for b in busy), busy
        finally:
            build.kill()


def test_an_aiter_check_that_cannot_run_is_a_warning_and_a_problem_at_once(
    tmp_path: Path,
) -> None:
    """A ReconcilerError from the check (the process scan unavailable): one warning, no
    traceback, and the status problem from the first failure on (not after three)."""

    class BlindCheck:
        def watch_paths(self) -> list[Path]:
            return []

        def check(self, *, heal: bool) -> object:
            del heal
            raise ProcessScanUnavailable("cannot list processes (FileNotFoundError: /proc/stat)")

    settings = Settings(aiter=AiterSettings(trees=(AiterTree(package_dir=tmp_path),)))
    heal_ = selfheal.SelfHeal(
        settings,
        factory=lambda _s: BlindCheck(),  # type: ignore[arg-type,return-value]
        clock=workqueue.SystemClock(),
    )
    with structlog.testing.capture_logs() as logs:
        assert heal_.check() is False
    assert [("aiter.check_cannot_run", "warning")] == [(e["event"], e["log_level"]) for e in logs]
    assert "exc_info" not in logs[0]
    problem = heal_.problem()
    assert problem is not None
    assert problem.startswith("the aiter check cannot run: cannot list processes")


def _daemon(host: Host, config: Path, sock: NotifySocket) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(sock.path),
        "PYTHONPATH": str(REPO / "src"),
    }
    for name in ("JOURNAL_STREAM", "WATCHDOG_PID", "WATCHDOG_USEC"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "hal0_reconciler", "run", "--config", str(config)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _reload(config: Path, pid: int, runtime_dir: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hal0_reconciler",
            "reload",
            "--config",
            str(config),
            "--runtime-dir",
            runtime_dir,
            "--pid",
            str(pid),
            "--timeout",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=40,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )


def _config_text(host: Host, slots_dir: Path, **extra: object) -> str:
    values = {**host.overrides(), "slots_dir": str(slots_dir), **extra}
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def test_reload_returns_once_the_new_settings_are_live(host: Host, tmp_path: Path) -> None:
    other = tmp_path / "other-slots"
    other.mkdir()
    for name in ("b1", "b2"):
        drop_slot(other, name, "cpu")
    drop_slot(host.slots, "a1", "cpu")
    config = tmp_path / "reconciler.toml"
    config.write_text(_config_text(host, host.slots))
    runtime_dir = host.overrides()["runtime_dir"]
    settings = host.settings()
    with NotifySocket() as sock:
        child = _daemon(host, config, sock)
        try:
            sock.wait_for("READY=1", timeout=30)
            for i, (folder, names) in enumerate(
                [(other, {"b1.toml", "b2.toml"}), (host.slots, {"a1.toml"})] * 3
            ):
                config.write_text(_config_text(host, folder))
                done = _reload(config, child.pid, runtime_dir)
                assert (0, "") == (done.returncode, done.stderr)
                snap = json.loads(status.status_path(settings).read_text())
                assert names == set(snap["slots"]), f"reload {i}"
                assert {"generation": i + 1, "ok": True} == {
                    k: snap["reload"][k] for k in ("generation", "ok")
                }
            # a reload whose first pass waits 6 s for hal0's lock, reported as stuck meanwhile
            # (so status.json is republished during the wait): `reload` returns after the pass
            slow = tmp_path / "slow-slots"
            slow.mkdir()
            slot = drop_slot(slow, "slow")
            text = _config_text(host, slow, stuck_after=1.0, lock_timeout=30.0)
            with holding_lock(Path(f"{slow}.lock"), seconds=6.0):
                config.write_text(text)
                started = time.monotonic()
                done = _reload(config, child.pid, runtime_dir)
                took = time.monotonic() - started
            assert (0, "gpu-rocm") == (done.returncode, device_of(slot)), f"after {took:.1f}s"
            config.write_text("slots_dir = 42\n")
            refused = _reload(config, child.pid, runtime_dir)
            assert 78 == refused.returncode  # the settings file is invalid (EX_CONFIG)
            assert "reload refused" in refused.stderr
            assert f"{config}: setting 'slots_dir' has a bad value 42" in refused.stderr
            assert child.poll() is None  # still running, on the old settings
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=15)
    gone = _reload(config, child.pid, runtime_dir)
    assert 3 == gone.returncode


def test_under_systemd_a_read_only_slot_folder_exits_75_for_a_fresh_view(
    host: Host, notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With INVOCATION_ID (a systemd service), EROFS on slot writes is the sandbox's stale view
    of a re-created /etc/hal0: one error line that says so, then exit 75, which the unit's
    RestartForceExitStatus=75 restarts (not a watchdog abort)."""
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
    settings = host.settings()
    drop_slot(host.slots, "stuck")
    daemon = runner.Runner(settings, notifier=notify.from_environment())
    result: list[int] = []
    with capture_logs() as logs, read_only(host.slots):
        thread = threading.Thread(target=lambda: result.append(daemon.serve()), name="test-75")
        thread.start()
        thread.join(30)
        if thread.is_alive():
            daemon.request_stop()
            thread.join(10)
    daemon.close()
    assert [75] == result
    asked = [e for e in logs if e["event"] == "daemon.restart_requested"]
    assert [f"{host.slots.parent} was re-created; restarting to see it"] == [
        e["message"] for e in asked
    ]
    assert "Read-only file system" in asked[0]["problem"]
