"""Leftover temp files of our own writes (``reconcile.temps``): removed only under hal0's lock."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import structlog.testing

from hal0_reconciler import fsio
from hal0_reconciler.reconcile import temps


def _leftover(folder: Path) -> Path:
    path = fsio.temp_path_for(folder / "crashed.toml")
    path.write_text("left by a crash")
    return path


def test_a_crash_s_temp_file_is_removed_at_the_start_and_hal0_s_files_stay(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """Only this package's own temp files go, once, and the removal is said."""
    settings = make_settings()
    folder = settings.slots_dir
    ours = _leftover(folder)
    theirs = folder / ".agent.toml.tmp"  # hal0's own naming: never ours to remove
    theirs.write_text("hal0's")
    with structlog.testing.capture_logs() as logs:
        temps.LeftoverTemps().remove_at_start(settings)
    assert not ours.exists()
    assert theirs.exists()
    assert [("slot.temp_files_removed", 1)] == [(e["event"], e["count"]) for e in logs]


def test_the_start_looks_once(host_dirs: dict[str, Path], make_settings) -> None:
    """A temp file appearing after the first look waits for a failed write or the next start."""
    settings = make_settings()
    leftovers = temps.LeftoverTemps()
    leftovers.remove_at_start(settings)
    later = _leftover(settings.slots_dir)
    leftovers.remove_at_start(settings)
    assert later.exists()


def test_with_hal0_s_lock_held_elsewhere_nothing_is_removed_nor_waited_for(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """Another holder of the lock may have its temp file in flight: the start leaves them."""
    settings = make_settings()
    leftover = _leftover(settings.slots_dir)
    lock = settings.effective_lock_file
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with structlog.testing.capture_logs() as logs:
            temps.LeftoverTemps().remove_at_start(settings)
    finally:
        os.close(fd)
    assert leftover.exists()
    assert [] == logs


def test_a_holder_of_the_lock_removes_them_without_taking_it_again(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """``wait=True`` is the write group's, which holds the lock already."""
    settings = make_settings()
    leftover = _leftover(settings.slots_dir)
    temps.remove(settings, wait=True)
    assert not leftover.exists()


def test_no_temp_file_no_lock_taken(host_dirs: dict[str, Path], make_settings) -> None:
    """A clean folder costs no lock (hal0's lock file is not even created for it)."""
    settings = make_settings()
    temps.remove(settings, wait=False)
    assert not settings.effective_lock_file.exists()
