"""The kernel's inotify queue size, shrunk by the overflow tests for their own instances only."""

from __future__ import annotations

from pathlib import Path

MAX_QUEUED = Path("/proc/sys/fs/inotify/max_queued_events")
_KERNEL_DEFAULT = "16384\n"


def size_to_restore() -> str:
    """The value to put back afterwards: the current one, unless it is a tiny value another,
    interrupted or concurrent, test left behind (then the kernel's default)."""
    current = MAX_QUEUED.read_text()
    return current if int(current) >= 1024 else _KERNEL_DEFAULT
