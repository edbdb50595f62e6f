"""Daemon figures: latency from a save to the relabel, RSS, CPU while idle (~10 s).

Run as root (it makes device nodes): ``python tests/bench/bench_daemon.py``. Prints figures; it
asserts nothing (speed targets live here, never in the test suite).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from helpers import devnodes  # noqa: E402
from helpers.daemon_host import device_of, drop_slot  # noqa: E402


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="hal0-bench-"))
    slots = root / "slots"
    slots.mkdir()
    (root / "amdgpu").mkdir()
    with devnodes.dev_tree() as dev:
        devnodes.char_node(dev.kfd)
        devnodes.char_node(dev.render())
        argv = [
            sys.executable, "-m", "hal0_reconciler", "run",
            "--slots-dir", str(slots), "--state-dir", str(root / "state"),
            "--runtime-dir", str(root / "run"), "--amdgpu-module-dir", str(root / "amdgpu"),
            "--kfd-path", str(dev.kfd), "--dri-dir", str(dev.dri),
            "--profiles-file", str(root / "profiles.toml"), "--user", "54321:54321",
            "--log-format", "json", "--set", "api_url=http://127.0.0.1:9",
            "--set", f"systemctl={root / 'no-systemctl'}",
            # hal0's default image not Vulkan-capable: unpinned gpu-vulkan slots ARE relabelled
            "--set", "default_runner_image=example.org/not-capable:1",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        child = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 20
            while not (root / "run/status.json").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            latencies = []
            for i in range(20):
                started = time.monotonic()
                target = drop_slot(slots, f"bench{i}")
                while device_of(target) != "gpu-rocm":
                    time.sleep(0.001)
                    if time.monotonic() - started > 10:
                        raise SystemExit("no relabel within 10 s")
                latencies.append(time.monotonic() - started)
                time.sleep(0.3)
            proc = psutil.Process(child.pid)
            time.sleep(1.0)
            cpu0 = proc.cpu_times()
            t0 = time.monotonic()
            time.sleep(10.0)
            cpu1 = proc.cpu_times()
            idle = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (time.monotonic() - t0)
            rss = proc.memory_info().rss
        finally:
            child.terminate()
            child.wait(10)
    ms = sorted(x * 1000 for x in latencies)
    print(
        f"save -> relabel latency: median {statistics.median(ms):.0f} ms, "
        f"p90 {ms[int(len(ms) * 0.9) - 1]:.0f} ms, max {ms[-1]:.0f} ms (settle window 200 ms)"
    )
    print(f"RSS: {rss / 2**20:.1f} MiB")
    print(f"CPU while idle: {idle * 100:.2f} % of one core over 10 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
