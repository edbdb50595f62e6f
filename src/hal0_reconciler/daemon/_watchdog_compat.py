"""watchdog before 4.x drops inotify's queue-overflow event without a word.

Newer watchdog logs "Inotify queue overflowed; filesystem events were lost" on the
``watchdog.observers.inotify_c`` logger, which ``watch.py`` listens to. Debian 12 ships watchdog
2.2, whose reader skips every event with watch descriptor -1, IN_Q_OVERFLOW included; there the
daemon would only notice lost events at the next periodic resync. ``report_overflows()`` wraps
that version's event-buffer parser so it logs the same warning. It changes nothing on a watchdog
that already reports overflows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

try:
    from watchdog.observers import inotify_c
except ImportError:  # pragma: no cover - not Linux
    inotify_c = None  # type: ignore[assignment]

OVERFLOW_MESSAGE = "Inotify queue overflowed; filesystem events were lost"
_IN_Q_OVERFLOW = 0x00004000
_patched = False


def needs_patch() -> bool:
    """True for a watchdog whose inotify reader drops the overflow event silently."""
    return inotify_c is not None and not hasattr(inotify_c.InotifyEvent, "is_queue_overflow")


def report_overflows() -> bool:
    """Make an old watchdog log inotify overflows; returns whether a patch was applied."""
    global _patched  # noqa: PLW0603 - patch a library class once per process
    if _patched or not needs_patch():
        return False
    inotify: Any = getattr(inotify_c, "Inotify")  # noqa: B009 - gone in newer watchdog
    original: Callable[[bytes], Iterator[tuple[Any, ...]]] = inotify._parse_event_buffer  # noqa: SLF001
    logger = logging.getLogger(inotify_c.__name__)

    def parse_and_report(event_buffer: bytes) -> Iterator[tuple[Any, ...]]:
        for item in original(event_buffer):
            wd, mask = item[0], item[1]
            if wd == -1 and mask & _IN_Q_OVERFLOW:
                logger.warning(OVERFLOW_MESSAGE)
            yield item

    inotify._parse_event_buffer = staticmethod(parse_and_report)  # noqa: SLF001
    _patched = True
    return True
