"""Every benchmark at one size, ONE table of figures and ratios measured in this run.

    python tests/bench/run_all.py [--size 1000] [--repeats 3] [--only relabel,aiter,...]
                                  [--installed VENV] [--base 6aef203] [--saves 200]
                                  [--idle-seconds 60]

Run as root (device nodes, the probe). The daemon's figures (``ready``, ``burst``, ``latency``,
``inplace``, ``idle``) are paired against a recorded baseline commit (``--base``, default
``6aef203`` = 0.2.0; ``12f8b41`` = 0.1.0; ``none``: ours only), its ``src/`` extracted and
run by the same interpreter. Each pair (ours, baseline) is measured back to back,
``--repeats`` times; the table shows min / median / max of the per-pair ratio (and of our own
figure). Figures, never assertions: speed targets live here, not in the test suite.

The slot world is an AMD host with a usable ROCm lane and a hal0 of the "ade07ba" era, whose
default image is not Vulkan-capable: every unpinned ``gpu-vulkan`` slot is relabelled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import baselines  # noqa: E402
import bench_latency  # noqa: E402
import world as world_mod  # noqa: E402


@dataclass
class Row:
    measure: str
    ours: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    unit: str = "s"
    target: str = ""
    note: str = ""
    ratio_of: str = "ours/base"

    def ratios(self) -> list[float]:
        return [o / b for o, b in zip(self.ours, self.base, strict=False) if b > 0]


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed_child(
    argv: list[str], **kwargs: object
) -> tuple[float, float, subprocess.CompletedProcess[bytes]]:
    """(wall, CPU) of one child process."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    done = world_mod.run(argv, **kwargs)
    wall = time.perf_counter() - t0
    return wall, _children_cpu() - cpu0, done


def fmt(values: list[float], unit: str) -> str:
    if not values:
        return "-"
    scale, suffix = {"s": (1000, " ms"), "ms": (1, " ms"), "x": (1, "x"), "n": (1, "")}[unit]
    if unit == "x":
        lo, mid, hi = min(values), statistics.median(values), max(values)
        return f"{lo:.2f}/{mid:.2f}/{hi:.2f}x"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    if unit == "n":
        return f"{mid:g}" if lo == hi else f"{lo:g}/{mid:g}/{hi:g}"
    return f"{lo * scale:.1f}/{mid * scale:.1f}/{hi * scale:.1f}{suffix}"


# --- slot passes: `once` against the one-shot migration ---------------------------------------------


