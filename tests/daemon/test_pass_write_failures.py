"""Slot writes that fail for a lasting reason are a problem in the status until a pass writes
them: a full disk (a real, tiny tmpfs: ENOSPC) degrades, a read-only folder (a real read-only
bind mount: EROFS) makes the daemon unhealthy. Driven batch by batch on the pass bench."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.daemon import passes
from helpers.daemon_host import device_of
from helpers.lock_holder import holding_lock
from helpers.pass_bench import Bench

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True, timeout=30, capture_output=True)


@contextlib.contextmanager
def small_tmpfs(folder: Path) -> Iterator[None]:
    """``folder`` as a 64 KiB tmpfs until exit (a skip, with why, where mounting is denied)."""
    argv = ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(folder)]
    done = subprocess.run(argv, check=False, timeout=30, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=30)


def _fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte (a hidden file, not a slot)."""
    filler = folder / ".filler"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)
    return filler


def _read_only(folder: Path, *, ro: bool) -> None:
    _mount("-o", f"remount,{'ro' if ro else 'rw'}", str(folder))


def _problems(bench: Bench) -> dict[str, str]:
    with bench.passes.lock:
        return dict(bench.passes.progress.problems)


@needs_root
def test_lasting_write_failures_are_said_until_a_pass_writes_the_slots(tmp_path: Path) -> None:
    """A full disk: "writes" names the first failing slot (by its path) and how many more;
    not unhealthy. The folder read-only: the same problem under "writes-read-only" (unhealthy:
    only a restart gets a writable view) and "writes" goes. Writable again with room: the next
    pass writes the slots and both are gone."""
    bench = Bench(tmp_path)
    with small_tmpfs(bench.slots):
        agent, coder = bench.slot("agent"), bench.slot("coder")
        filler = _fill(bench.slots)
        bench.full()
        problems = _problems(bench)
        assert "gpu-vulkan" == device_of(agent), "setup: the write should fail on a full disk"
        assert set(problems) == {"writes"}, f"a full disk is said as {problems}"
        assert problems["writes"].startswith(f"slot writes fail: {agent}: "), problems
        assert problems["writes"].endswith(" (+1 more)"), f"the other failing slot: {problems}"
        assert os.strerror(errno.ENOSPC) in problems["writes"], f"not why: {problems}"
        assert not set(problems) & passes.HEALTH_PROBLEMS, "a full disk made it unhealthy"

        _read_only(bench.slots, ro=True)
        try:
            bench.changed(coder)
            problems = _problems(bench)
            assert set(problems) == {"writes-read-only"}, f"a read-only folder: {problems}"
            assert problems["writes-read-only"].endswith(" (+1 more)"), problems
            assert "writes-read-only" in passes.HEALTH_PROBLEMS
        finally:
            _read_only(bench.slots, ro=False)

        filler.unlink()
        bench.changed(coder)  # agent still fails for good reason: only its write is said now
        problems = _problems(bench)
        assert set(problems) == {"writes"}, f"after coder was written: {problems}"
        assert problems["writes"].startswith(f"slot writes fail: {agent}: "), problems
        assert not problems["writes"].endswith("more)"), f"coder is still counted: {problems}"
        bench.full()
        assert ("gpu-rocm", "gpu-rocm") == (device_of(agent), device_of(coder))
        assert {} == _problems(bench), "write problems stayed after the slots were written"


def test_a_write_that_waited_out_hal0s_lock_is_no_lasting_problem(tmp_path: Path) -> None:
    """hal0 holding its slot lock longer than lock_timeout fails the write for now (the slot
    is tried again at its next event or resync): that is no problem in the status."""
    bench = Bench(tmp_path, lock_timeout=0.1)
    agent = bench.slot("agent")
    with holding_lock(bench.settings.effective_lock_file):
        bench.full()
    assert "gpu-vulkan" == device_of(agent), "setup: the write should wait out the lock"
    assert {} == _problems(bench), "a write that waited out hal0's lock was called lasting"
