"""Talking to systemd: the Notifier seam, the sdnotify adapter and a null notifier.

Every message is one datagram. ``STATUS=`` is forced to one short printable-ASCII line:
sdnotify encodes Latin-1 and silently drops what it cannot encode.
"""

from __future__ import annotations

import os
import re
from typing import Protocol

import sdnotify

_STATUS_MAX = 200
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]+")


class Notifier(Protocol):
    """What the runner tells the service manager."""

    def ready(self) -> None: ...
    def reloading(self) -> None: ...
    def stopping(self) -> None: ...
    def status(self, text: str) -> None: ...
    def watchdog(self) -> None: ...
    def watchdog_interval(self) -> float | None:
        """Seconds between two ``WATCHDOG=1`` pings (``WATCHDOG_USEC``/2), None when not asked."""
        ...


def ascii_status(text: str) -> str:
    """One short printable-ASCII line (other characters become ``?``, length capped)."""
    return _NOT_PRINTABLE_ASCII.sub("?", text)[:_STATUS_MAX]


def watchdog_interval_from_env() -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, when it is set for this process (``WATCHDOG_PID``)."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2_000_000


class SdNotifier:
    """The sdnotify adapter: a no-op when ``NOTIFY_SOCKET`` is not set."""

    def __init__(self) -> None:
        self._sd = sdnotify.SystemdNotifier()
        self._interval = watchdog_interval_from_env()

    def _send(self, message: str) -> None:
        self._sd.notify(message)

    def ready(self) -> None:
        self._send("READY=1")

    def reloading(self) -> None:
        self._send("RELOADING=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def status(self, text: str) -> None:
        self._send(f"STATUS={ascii_status(text)}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def watchdog_interval(self) -> float | None:
        return self._interval


class NullNotifier:
    """Says nothing: for ``run`` outside systemd and for tests."""

    def ready(self) -> None:
        pass

    def reloading(self) -> None:
        pass

    def stopping(self) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def watchdog(self) -> None:
        pass

    def watchdog_interval(self) -> float | None:
        return None


def from_environment() -> Notifier:
    """The sdnotify adapter when ``NOTIFY_SOCKET`` is set, else the null notifier."""
    return SdNotifier() if os.environ.get("NOTIFY_SOCKET") else NullNotifier()
