"""The stop and reload signals are held from the process's first instant until handled.

Importing the command line (structlog, watchdog, the settings ...) takes a few hundred
milliseconds; a SIGHUP or SIGTERM in that time would kill the process with the default action.
So the entry point (``_entry``) blocks them before anything else: they stay pending, and are
delivered by ``release`` right after the daemon installed its handlers (or, for the one-shot
verbs, before any work starts, and before any subprocess, which would inherit the mask).
"""

from __future__ import annotations

import signal

HELD = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def hold() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def release() -> None:
    """Deliver what arrived meanwhile (to the handlers now in place, or the default action)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
