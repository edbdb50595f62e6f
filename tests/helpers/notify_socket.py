"""A real ``NOTIFY_SOCKET``: an AF_UNIX datagram socket bound by the test, collecting messages."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from pathlib import Path

from hal0_reconciler import lifecycle


class NotifySocket(lifecycle.StartStop):
    """Binds a datagram socket and records every message in order (a reader thread)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="hal0-notify-")
        self.path = Path(self._dir.name) / "notify.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        self._sock.settimeout(0.1)
        self._messages: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="test-notify-socket", daemon=True)

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._cond:
                self._messages.append((time.monotonic(), data.decode("latin-1")))
                self._cond.notify_all()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._drain()  # what was sent before we stopped reading (a child's last STOPPING=1)
        self._sock.close()
        self._dir.cleanup()

    def _drain(self) -> None:
        self._sock.setblocking(False)
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:  # BlockingIOError: nothing left
                return
            with self._cond:
                self._messages.append((time.monotonic(), data.decode("latin-1")))
                self._cond.notify_all()

    def messages(self) -> list[str]:
        with self._cond:
            return [m for _, m in self._messages]

    def timed(self) -> list[tuple[float, str]]:
        with self._cond:
            return list(self._messages)

    def lifecycle(self) -> list[str]:
        """The messages without STATUS= and WATCHDOG= (READY, RELOADING, STOPPING ...)."""
        return [m for m in self.messages() if not m.startswith(("STATUS=", "WATCHDOG="))]

    def wait_for(self, message: str, *, count: int = 1, timeout: float = 15.0) -> None:
        """Wait until ``message`` was received ``count`` times; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(1 for _, m in self._messages if m == message) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{message!r} x{count} not received in {timeout}s; got {self.messages()}"
                    )
                self._cond.wait(left)
