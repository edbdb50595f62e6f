"""A wedged pass never keeps the daemon's process from exiting (its file is left old: writes
are atomic). Run in a child process, as the daemon would: the interpreter must end."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers.hosts import REPO

_WEDGED = textwrap.dedent(
    """
    import threading, time
    from hal0_reconciler.daemon import passes, workqueue
    from hal0_reconciler.model import SlotKey
    started = threading.Event()
    def wedged(batch):
        started.set()
        time.sleep(3600)
    queue = workqueue.WorkQueue(settle=0.0, cap=0.0, clock=time)
    worker = passes.Worker(queue, wedged)
    worker.start()
    queue.add(SlotKey("/s/agent.toml"))
    assert started.wait(10), "the pass never started"
    t0 = time.monotonic()
    worker.stop()
    print(f"gave up after {time.monotonic() - t0:.2f}", flush=True)
    print("stopped", flush=True)
    """
)


def test_a_wedged_pass_does_not_keep_the_process_alive() -> None:
    """Worker.stop gives up on a pass stuck for good after 4 s (systemd's stop budget is 5 s),
    says so, and the process still exits."""
    result = subprocess.run(
        [sys.executable, "-c", _WEDGED],
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=15,  # the worker gives up after 4 s; a process kept alive by it times out here
        check=False,
    )
    assert (0, "stopped") == (result.returncode, result.stdout.strip().splitlines()[-1]), (
        f"a wedged pass kept the process from exiting: {result.stderr[-500:]}"
    )
    assert "daemon.worker_abandoned" in result.stdout, "an abandoned pass was not said"
    waited = float(result.stdout.split("gave up after ")[1].split()[0])
    assert 3.9 <= waited < 5.0, f"the worker gave up after {waited}s, not 4 s (stop budget 5 s)"


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
