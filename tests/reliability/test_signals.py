"""Signals: SIGTERM during a wait for hal0's lock and during a 5,000-file pass (exit within
5 s, nothing torn, no temp file left), SIGHUP storms, and signals in the first instant."""

from __future__ import annotations

import random
import signal
import subprocess
import time

from helpers import sigmask
from helpers.daemon_host import Host, drop_slot
from helpers.lock_holder import holding_lock
from helpers.notify_socket import NotifySocket
from reliability import support

STOP_BUDGET = 5.0


def _daemon(host: Host, sock: NotifySocket, **settings: object) -> subprocess.Popen[bytes]:
    return support.start_daemon(host, sock.path, **settings)


def _stop(child: subprocess.Popen[bytes]) -> tuple[float, int]:
    """SIGTERM; (seconds until exit, exit code). Killed (and failed) after 15 s."""
    started = time.monotonic()
    child.send_signal(signal.SIGTERM)
    try:
        code = child.wait(15)
    except subprocess.TimeoutExpired:
        support.FIGURES["hangs"] += 1
        support.kill_tree(child)
        raise
    return time.monotonic() - started, code


def _held(pid: int, signum: int) -> bool:
    """Whether ``signum`` is blocked (held pending) by the process: our entry point's first act,
    long before the handlers are in place."""
    try:
        return signum in sigmask.blocked(pid)
    except OSError:
        return False


def _wait_held(child: subprocess.Popen[bytes], signum: int) -> float:
    started = time.monotonic()
    support.wait_for(lambda: _held(child.pid, signum), timeout=10, what="the signal held")
    return time.monotonic() - started


def test_sigterm_during_a_lock_wait(host: Host) -> None:
    """The daemon and ``once`` waiting for hal0's lock stop at once; the slot is untouched."""
    slot = drop_slot(host.slots, "waiting")
    old = slot.read_bytes()
    lock = host.slots.parent / "slots.lock"
    with holding_lock(lock, seconds=60), NotifySocket() as sock:
        for verb in ("run", "once"):
            if verb == "run":
                child = _daemon(host, sock, lock_timeout=60)
            else:
                child = subprocess.Popen(
                    support.cli_argv(host, "once", lock_timeout=60),
                    env=support.cli_env(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            try:
                time.sleep(2.5)  # started, probed, reading: now waiting for the lock
                assert child.poll() is None
                seconds, code = _stop(child)
            finally:
                support.kill_tree(child)
            support.NOTES[f"exit after SIGTERM during a lock wait ({verb})"] = f"{seconds:.2f} s"
            assert seconds <= STOP_BUDGET
            assert code == (0 if verb == "run" else 1)
            assert old == slot.read_bytes()
            assert [] == support.own_temps(host.slots)


def test_sigterm_during_a_5000_file_pass(host: Host) -> None:
    """A stop in the middle of a big first pass: within 5 s, nothing torn, no temp file."""
    rounds = support.scaled(2, 10)
    rng = random.Random(5)
    worst = 0.0
    for _ in range(rounds):
        for path in host.slots.iterdir():
            path.unlink()
        old = support.write_vulkan_slots(host.slots, 5000)
        first = min(old.items())
        with NotifySocket() as sock:
            child = _daemon(host, sock)
            try:
                support.wait_for(
                    lambda first=first: first[0].read_bytes() != first[1],
                    timeout=60,
                    what="the first relabel",
                )
                time.sleep(rng.uniform(0.1, 2.0))
                seconds, code = _stop(child)
            finally:
                support.kill_tree(child)
        worst = max(worst, seconds)
        assert (0, []) == (code, support.torn_files(old))
        assert [] == support.own_temps(host.slots)
        changed = sum(1 for p, d in old.items() if p.read_bytes() != d)
        assert 0 < changed < len(old), "the stop did not land in the middle of the pass"
    support.NOTES["exit after SIGTERM during a 5,000-file pass (worst)"] = f"{worst:.2f} s"
    assert worst <= STOP_BUDGET


def test_sighup_storms_and_signals_in_the_first_instant(host: Host) -> None:
    """A SIGHUP as soon as the process runs our code, then a storm of them: the daemon lives,
    becomes READY, still relabels, and stops cleanly on SIGTERM, even one sent at once."""
    storm = support.scaled(200, 5000)
    with NotifySocket() as sock:
        child = _daemon(host, sock)
        try:
            held_after = _wait_held(child, signal.SIGHUP)
            support.NOTES["signals held after exec (at most)"] = f"{held_after * 1000:.0f} ms"
            child.send_signal(signal.SIGHUP)
            sock.wait_for("READY=1", timeout=30)
            for _ in range(storm):
                child.send_signal(signal.SIGHUP)
            assert child.poll() is None
            slot = drop_slot(host.slots, "after-the-storm")
            support.wait_for(lambda: b"gpu-rocm" in slot.read_bytes(), timeout=30, what="a relabel")
            seconds, code = _stop(child)
        finally:
            support.kill_tree(child)
        assert (0, True) == (code, seconds <= STOP_BUDGET)
        assert "STOPPING=1" in sock.messages()
    with NotifySocket() as sock:  # a SIGTERM in the first instant: a clean stop, not a kill
        child = _daemon(host, sock)
        try:
            _wait_held(child, signal.SIGTERM)
            seconds, code = _stop(child)
        finally:
            support.kill_tree(child)
        assert 0 == code
        assert "STOPPING=1" in sock.messages()
