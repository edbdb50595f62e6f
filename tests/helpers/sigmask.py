"""Which signals a process blocks, from the kernel (``SigBlk`` of ``/proc/<pid>/status``)."""

from __future__ import annotations

from pathlib import Path


def blocked(pid: int) -> frozenset[int]:
    """The signal numbers ``pid`` blocks. Raises OSError when the process is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return frozenset(n + 1 for n in range(mask.bit_length()) if mask >> n & 1)
    raise AssertionError(f"/proc/{pid}/status has no SigBlk")
