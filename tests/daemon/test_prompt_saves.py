"""A save that leaves its file whole is judged at once (the settle window is for files that may
still be written, and for bursts); a closed file that does not parse waits one settle window."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from structlog.testing import capture_logs

from hal0_reconciler import threadname
from helpers.daemon_host import Host, device_of, drop_slot, running, slot_text, wait_until

LONG = 30.0  # a settle window no wait in these tests comes near


def test_a_rename_into_place_skips_a_long_settle_window(host: Host, notify_socket) -> None:
    with running(host.settings(settle_window=LONG, settle_cap=LONG)) as daemon:
        notify_socket.wait_for("READY=1")
        target = drop_slot(host.slots, "agent")
        wait_until(lambda: device_of(target) == "gpu-rocm", timeout=10, what="prompt relabel")
        wait_until(lambda: daemon.stats().relabels == 1, timeout=10)


def test_a_close_after_writing_skips_a_long_settle_window(host: Host, notify_socket) -> None:
    with running(host.settings(settle_window=LONG, settle_cap=LONG)) as daemon:
        notify_socket.wait_for("READY=1")
        target = host.slots / "inplace.toml"
        with target.open("w") as f:  # an editor's in-place save: truncate, write, close
            f.write(slot_text("inplace"))
        wait_until(lambda: device_of(target) == "gpu-rocm", timeout=10, what="prompt relabel")
        wait_until(lambda: daemon.stats().relabels == 1, timeout=10)


def test_a_file_still_open_for_writing_waits_for_its_close(host: Host, notify_socket) -> None:
    """Written and flushed but not closed: never judged in the settle window's place."""
    with running(host.settings(settle_window=LONG, settle_cap=LONG)) as daemon:
        notify_socket.wait_for("READY=1")
        target = host.slots / "open.toml"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, slot_text("open").encode())
            drop_slot(host.slots, "marker")  # a whole file after it: judged, this one waits
            wait_until(lambda: daemon.stats().relabels == 1, timeout=10, what="the marker")
            assert device_of(target) == "gpu-vulkan"
        finally:
            os.close(fd)
        wait_until(lambda: device_of(target) == "gpu-rocm", timeout=10, what="after the close")


def test_a_closed_file_that_does_not_parse_gets_one_settle_window(
    host: Host, notify_socket
) -> None:
    """A writer that closes half its file and finishes it within the settle window is never
    reported unreadable: the half was read at once, then given the window."""
    with (
        running(host.settings(settle_window=2.0, settle_cap=LONG)) as daemon,
        capture_logs() as logs,
    ):
        notify_socket.wait_for("READY=1")
        target = host.slots / "halves.toml"
        text = slot_text("halves")
        cut = text.index('device = "') + len('device = "gp')  # an unterminated string
        start = daemon.stats().passes
        target.write_text(text[:cut])
        wait_until(lambda: daemon.stats().passes > start, timeout=10, what="the half read")
        with target.open("a") as f:
            f.write(text[cut:])
        wait_until(lambda: device_of(target) == "gpu-rocm", timeout=10, what="the whole relabelled")
        events = [e["event"] for e in logs]
    assert "slot.unreadable" not in events


def test_a_closed_file_that_stays_unreadable_is_reported_after_the_window(
    host: Host, notify_socket
) -> None:
    with (
        running(host.settings(settle_window=0.5, settle_cap=LONG)) as daemon,
        capture_logs() as logs,
    ):
        notify_socket.wait_for("READY=1")
        target = host.slots / "broken.toml"
        target.write_text('name = "broken\n')
        wait_until(
            lambda: any(e["event"] == "slot.unreadable" for e in logs), timeout=10, what="report"
        )
        wait_until(lambda: daemon._queue.pending() == 0)
    unreadable = [e for e in logs if e["event"] == "slot.unreadable"]
    assert [str(target)] == [e["path"] for e in unreadable]  # once, by path
    assert target.read_text() == 'name = "broken\n'  # left byte for byte


def _comms() -> dict[int, str]:
    """The kernel's name of each thread of this process, by its id."""
    return {
        int(t.name): (t / "comm").read_text().rstrip("\n")
        for t in Path("/proc/self/task").iterdir()
    }


def _unnamed_threads() -> dict[str, str]:
    """The Python and kernel names of the threads the kernel does not know by a hal0- name
    (but this process's main thread and the test's own: the daemon's main, the socket)."""
    tasks = _comms()
    return {
        t.name: tasks[t.native_id]
        for t in threading.enumerate()
        if t.native_id in tasks
        and t.name != "MainThread"
        and not t.name.startswith("test-")
        and not tasks[t.native_id].startswith("hal0-")
    }


def test_every_thread_the_daemon_starts_is_named(host: Host, notify_socket) -> None:
    with running(host.settings()):
        notify_socket.wait_for("READY=1")
        drop_slot(host.slots, "agent")
        wait_until(lambda: device_of(host.slots / "agent.toml") == "gpu-rocm")
        # a thread watchdog starts itself is named at the next event or look: maybe just after
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not _unnamed_threads(), timeout=5, what="every thread named")
        assert {} == _unnamed_threads()
        tasks = _comms()
    assert "hal0-worker" in tasks.values()
    assert "hal0-observer" in tasks.values()
    assert threadname.kernel_name("hal0-early-probe") == b"hal0-early-prob"


def test_the_restarter_starts_its_worker_with_the_first_restart(host: Host, notify_socket) -> None:
    """Idle, no restart worker runs; the first relabel's restart request starts it."""

    def workers() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("hal0-restarter")]

    with running(host.settings()) as daemon:
        notify_socket.wait_for("READY=1")
        assert [] == workers()
        assert daemon._restarter.is_alive()  # started, nothing to do: healthy
        drop_slot(host.slots, "agent")
        wait_until(lambda: workers() == ["hal0-restarter"], what="the worker")
        assert daemon._restarter.is_alive()
