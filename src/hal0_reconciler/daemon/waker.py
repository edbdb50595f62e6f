"""The main loop's wake-up: a self-pipe that signal handlers (``set_wakeup_fd``) and threads
write to, and the loop sleeps on until its next timer."""

from __future__ import annotations

import contextlib
import os
import select


class Waker:
    """A self-pipe: signal handlers (``set_wakeup_fd``) and threads wake the main loop."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.write_fd, b"!")

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(InterruptedError):
            select.select([self.read_fd], [], [], max(0.0, timeout))
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.read_fd, 4096):
                pass

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
