"""Another process holding hal0's slot write lock (a real flock), for as long as a test needs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HOLD = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o664)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    if len(sys.argv) > 3:  # say so just before the lock goes (at exit)
        open(sys.argv[3], "w").close()
    """
)


@contextmanager
def holding_lock(
    lock: Path, *, seconds: float = 30.0, releasing: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child that has taken the lock (it said so); killed on leaving. ``releasing`` is
    created just before the child lets go of the lock by itself after ``seconds``."""
    argv = [sys.executable, "-c", _HOLD, str(lock), str(seconds)]
    if releasing is not None:
        argv.append(str(releasing))
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as holder:
        try:
            assert holder.stdout is not None
            if holder.stdout.readline() != b"locked\n":
                raise RuntimeError(f"the lock holder could not take {lock}")
            yield holder
        finally:
            holder.kill()
