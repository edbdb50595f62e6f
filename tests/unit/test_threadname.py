"""Threads named for the kernel too: what ``ps -L`` and ``/proc/<pid>/task/*/comm`` show."""

from __future__ import annotations

import threading
from pathlib import Path

from hal0_reconciler import threadname


def _comm(thread: threading.Thread) -> str:
    assert thread.native_id is not None
    return Path(f"/proc/self/task/{thread.native_id}/comm").read_text().rstrip("\n")


def _parked(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait(10)


def test_a_started_thread_is_named_in_python_and_in_the_kernel() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threadname.start(_parked, "hal0-test-one", args=(ready, release))
    try:
        assert ready.wait(10)
        assert thread.name == "hal0-test-one"
        assert _comm(thread) == "hal0-test-one"
        assert thread.daemon
    finally:
        release.set()
        thread.join(10)


def test_a_long_name_is_cut_to_the_kernels_fifteen_bytes() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threadname.NamedThread(
        target=_parked, args=(ready, release), name="hal0-a-very-long-thread-name"
    )
    thread.start()
    try:
        assert ready.wait(10)
        assert thread.name == "hal0-a-very-long-thread-name"  # Python keeps it whole
        assert _comm(thread) == "hal0-a-very-lon"
    finally:
        release.set()
        thread.join(10)


def test_the_cut_never_splits_a_character() -> None:
    assert threadname.kernel_name("hal0-ééééééééé") == "hal0-ééééé".encode()
    assert len(threadname.kernel_name("x" * 40)) == threadname.COMM_MAX


def test_a_thread_that_runs_none_of_our_code_is_named_from_outside() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_parked, args=(ready, release), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        assert _comm(thread) != "hal0-outsider"
        assert threadname.name_other(thread, "hal0-outsider")
        assert thread.name == "hal0-outsider"
        assert _comm(thread) == "hal0-outsider"
    finally:
        release.set()
        thread.join(10)


def test_a_finished_thread_is_not_named_in_the_kernel() -> None:
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join(10)
    assert not threadname.name_other(thread, "hal0-gone")


def test_the_calling_thread_names_itself() -> None:
    result: dict[str, object] = {}

    def run() -> None:
        result["ok"] = threadname.name_current("hal0-self")
        result["comm"] = Path("/proc/thread-self/comm").read_text().rstrip("\n")
        result["name"] = threading.current_thread().name

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert result == {"ok": True, "comm": "hal0-self", "name": "hal0-self"}
