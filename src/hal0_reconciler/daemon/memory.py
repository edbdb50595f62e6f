"""Give memory back after a big batch: a flood of events must not leave the daemon fat.

Nothing the daemon keeps grows per event (the work queue holds each key once, the status keeps
one entry per existing slot file). But after tens of thousands of files came and went, the
freed memory stays in the process: CPython's allocator and glibc's heap keep it for reuse.
``release`` collects garbage and asks glibc to return its free pages (``malloc_trim``), after
a full pass or a batch of many files; it costs a few milliseconds, never on an idle path.

While the daemon starts, the cyclic garbage collector is off (``hold``, from the entry point's
first lines: the imports and the first pass make long-lived objects, and CPython's collections
of them were ~12 ms before READY); ``resume`` turns it on again once READY is sent, and collects
then what the start left (the first pass's release waits for it).
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


class _Held:
    """Whether the collector is held for the start, and whether it was on before."""

    was_enabled: bool | None = None  # None: not held


def hold() -> None:
    """The daemon's start: no garbage collection until ``resume``."""
    if _Held.was_enabled is None:
        _Held.was_enabled = gc.isenabled()
        gc.disable()


def resume() -> None:
    """The start is over (READY was sent, or the daemon stops): the collector goes on again
    (when it was on), and the start's garbage is collected now (a full collection; glibc's
    free pages trimmed)."""
    was_enabled, _Held.was_enabled = _Held.was_enabled, None
    if was_enabled is None:
        return
    if was_enabled:
        gc.enable()
    release()


def release() -> None:
    """Collect garbage, then hand free heap pages back to the kernel (glibc); while the
    collector is held (the daemon's start), ``resume`` does it."""
    if _Held.was_enabled is not None:
        return
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
