"""Which names a module file registered, read through its descriptor in bounded chunks.

Never a mapping: a file another user can change could be truncated under a map, and touching a
page past the new end kills the reader with SIGBUS. Here every byte comes from ``pread`` into a
buffer of at most ``CHUNK`` bytes (plus the longest name carried over from the chunk before, so
a name on a boundary is still found); a truncation while reading is a short read, answered
``CHANGED``. Before reading anything:

- a file larger than the cap is ``TOO_LARGE`` (not read at all);
- a file with a hole (``SEEK_HOLE`` before its end) is ``SPARSE`` (not read: its size costs
  the reader time and memory for bytes that do not exist; allocated-block counts are not used,
  compressed filesystems under-report them).

The same function runs in root's process for root's own trees and inside the owner's child for
anyone else's (``treechild``'s ``scan``), which answers only which names were found.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from hal0_reconciler import fsio
from hal0_reconciler.aiter.registry import names as namescan

CHUNK = 4 << 20
"""Bytes read per ``pread`` (the scan's memory is about this plus the longest name)."""


class Outcome(StrEnum):
    SCANNED = "scanned"
    TOO_LARGE = "too large"
    SPARSE = "sparse"
    CHANGED = "changed"  # a short read, or the file's identity moved while it was read
    OVER_BUDGET = "over budget"  # the check's time ran out before the file was read through


@dataclass(frozen=True)
class Scan:
    outcome: Outcome
    size: int
    found: frozenset[str] = frozenset()


def has_hole(fd: int, size: int) -> bool:
    """Whether the file has a hole before ``size`` (a filesystem that cannot say: no)."""
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < size
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # offset 0 is past the end: it shrank to nothing
            return False
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise


def scan_fd(
    fd: int,
    names: Iterable[str],
    *,
    max_bytes: int,
    deadline: float | None = None,
    chunk: int = CHUNK,
) -> Scan:
    """Scan the open regular file ``fd`` for ``names`` (the rule of ``namescan``).

    ``deadline`` (``time.monotonic``) is looked at between chunks. Raises OSError."""
    wanted = set(names)
    before = os.fstat(fd)
    size = before.st_size
    if size > max_bytes:
        return Scan(Outcome.TOO_LARGE, size)
    if size and has_hole(fd, size):
        return Scan(Outcome.SPARSE, size)
    raws = [n.encode("utf-8", "surrogateescape") for n in wanted]
    carry = max((len(r) for r in raws), default=0)  # a name and its NUL span one boundary
    found: set[str] = set()
    left = set(wanted)
    tail = b""
    offset = 0
    while offset < size and left:
        if deadline is not None and time.monotonic() > deadline:
            return Scan(Outcome.OVER_BUDGET, size, frozenset(found))
        want = min(chunk, size - offset)
        data = os.pread(fd, want, offset)
        if len(data) < want:
            return Scan(Outcome.CHANGED, size, frozenset(found))
        buf = tail + data
        hits = namescan.registered_in(buf, left)
        hit = {n for n, yes in hits.items() if yes}
        found |= hit
        left -= hit
        tail = buf[-carry:] if carry else b""
        offset += want
    if fsio.full_identity(os.fstat(fd)) != fsio.full_identity(before):
        return Scan(Outcome.CHANGED, size, frozenset(found))
    return Scan(Outcome.SCANNED, size, frozenset(found))
