"""The daemon as a service sees it, for this checkout and a baseline's tree in the same run:
save -> relabel latency (atomic saves one at a time; an in-place writer, which must never be
read torn), and idle (wake-ups per second of all its threads, RSS, threads). Used by
``run_all.py`` (``--only latency,inplace,idle``); asserts nothing.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import baselines
import psutil
import world as world_mod

from helpers.notify_socket import NotifySocket


@contextlib.contextmanager
def daemon(
    w: world_mod.World,
    source: baselines.Source = baselines.OURS,
    *,
    log: Path | None = None,
    **settings: str,
) -> Iterator[tuple[psutil.Process, NotifySocket]]:
    """``run`` of ``source``'s tree on the world, until READY=1; stopped (SIGTERM) at exit.
    ``log``: its JSON log lines go there."""
    sock = NotifySocket()
    sock.start()
    env = {**world_mod.env(), "NOTIFY_SOCKET": str(sock.path), "PYTHONPATH": str(source.src)}
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(log.open("ab")) if log is not None else subprocess.DEVNULL
        child = subprocess.Popen(
            baselines.settable(source, w.argv("run", "--log-format", "json", **settings)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            sock.wait_for("READY=1", timeout=300)
            yield psutil.Process(child.pid), sock
        finally:
            child.terminate()
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            sock.stop()


def relabelled(path: Path) -> bool:
    try:
        return b'"gpu-rocm"' in path.read_bytes()
    except OSError:
        return False


def wait_relabelled(path: Path, timeout: float = 30) -> float:
    """Seconds until ``path`` says gpu-rocm (polled every 0.2 ms)."""
    start = time.monotonic()
    while not relabelled(path):
        if time.monotonic() - start > timeout:
            raise SystemExit(f"{path} not relabelled within {timeout}s")
        time.sleep(0.0002)
    return time.monotonic() - start


QUIET = 0.35
"""Seconds between two saves: the echo of the daemon's own write is done by then (a 200 ms
settle and its pass, for a daemon that settles it), so no save waits behind the last one."""


def atomic_saves(w: world_mod.World, source: baselines.Source, saves: int) -> list[float]:
    """Seconds from each rename (hal0's save: temp file, rename) to the relabel seen."""
    w.refill(1000, device="gpu-rocm")
    latencies = []
    with daemon(w, source):
        time.sleep(1.0)
        for i in range(saves):
            target = w.slots / f"s{i % 1000}.toml"
            tmp = target.with_name(f".{target.name}.hal0tmp")
            tmp.write_text(world_mod.slot_text(i % 1000))
            t0 = time.monotonic()
            tmp.rename(target)
            latencies.append(time.monotonic() - t0 + wait_relabelled(target))
            time.sleep(QUIET)
    return latencies


def in_place_saves(
    w: world_mod.World, source: baselines.Source, saves: int
) -> tuple[list[float], int]:
    """An in-place writer (truncate, three writes 2 ms apart, close): seconds from its close
    to the relabel, and how many times the daemon read the file torn (reported it unreadable,
    or left it other than the whole text relabelled)."""
    w.refill(1000, device="gpu-rocm")
    latencies: list[float] = []
    torn = 0
    with tempfile.TemporaryDirectory(prefix="hal0-bench-log-") as folder:
        log = Path(folder) / "daemon.log"
        with daemon(w, source, log=log):
            time.sleep(1.0)
            for i in range(saves):
                target = w.slots / f"s{i % 1000}.toml"
                text = world_mod.slot_text(i % 1000).encode()
                cut = text.index(b'device = "') + len(b'device = "gp')  # mid-string: no TOML
                parts = (text[:cut], text[cut : cut + 40], text[cut + 40 :])
                fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
                try:
                    for n, part in enumerate(parts):
                        if n:
                            time.sleep(0.002)
                        os.write(fd, part)
                finally:
                    os.close(fd)
                t0 = time.monotonic()
                latencies.append(time.monotonic() - t0 + wait_relabelled(target))
                time.sleep(QUIET)
                whole = text.replace(b'"gpu-vulkan"', b'"gpu-rocm"')
                torn += int(target.read_bytes() != whole)
        torn += log.read_bytes().count(b"slot.unreadable")
    return latencies, torn


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def _switches(proc: psutil.Process) -> int:
    """Voluntary context switches of every thread of ``proc``, now."""
    total = 0
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def idle(
    w: world_mod.World, source: baselines.Source, seconds: float
) -> tuple[float, float, int, list[str]]:
    """After READY and 5 s of quiet: wake-ups per second (voluntary context switches of all
    threads over ``seconds``), RSS (MB), the thread count and the threads' kernel names."""
    w.refill(1000, device="gpu-rocm")
    with daemon(w, source) as (proc, _):
        time.sleep(5.0)
        before = _switches(proc)
        time.sleep(seconds)
        wakeups = (_switches(proc) - before) / seconds
        rss = proc.memory_info().rss / 1e6
        names = sorted(
            (t / "comm").read_text().strip() for t in Path(f"/proc/{proc.pid}/task").iterdir()
        )
    return wakeups, rss, len(names), names