def bench_relabel(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    wall = Row(f"relabel pass, {size} slots: `once` vs one-shot migration (wall)", target="<= 2x")
    cpu = Row(f"relabel pass, {size} slots: CPU per file", unit="s", target="-")
    calls = Row(
        "unit-state queries (systemctl calls) per relabel pass",
        unit="n",
        target="1 per pass",
        ratio_of="",
    )
    base_cmd = [sys.executable, str(HERE / "baseline_migrate.py"), str(w.slots)]
    for _ in range(repeats):
        w.refill(size)
        w.reset_systemctl_log()
        t, c, done = timed_child(w.argv("once", "--log-format", "json"))
        if done.returncode != 0:
            raise SystemExit(f"once failed: {done.stderr.decode()[-2000:]}")
        relabelled = done.stderr.count(b"slot.relabeled")
        if relabelled != size:
            raise SystemExit(f"once relabelled {relabelled} of {size}: the world is wrong")
        calls.ours.append(len(w.systemctl_calls()))
        w.refill(size)
        tb, cb, _ = timed_child(base_cmd)
        wall.ours.append(t)
        wall.base.append(tb)
        cpu.ours.append(c / size)
        cpu.base.append(cb / size)
    wall.note = "fsync per written file + the folder once, both sides"
    cpu.unit = "us"
    return [wall, cpu, calls]


def bench_nochange(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    row = Row(f"no-change pass, {size} slots: `once` vs migration (wall)", target="-")
    base_cmd = [sys.executable, str(HERE / "baseline_migrate.py"), str(w.slots)]
    w.refill(size, device="gpu-rocm")
    for _ in range(repeats):
        t, _, _ = timed_child(w.argv("once", "--log-format", "json"))
        tb, _, _ = timed_child(base_cmd)
        row.ours.append(t)
        row.base.append(tb)
    return [row]


def bench_daemon_pass(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    """The daemon's full pass (``Passes.process`` for the EVERYTHING key: the slots, status
    bookkeeping, the label look) with nothing to do, in-process, host facts given (the probe
    is a fixed cost apart from the slots), vs the migration's no-change pass (read + parse
    each file), CPU; the baseline's tree the same way, in a child, in the same run."""
    rows = []
    for n in (size, size * 10):
        row = Row(
            f"no-change full pass in the daemon, {n} slots: CPU vs the migration's no-change pass",
            target="<= 0.08x",
        )
        row.note = "Passes.process(EVERYTHING), host facts given"
        rows.append(row)
        ours, base = daemon_pass_cpu(w, n, repeats)
        row.ours, row.base = ours, base
        if BASE is not None:
            theirs = _child_daemon_pass(n, repeats)
            other = Row(
                f"no-change full pass in the daemon, {n} slots: {BASE.label} vs the migration",
                ours=theirs[0],
                base=theirs[1],
                target="(was 0.11-0.12x)",
            )
            rows.append(other)
    return rows


def daemon_pass_cpu(w: world_mod.World, n: int, repeats: int) -> tuple[list[float], list[float]]:
    """(the daemon's no-change full passes, the migration's no-change passes), CPU seconds."""
    ours: list[float] = []
    base: list[float] = []
    w.refill(n, device="gpu-rocm")
    time.sleep(1.1)  # the files' last change is a second old: their reads are settled
    worker, batch = _passes(w)
    worker.process(batch)  # type: ignore[attr-defined]  # the first pass reads and parses every file
    worker.process(batch)  # type: ignore[attr-defined]  # the second looks at the labels once more
    for _ in range(repeats):
        c0 = time.process_time()
        worker.process(batch)  # type: ignore[attr-defined]
        ours.append(time.process_time() - c0)
        c0 = time.process_time()
        _migrate(w.slots)
        base.append(time.process_time() - c0)
    return ours, base


def _child_daemon_pass(n: int, repeats: int) -> tuple[list[float], list[float]]:
    """``daemon_pass_cpu`` of the baseline's tree, in a child whose imports are that tree's."""
    assert BASE is not None
    env = {**world_mod.env(), "HAL0_BENCH_SRC": str(BASE.src), "PYTHONPATH": str(BASE.src)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), "--daemon-pass-child", f"{n},{repeats}"],
        env=env,
        capture_output=True,
        check=False,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"the baseline's pass failed: {done.stderr.decode()[-2000:]}")
    figures = json.loads(done.stdout)
    return figures[0], figures[1]


def _migrate(folder: Path) -> None:
    import baseline_migrate

    baseline_migrate.migrate(folder)


def _passes(w: world_mod.World) -> tuple[object, object]:
    import structlog

    from hal0_reconciler import settings as settings_mod
    from hal0_reconciler.aiter import monitor
    from hal0_reconciler.daemon import passes, runner, selfheal, workqueue
    from hal0_reconciler.model import HostFacts, LaneState

    try:
        from hal0_reconciler.host.restarts import units
    except ImportError:  # a baseline's tree (0.2.0, before the rooms of 0.3.0)
        from hal0_reconciler.host import units  # type: ignore[no-redef]

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    overrides = w.overrides()
    if os.environ.get("HAL0_BENCH_SRC"):  # a baseline's tree: without the settings added since
        tree = baselines.Source("baseline", Path(os.environ["HAL0_BENCH_SRC"]))
        overrides = {k: v for k, v in overrides.items() if baselines.knows(tree, k)}
    settings = settings_mod.load(None, overrides)
    facts = HostFacts(amd=True, lane=LaneState.USABLE)
    clock = workqueue.SystemClock()
    worker = passes.Passes(
        settings,
        clock=clock,
        gather=lambda _s: facts,
        reconciler_factory=runner.default_reconciler,
        restarter=units.Restarter(settings),
        selfheal_=selfheal.SelfHeal(settings, factory=monitor.AiterMonitor, clock=clock),
        wake=lambda: None,
    )
    everything = workqueue.Batch(keys=frozenset({workqueue.Special.EVERYTHING}), events=1)
    return worker, everything


# --- the daemon ------------------------------------------------------------------------------------


def _cpu(proc: psutil.Process) -> float:
    """CPU seconds of the process's threads, to the nanosecond (schedstat), when it can."""
    try:
        total = 0
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        t = proc.cpu_times()
        return t.user + t.system
    return total / 1e9


def daemon(
    w: world_mod.World, **settings: str
) -> contextlib.AbstractContextManager[tuple[psutil.Process, object]]:
    """This checkout's daemon on the world, until READY=1 (``bench_latency.daemon``)."""
    return bench_latency.daemon(w, **settings)


def hal0_write(path: Path, text: str) -> None:
    """How hal0 saves a slot: temp file, rename."""
    tmp = path.with_name(f".{path.name}.hal0tmp")
    tmp.write_text(text)
    tmp.rename(path)


def is_relabelled(path: Path) -> bool:
    try:
        return b'"gpu-rocm"' in path.read_bytes()
    except OSError:
        return False


def wait_relabelled(path: Path, timeout: float = 30) -> float:
    start = time.monotonic()
    while not is_relabelled(path):
        if time.monotonic() - start > timeout:
            raise SystemExit(f"{path} not relabelled within {timeout}s")
        time.sleep(0.0005)
    return time.monotonic() - start


def per_save_cpu(w: world_mod.World, size: int, saves: int) -> tuple[float, list[float]]:
    """Daemon CPU per single-file save (the echo of its own write included), and latencies."""
    w.refill(size, device="gpu-rocm")
    latencies = []
    with daemon(w) as (proc, _):
        time.sleep(1.0)
        cpu0 = _cpu(proc)
        for i in range(saves):
            target = w.slots / f"s{i}.toml"
            t0 = time.monotonic()
            hal0_write(target, world_mod.slot_text(i))
            latencies.append(time.monotonic() - t0 + wait_relabelled(target))
            time.sleep(0.6)  # the echo of the daemon's own write settles too
        cpu = (_cpu(proc) - cpu0) / saves
    return cpu, latencies


def bench_events(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    row = Row(f"daemon CPU per single-file save, {size * 10} vs {size} slots", target="<= 1.5x")
    small = Row(f"daemon CPU per single-file save, {size} slots", unit="s", ratio_of="")
    lat = Row(
        f"save -> relabel latency, {size} slots (p50 of each run)",
        unit="s",
        ratio_of="",
        target="-",
    )
    for _ in range(repeats):
        c_small, latencies = per_save_cpu(w, size, 20)
        c_big, _ = per_save_cpu(w, size * 10, 20)
        row.ours.append(c_big)
        row.base.append(c_small)
        small.ours.append(c_small)
        lat.ours.append(statistics.median(latencies))
    row.ratio_of = "10x/1x"
    return [row, small, lat]


def _burst(w: world_mod.World, size: int, source: baselines.Source) -> float:
    w.refill(size, device="gpu-rocm")
    with bench_latency.daemon(w, source):
        time.sleep(0.5)
        paths = [w.slots / f"burst{n}.toml" for n in range(1000)]
        for n, path in enumerate(paths):
            hal0_write(path, world_mod.slot_text(size + n).replace(f's{size + n}"', f'burst{n}"'))
        last = time.monotonic()
        for path in paths:
            wait_relabelled(path, timeout=120)
        return time.monotonic() - last


def bench_burst(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    row = Row(
        f"burst of 1000 new files onto {size} slots: done after the last write",
        unit="s",
        ratio_of="",
        target="<= 1.0 s",
    )
    if BASE is not None:
        row.measure += f", vs {BASE.label}"
        row.ratio_of = "ours/base"
    for _ in range(repeats):
        row.ours.append(_burst(w, size, baselines.OURS))
        if BASE is not None:
            row.base.append(_burst(w, size, BASE))
    return [row]


def _ready(
    w: world_mod.World, saved: Path, source: baselines.Source
) -> tuple[float, float, float, float]:
    """(first start wall, restart wall, first start CPU, restart CPU) until READY=1."""
    saved.unlink(missing_ok=True)
    figures: list[float] = []
    cpus: list[float] = []
    for _ in range(2):
        t0 = time.monotonic()
        with bench_latency.daemon(w, source) as (proc, sock):
            ready_at = next(t for t, m in sock.timed() if m == "READY=1")
            used = proc.cpu_times()
        figures.append(ready_at - t0)
        cpus.append(used.user + used.system + used.children_user + used.children_system)
    return figures[0], figures[1], cpus[0], cpus[1]


def bench_ready(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    """From exec to READY=1 with nothing to do: a first start (no saved memory of the slot
    files: each is read and parsed) and a restart (the memory the first start saved), this
    checkout and the baseline's tree, back to back."""
    versus = f" vs {BASE.label}" if BASE is not None else ""
    first = Row(
        f"READY, {size} slots, nothing to do (from exec): first start, every file parsed{versus}",
        unit="s",
        target="-",
    )
    again = Row(
        f"READY, {size} slots, nothing to do (from exec): restart, files unchanged{versus}",
        unit="s",
        target="<= 250 ms",
    )
    cpu_first = Row(
        f"READY, {size} slots, first start: CPU of the daemon and its probe's child{versus}",
        unit="s",
        target="<= 350 ms",
    )
    cpu = Row(
        f"READY, {size} slots, restart: CPU of the daemon and its probe's child{versus}",
        unit="s",
        target="<= 350 ms",
    )
    cpu.note = "less moved by the machine's load than the wall time"
    w.refill(size, device="gpu-rocm")
    time.sleep(1.1)  # the files' last change is a second old: their reads are settled
    saved = Path(w.overrides()["state_dir"]) / "seen-slots.json"
    for _ in range(repeats):
        figures = _ready(w, saved, baselines.OURS)
        for row, value in zip((first, again, cpu_first, cpu), figures, strict=True):
            row.ours.append(value)
        if BASE is not None:
            figures = _ready(w, saved, BASE)
            for row, value in zip((first, again, cpu_first, cpu), figures, strict=True):
                row.base.append(value)
    return [first, again, cpu_first, cpu]


def bench_save_latency(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    """Atomic saves one at a time (hal0's: temp file, rename): rename -> relabel seen."""
    del size  # 1000 slots: the latency does not grow with the folder (the events row)
    versus = f" vs {BASE.label}" if BASE is not None else ""
    p50 = Row(
        f"save -> relabel latency, atomic saves one at a time, {SAVES} saves: p50{versus}",
        unit="s",
        target="<= 10 ms",
    )
    p99 = Row(
        f"save -> relabel latency, atomic saves one at a time, {SAVES} saves: p99{versus}",
        unit="s",
        target="<= 25 ms",
    )
    if BASE is not None:
        p50.note = p99.note = f"the baseline from {BASE_SAVES} saves (a fixed settle window)"
    for _ in range(repeats):
        ours = bench_latency.atomic_saves(w, baselines.OURS, SAVES)
        p50.ours.append(statistics.median(ours))
        p99.ours.append(bench_latency.p99(ours))
        if BASE is not None:
            base = bench_latency.atomic_saves(w, BASE, BASE_SAVES)
            p50.base.append(statistics.median(base))
            p99.base.append(bench_latency.p99(base))
    return [p50, p99]


def bench_in_place(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    """An in-place writer (truncate, three writes 2 ms apart, close): close -> relabel, and
    the times the daemon read it torn (must be 0)."""
    del size
    versus = f" vs {BASE.label}" if BASE is not None else ""
    saves = max(50, SAVES // 4)
    p50 = Row(f"in-place writer, {saves} saves: close -> relabel p50{versus}", unit="s")
    torn = Row(f"in-place writer, {saves} saves: read torn{versus}", unit="n", target="0")
    torn.ratio_of = ""
    for _ in range(repeats):
        ours, torn_ours = bench_latency.in_place_saves(w, baselines.OURS, saves)
        p50.ours.append(statistics.median(ours))
        torn.ours.append(torn_ours)
        if BASE is not None:
            base, torn_base = bench_latency.in_place_saves(w, BASE, saves)
            p50.base.append(statistics.median(base))
            torn.base.append(torn_base)
    return [p50, torn]


def bench_idle(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    """Idle after READY: wake-ups per second of all threads (voluntary context switches over
    ``--idle-seconds``), RSS, threads."""
    del size
    versus = f" vs {BASE.label}" if BASE is not None else ""
    wakeups = Row(
        f"idle, 1000 slots: wake-ups per second, all threads, over {IDLE_SECONDS:g} s{versus}",
        unit="n",
        target="no timer it does not need",
    )
    rss = Row(f"idle, 1000 slots: RSS (MB){versus}", unit="n", target="-")
    threads = Row(f"idle, 1000 slots: threads{versus}", unit="n", target="-")
    names: list[str] = []
    for _ in range(repeats):
        figures = bench_latency.idle(w, baselines.OURS, IDLE_SECONDS)
        for row, value in zip((wakeups, rss, threads), figures[:3], strict=True):
            row.ours.append(round(value, 2))
        names = figures[3]
        if BASE is not None:
            figures = bench_latency.idle(w, BASE, IDLE_SECONDS)
            for row, value in zip((wakeups, rss, threads), figures[:3], strict=True):
                row.base.append(round(value, 2))
    threads.note = "ours: " + ", ".join(names)
    return [wakeups, rss, threads]


BASE: baselines.Source | None = None
"""``--base COMMIT``: the recorded baseline the daemon's figures are paired with."""
SAVES = 200
BASE_SAVES = 50
IDLE_SECONDS = 60.0


INSTALLED: Path | None = None
"""``--installed VENV``: a venv with the package installed for real (``pip install .``)."""


def bench_plan_empty(w: world_mod.World, size: int, repeats: int) -> list[Row]:
    row = Row("`plan` on an empty folder, CPU, vs `python3 -c 'import tomllib'`", target="<= 2x")
    row.note = "not an AMD host (this machine): no probe; this checkout's src on PYTHONPATH"
    amd = Row(
        "`plan` on an empty folder of an AMD host, CPU (the probe runs as the service "
        "user in a second interpreter)",
        ratio_of="",
    )
    installed = Row(
        "`plan` on an empty folder, CPU, the installed entry point (`pip install .`, not "
        "editable) vs `import tomllib` in its venv",
        target="<= 2x",
    )
    installed.note = f"--installed {INSTALLED}"
    no_amd = str(w.root / "no-amdgpu")
    # the installed package, its own interpreter, nothing of this checkout on the path
    plain = {k: v for k, v in world_mod.env().items() if k != "PYTHONPATH"}
    w.refill(0)
    for _ in range(max(repeats, 5)):
        _, c, done = timed_child(w.argv("plan", amdgpu_module_dir=no_amd))
        if done.returncode != 0:
            raise SystemExit(f"plan failed: {done.stderr.decode()[-2000:]}")
        _, cb, _ = timed_child([sys.executable, "-c", "import tomllib"])
        _, ca, _ = timed_child(w.argv("plan"))
        row.ours.append(c)
        row.base.append(cb)
        amd.ours.append(ca)
        if INSTALLED is not None:
            argv = [
                str(INSTALLED / "bin/hal0-reconciler"),
                *w.argv("plan", amdgpu_module_dir=no_amd)[3:],
            ]
            _, ci, done = timed_child(argv, environment=plain)
            if done.returncode != 0:
                raise SystemExit(f"installed plan failed: {done.stderr.decode()[-2000:]}")
            base = [str(INSTALLED / "bin/python"), "-c", "import tomllib"]
            _, cbi, _ = timed_child(base, environment=plain)
            installed.ours.append(ci)
            installed.base.append(cbi)
    return [row, amd] if INSTALLED is None else [row, installed, amd]


# --- aiter ------------------------------------------------------------------------------------------


def bench_aiter(_w: world_mod.World, size: int, repeats: int) -> list[Row]:
    import aiter_world

    scan = Row(
        "aiter registry scan (every module, its names) vs one Python read of the modules",
        target="<= 3x",
    )
    cold = Row(
        "aiter cold check (tables parsed, modules scanned) vs one Python read of the modules",
        target="-",
    )
    upstream = Row("aiter cold check vs upstream-style preflight", target="-")
    warm = Row(
        "aiter warm check in a new process (on-disk caches)",
        unit="s",
        ratio_of="",
        target="<= 100 ms",
    )
    plan = Row(
        "`aiter plan` in a new process, on-disk caches warm: CPU of the whole process "
        "vs `python3 -c 'import tomllib'`",
        target="-",
    )
    with aiter_world.AiterWorld(mb=max(4, size // 25)) as aw:
        for _ in range(repeats):
            aw.drop_caches()
            t_read = aw.python_read()
            scan.ours.append(aw.registry_scan())
            scan.base.append(aw.python_read())
            t_cold = aw.check_in_child()
            t_up = aw.upstream_preflight()
            t_warm = aw.check_in_child()
            _, c_plan, done = timed_child(aw.plan_argv())
            if done.returncode not in {0, 2}:
                raise SystemExit(f"aiter plan failed: {done.stderr.decode()[-2000:]}")
            _, c_base, _ = timed_child([sys.executable, "-c", "import tomllib"])
            plan.ours.append(c_plan)
            plan.base.append(c_base)
            cold.ours.append(t_cold)
            cold.base.append(t_read)
            upstream.ours.append(t_cold)
            upstream.base.append(t_up)
            warm.ours.append(t_warm)
        scan.note = f"{aw.describe()}; page cache warm for both"
    return [scan, cold, upstream, warm, plan]


def bench_restarter(_w: world_mod.World, size: int, repeats: int) -> list[Row]:
    """A flood of deferred restarts drained by the restarter's queue (``bench_restarter``)."""
    import bench_restarter

    sizes = (size, size * 10, size * 20)
    rows = [
        Row(
            f"restarter drain, {n} deferred restarts pending (turns over "
            f"{bench_restarter.INTERVAL:g} s): CPU vs the scanning queue",
            note="the queue alone: unit states and restarts stubbed",
        )
        for n in sizes
    ]
    for _ in range(repeats):
        for n, row in zip(sizes, rows, strict=True):
            row.ours.append(bench_restarter.drain(n)[0])
            row.base.append(bench_restarter.drain(n, scanning=True)[0])
    per = Row(
        f"restarter drain CPU per pending restart, {sizes[-1]} vs {sizes[0]} pending",
        unit="us",
        ratio_of=f"{sizes[-1] // size}x/1x",
        target="flat (O(n log n))",
    )
    per.ours = [c / sizes[-1] for c in rows[-1].ours]
    per.base = [c / sizes[0] for c in rows[0].ours]
    return [*rows, per]


BENCHES: dict[str, Callable[[world_mod.World, int, int], list[Row]]] = {
    "relabel": bench_relabel,
    "nochange": bench_nochange,
    "daemonpass": bench_daemon_pass,
    "events": bench_events,
    "burst": bench_burst,
    "ready": bench_ready,
    "latency": bench_save_latency,
    "inplace": bench_in_place,
    "idle": bench_idle,
    "plan": bench_plan_empty,
    "aiter": bench_aiter,
    "restarter": bench_restarter,
}


def table(rows: list[Row]) -> str:
    head = ("measure", "ours min/med/max", "baseline min/med/max", "ratio min/med/max", "target")
    lines = [head]
    for r in rows:
        unit = r.unit
        ours = r.ours
        base = r.base
        if unit == "us":
            ours = [x * 1e6 for x in ours]
            base = [x * 1e6 for x in base]
            unit = "n"
        ratio = fmt(r.ratios(), "x") + (f" ({r.ratio_of})" if r.ratio_of and r.base else "")
        lines.append(
            (
                r.measure + (f" [{r.note}]" if r.note else ""),
                fmt(ours, unit) + (" us" if r.unit == "us" else ""),
                (fmt(base, unit) + (" us" if r.unit == "us" else "")) if base else "-",
                ratio if r.base else "-",
                r.target,
            )
        )
    out = ["| " + " | ".join(cells) + " |" for cells in lines]
    out.insert(1, "|" + "---|" * len(head))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated: " + ",".join(BENCHES))
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    ap.add_argument(
        "--installed",
        type=Path,
        metavar="VENV",
        help="plan: also measure the package installed in this venv (python -m venv VENV && "
        "VENV/bin/pip install .), by its entry point",
    )
    ap.add_argument(
        "--base",
        default="6aef203",
        help="the recorded commit the daemon's figures are paired with (6aef203 = 0.2.0, "
        "12f8b41 = 0.1.0; none: ours only)",
    )
    ap.add_argument("--saves", type=int, default=200, help="latency: saves per run (ours)")
    ap.add_argument("--base-saves", type=int, default=50, help="latency: the baseline's")
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--daemon-pass-child", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.daemon_pass_child:  # the baseline's tree measured in this process (HAL0_BENCH_SRC)
        n, repeats = (int(x) for x in opts.daemon_pass_child.split(","))
        child_world = world_mod.World()
        try:
            print(json.dumps(daemon_pass_cpu(child_world, n, repeats)))
        finally:
            child_world.close()
        return 0
    global INSTALLED, BASE, SAVES, BASE_SAVES, IDLE_SECONDS  # noqa: PLW0603 - set once
    INSTALLED = opts.installed
    SAVES, BASE_SAVES, IDLE_SECONDS = opts.saves, opts.base_saves, opts.idle_seconds
    if os.geteuid() != 0:
        print("run as root: the benchmarks make device nodes and run the probe", file=sys.stderr)
        return 1
    chosen = [n for n in (opts.only.split(",") if opts.only else BENCHES) if n]
    rows: list[Row] = []
    world_mod.compile_sources()
    if opts.base != "none":
        BASE = baselines.checkout(opts.base)
    w = world_mod.World()
    started = time.monotonic()
    try:
        for name in chosen:
            t0 = time.monotonic()
            try:
                rows += BENCHES[name](w, opts.size, opts.repeats)
            except (Exception, SystemExit) as exc:  # the others still make the table
                rows.append(Row(f"{name}: FAILED ({exc!r:.200})", ratio_of=""))
            print(f"# {name}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        w.close()
    load = os.getloadavg()[0]
    print(
        f"size {opts.size}, {opts.repeats} repeats, {os.cpu_count()} CPUs (load {load:.1f}), "
        f"python {sys.version.split()[0]}, {time.monotonic() - started:.0f} s"
        + (f", paired with {BASE.label}" if BASE is not None else "")
    )
    print(table(rows))
    if opts.json:
        opts.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
