"""Named threads: ``ps -L``, ``top -H``, py-spy and ``/proc/<pid>/task/*/comm`` say what each
thread of the daemon is, not ``python3``.

:func:`start` (or :class:`NamedThread`) gives a thread its Python name and, as its first act, the
kernel's name for it (``prctl(PR_SET_NAME)``, at most 15 bytes: longer names are cut);
:func:`name_current` names the calling thread (the main thread, a thread started by a library
that runs our code); :func:`name_other` names a thread that runs none of our code (watchdog's
observer and emitters) by its pthread handle. Naming never fails the caller: where the C library
cannot be loaded (not Linux, no libc) only the Python name is set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

PR_SET_NAME = 15  # <linux/prctl.h>
COMM_MAX = 15  # TASK_COMM_LEN (16) less the terminating NUL

_libc: Any = None
_loaded = False
_load_lock = threading.Lock()


def _c_library() -> Any:
    """The running C library (``ctypes.CDLL(None)``: the process's own symbols, no lookup of
    a file name), or None."""
    global _libc, _loaded  # noqa: PLW0603 - loaded once, on first use
    with _load_lock:
        if not _loaded:
            _loaded = True
            import ctypes  # noqa: PLC0415 - at the first thread named: not for plan or once

            try:
                _libc = ctypes.CDLL(None, use_errno=True)
                _libc.prctl  # noqa: B018 - present on Linux
            except (OSError, AttributeError):
                _libc = None
        return _libc


def kernel_name(name: str) -> bytes:
    """The name as the kernel keeps it: UTF-8, cut to 15 bytes (never inside a character)."""
    raw = name.encode("utf-8", "replace")[:COMM_MAX]
    return raw.decode("utf-8", "ignore").encode("utf-8")


def name_current(name: str) -> bool:
    """Name the calling thread (Python and kernel). True when the kernel took the name."""
    threading.current_thread().name = name
    libc = _c_library()
    if libc is None:
        return False
    import ctypes  # noqa: PLC0415 - loaded by _c_library already

    try:
        return int(libc.prctl(PR_SET_NAME, ctypes.c_char_p(kernel_name(name)), 0, 0, 0)) == 0
    except (OSError, ctypes.ArgumentError):
        return False


def name_other(thread: threading.Thread, name: str) -> bool:
    """Name a started thread that runs no code of ours, from another thread
    (``pthread_setname_np`` on its handle). True when the kernel took the name. A thread not
    running (not yet, or no more) keeps its names: one still starting is named when asked again."""
    ident = thread.ident
    if ident is None or not thread.is_alive():
        return False
    thread.name = name
    libc = _c_library()
    if libc is None:
        return False
    import ctypes  # noqa: PLC0415 - loaded by _c_library already

    try:
        setname = libc.pthread_setname_np
    except AttributeError:
        return False
    setname.argtypes = (ctypes.c_ulong, ctypes.c_char_p)
    setname.restype = ctypes.c_int
    try:
        return int(setname(ident, kernel_name(name))) == 0
    except (OSError, ctypes.ArgumentError):
        return False


class NamedThread(threading.Thread):
    """A thread that names itself in the kernel before it runs its target."""

    def run(self) -> None:
        name_current(self.name)
        super().run()


def start(
    target: Callable[..., object],
    name: str,
    *,
    args: tuple[object, ...] = (),
    daemon: bool = True,
) -> NamedThread:
    """Start ``target(*args)`` on a new thread named ``name`` (Python and kernel)."""
    thread = NamedThread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
