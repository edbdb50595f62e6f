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
    worker.stop()
    print("stopped", flush=True)
    """
)


def test_a_wedged_pass_does_not_keep_the_process_alive() -> None:
    """Worker.stop gives up on a pass stuck for good, and the process still exits."""
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
