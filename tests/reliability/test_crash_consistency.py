"""Crash consistency: SIGKILL at random moments of relabel passes, ``once`` and the daemon.

After every kill each slot file is exactly its old or its new bytes and parses; temp files a
kill left behind are removed by the next run; and a final run converges every slot.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

from helpers.daemon_host import Host
from reliability import support

SLOTS = 200


def _reset(host: Host) -> dict[Path, bytes]:
    for path in host.slots.iterdir():
        if path.name.endswith(".toml"):
            path.unlink()
    return support.write_vulkan_slots(host.slots, SLOTS)


def _first_write(
    first: tuple[Path, bytes], child: subprocess.Popen[bytes], timeout: float = 30.0
) -> float:
    """Wait until the pass has relabelled its first file; the moment it did."""
    path, data = first
    deadline = time.monotonic() + timeout
    while path.read_bytes() == data:
        if child.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the pass did not start writing (exit {child.poll()})")
        time.sleep(0.002)
    return time.monotonic()


def _kill_rounds(host: Host, verb: str, rounds: int, seed: int) -> tuple[int, int]:
    """``rounds`` runs of ``verb``, each SIGKILLed at a random moment of its writes;
    (torn files, temp files seen after the kills)."""
    rng = random.Random(seed)
    argv = support.cli_argv(host, verb)
    old = _reset(host)
    child = subprocess.Popen(argv, env=support.cli_env(), stdout=subprocess.DEVNULL)
    try:
        began = _first_write(min(old.items()), child)
        last = max(old.items())
        support.wait_for(lambda: last[0].read_bytes() != last[1], timeout=60, what="the whole pass")
        span = time.monotonic() - began  # how long the writes of a whole pass take here
    finally:
        support.kill_tree(child)
    torn = temps = 0
    for _ in range(rounds):
        old = _reset(host)
        child = subprocess.Popen(
            argv, env=support.cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _first_write(min(old.items()), child)
            time.sleep(rng.uniform(0, span))
        finally:
            support.kill_tree(child)
        support.FIGURES["kills"] += 1
        torn += len(support.torn_files(old))
        temps += len(support.own_temps(host.slots))
    done = support.run_cli(host, "once")
    assert 0 == done.returncode, done.stderr
    assert [] == support.own_temps(host.slots), "a temp file survived the next run"
    assert [] == [p.name for p, d in old.items() if p.read_bytes() != support.relabelled(d)]
    return torn, temps


def test_sigkill_during_once(host: Host) -> None:
    rounds = support.scaled(12, 1000)
    torn, temps = _kill_rounds(host, "once", rounds, seed=1)
    support.NOTES["temp files left by SIGKILLed once runs (removed by the next run)"] = str(temps)
    assert 0 == torn


def test_sigkill_during_the_daemon_pass(host: Host) -> None:
    rounds = support.scaled(6, 300)
    torn, _ = _kill_rounds(host, "run", rounds, seed=2)
    assert 0 == torn
