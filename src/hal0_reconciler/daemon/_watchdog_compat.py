"""Two changes to how watchdog's inotify reader behaves, made once per process.

**Overflows.** watchdog before 4.x drops inotify's queue-overflow event without a word.

Newer watchdog logs "Inotify queue overflowed; filesystem events were lost" on the
``watchdog.observers.inotify_c`` logger, which ``watch.py`` listens to. Debian 12 ships watchdog
2.2, whose reader skips every event with watch descriptor -1, IN_Q_OVERFLOW included; there the
daemon would only notice lost events at the next periodic resync. ``report_overflows()`` wraps
that version's event-buffer parser so it logs the same warning. It changes nothing on a watchdog
that already reports overflows.

**Moves.** watchdog holds every rename's first half (``IN_MOVED_FROM``) up to half a second,
to pair it with its second half (``IN_MOVED_TO``); the thread that hands events on sleeps
through that whole delay whenever such a half reaches the head of its queue first, even when
the pair was made meanwhile, and every event behind it waits (while the reader scans the
growing queue for each later rename). A burst of saves (hal0's and the daemon's own are all
renames) arrived in half-second steps. The kernel queues a rename's two halves together, so
``prompt_moves()`` makes the delay ``MOVE_PAIRING_DELAY``. A half left unpaired is reported as
the file deleted (its old name) and created (its new one): to the daemon the same keys.
"""

from __future__ import annotations

import importlib
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


MOVE_PAIRING_DELAY = 0.02
"""Seconds watchdog waits for a rename's second half (its own default: 0.5)."""
# where each watchdog keeps that delay: 3.0 and later, then 2.x (Debian 12)
_MOVE_GROUPERS = (
    ("watchdog.observers.inotify_move_event_grouper", "InotifyMoveEventGrouper"),
    ("watchdog.observers.inotify_buffer", "InotifyBuffer"),
)


def prompt_moves() -> bool:
    """Make watchdog pair a rename's halves within ``MOVE_PAIRING_DELAY`` (observers made from
    now on); returns whether a delay was found and set."""
    found = False
    for module_name, class_name in _MOVE_GROUPERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        grouper = getattr(module, class_name, None)
        if isinstance(getattr(grouper, "delay", None), int | float):
            grouper.delay = min(grouper.delay, MOVE_PAIRING_DELAY)  # type: ignore[union-attr]
            found = True
    return found
