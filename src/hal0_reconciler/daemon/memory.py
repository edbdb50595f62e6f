"""Give memory back after a big batch: a flood of events must not leave the daemon fat.

Nothing the daemon keeps grows per event (the work queue holds each key once, the status keeps
one entry per existing slot file). But after tens of thousands of files came and went, the
freed memory stays in the process: CPython's allocator and glibc's heap keep it for reuse.
``release`` collects garbage and asks glibc to return its free pages (``malloc_trim``), after
a full pass or a batch of many files; it costs a few milliseconds, never on an idle path.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable

BIG_BATCH = 256  # files in one batch from which its garbage is worth returning


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up at the first release, in the libc this process runs
    with (``dlopen(NULL)``: no ``find_library``, which runs ``ldconfig``)."""
    import ctypes  # noqa: PLC0415 - only when memory is released

    with contextlib.suppress(OSError, AttributeError):
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim  # glibc only
        return trim
    return None


def release() -> None:
    """Collect garbage, then hand free heap pages back to the kernel (glibc)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
