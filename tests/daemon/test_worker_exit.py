"""A wedged pass never keeps the daemon's process from exiting (its file is left old: writes
are atomic). Run in a child process, as the daemon would: the interpreter must end."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from helpers.hosts import REPO

_WEDGED = textwrap.dedent(
    """
    import threading
    from hal0_reconciler.daemon import passes, workqueue
    from hal0_reconciler.model import SlotKey
    import time
    started, never = threading.Event(), threading.Event()
    finished = []
    def wedged(batch):
        started.set()
        never.wait()  # stuck for good
        finished.append(batch)
    queue = workqueue.WorkQueue(settle=0.0, cap=0.0, clock=time)
    worker = passes.Worker(queue, wedged)
    worker.start()
    join = worker._thread.join
    def bounded_join(timeout=None):
        print(f"waits at most {timeout}", flush=True)
        join(timeout)
    worker._thread.join = bounded_join
    queue.add(SlotKey("/s/agent.toml"))
    assert started.wait(10), "the pass never started"
    worker.stop()
    print("pass still running" if not finished and worker.is_alive() else "pass ended", flush=True)
    print("stopped", flush=True)
    """
)


def _stop_budget() -> float:
    """systemd's TimeoutStopSec of the shipped unit, in seconds."""
    unit = (REPO / "systemd/hal0-reconciler.service").read_text()
    values = [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith("TimeoutStopSec=")]
    assert 1 == len(values), "the unit sets no TimeoutStopSec"
    return float(values[0].removesuffix("s"))


def test_a_wedged_pass_does_not_keep_the_process_alive() -> None:
    """Worker.stop waits for a pass stuck for good only a bounded time, says it abandoned it,
    and the process still exits (the stuck thread does not hold the interpreter). The bound is
    at most half of systemd's stop budget: the restarter's stop waits as long after it."""
    result = subprocess.run(
        [sys.executable, "-c", _WEDGED],
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,  # a hang guard only: a process kept alive by the stuck pass ends here
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    assert (0, "stopped") == (result.returncode, lines[-1] if lines else None), (
        f"a wedged pass kept the process from exiting: {result.stderr[-500:]}"
    )
    assert "pass still running" == lines[-2], "stop() returned only after the pass ended"
    said = [i for i, line in enumerate(lines) if "daemon.worker_abandoned" in line]
    assert said, "an abandoned pass was not said"
    assert said[0] < len(lines) - 2, "the abandoned pass was said after stop() returned"
    waits = [line for line in lines if line.startswith("waits at most ")]
    assert 1 == len(waits), f"stop() did not wait for the running pass once: {waits}"
    bound = waits[0].removeprefix("waits at most ")
    assert bound != "None", "stop() waits for a stuck pass without a bound"
    budget = _stop_budget()
    assert 0 < float(bound) < budget / 2, (
        f"the worker waits up to {bound}s for a stuck pass: not within half of systemd's stop "
        f"budget (TimeoutStopSec={budget:g}), so the rest of the shutdown would be killed"
    )


def test_a_pass_that_fails_is_logged_and_the_worker_goes_on() -> None:
    """An exception in a pass is logged at ERROR (daemon.pass_failed, with the traceback and
    the batch size), and the next batch is processed as usual."""
    import threading
    import time

    from structlog.testing import capture_logs

    from hal0_reconciler.daemon import passes, workqueue
    from hal0_reconciler.model import SlotKey

    done: list[workqueue.Batch] = []
    second = threading.Event()

    def process(batch: workqueue.Batch) -> None:
        done.append(batch)
        if len(done) == 1:
            raise RuntimeError("a bug in a pass")
        second.set()

    queue = workqueue.WorkQueue(settle=0.0, cap=0.0, clock=time)
    with capture_logs() as logs, passes.Worker(queue, process):
        queue.add(SlotKey("/s/a.toml"))
        queue.add(SlotKey("/s/b.toml"))
        wait = time.monotonic() + 10
        while len(done) < 1 and time.monotonic() < wait:
            time.sleep(0.01)
        queue.add(SlotKey("/s/c.toml"))
        assert second.wait(10), "the worker stopped after a failed pass"
    failed = [e for e in logs if e["event"] == "daemon.pass_failed"]
    assert 1 == len(failed), f"a failed pass was logged {len(failed)} times"
    assert ("error", True) == (failed[0]["log_level"], failed[0].get("exc_info")), failed[0]
    assert failed[0]["keys"] == len(done[0].keys)


def test_stop_waits_for_the_running_pass_to_finish() -> None:
    """Stopping while a short pass runs: stop() returns after the pass finished (its write is
    done, not cut), and nothing is said about an abandoned pass."""
    import threading
    import time

    from structlog.testing import capture_logs

    from hal0_reconciler.daemon import passes, workqueue
    from hal0_reconciler.model import SlotKey

    started, finished = threading.Event(), threading.Event()

    def process(_batch: workqueue.Batch) -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    queue = workqueue.WorkQueue(settle=0.0, cap=0.0, clock=time)
    worker = passes.Worker(queue, process)
    with capture_logs() as logs:
        worker.start()
        queue.add(SlotKey("/s/a.toml"))
        assert started.wait(10)
        worker.stop()
        assert finished.is_set(), "stop() returned while the pass was still running"
        assert not worker.is_alive()
    assert [] == [e for e in logs if e["event"] == "daemon.worker_abandoned"]


def test_an_orderly_stop_fits_in_systemds_stop_budget() -> None:
    """The waits of a stop (a running pass, a restart in flight, the observer thread) add up to
    less than the unit's TimeoutStopSec: systemd never has to SIGKILL an orderly stop."""
    from hal0_reconciler import fsio
    from hal0_reconciler.daemon import passes, watch
    from hal0_reconciler.host.restarts import units

    waits = {
        "worker": passes.WORKER_STOP_WAIT,
        "fsync helpers": fsio.FSYNC_STOP_WAIT,
        "restarter": units.RESTARTER_STOP_WAIT,
        "observer": watch.OBSERVER_STOP_WAIT,
    }
    budget = _stop_budget()
    assert sum(waits.values()) < budget, (
        f"a stop may wait {sum(waits.values()):g}s ({waits}): over systemd's stop budget "
        f"(TimeoutStopSec={budget:g}), so an orderly stop would be killed"
    )


def test_stopping_the_worker_ends_the_fsync_helpers_of_its_passes(tmp_path: Path) -> None:
    """A pass's write groups leave fsync helper threads for the next group; the worker's stop
    ends them at once (not after their idle time), so a stopped daemon leaves no thread."""
    import threading
    import time

    from hal0_reconciler import fsio
    from hal0_reconciler.daemon import passes, workqueue
    from hal0_reconciler.model import SlotKey

    synced = threading.Event()

    def process(_batch: workqueue.Batch) -> None:
        writes = [fsio.begin_write(tmp_path / f"f{n}", b"x", mode=0o644) for n in range(8)]
        assert [None] * 8 == fsio.commit_writes(writes)
        synced.set()

    queue = workqueue.WorkQueue(settle=0.0, cap=0.0, clock=time)
    with passes.Worker(queue, process):
        queue.add(SlotKey("/s/a.toml"))
        assert synced.wait(10), "the pass never ran"
        assert fsio.fsync_helpers() > 0, "no helper thread to stop: the test proves nothing"
    assert 0 == fsio.fsync_helpers()
    assert [] == [t.name for t in threading.enumerate() if t.name == "hal0-fsync"]
