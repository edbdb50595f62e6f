"""stdlib logging's side of ``_log`` (watchdog logs through it): formatters and our handler.

Its own module so that ``logging`` (and traceback, linecache, tokenize ...) is imported only
when logging is really set up.
"""

from __future__ import annotations

import json
import logging

from hal0_reconciler._writelock import WRITE_LOCK


class _StdlibJournalFormatter(logging.Formatter):
    """stdlib records (watchdog's) as one prefixed line too."""

    def format(self, record: logging.LogRecord) -> str:
        priority = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4}.get(record.levelno, 3)
        text = super().format(record).replace("\n", "\\n")
        return f"<{priority}>{text}"


class _StdlibJsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "event": record.getMessage(),
            "logger": record.name,
            "level": record.levelname.lower(),
        }
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload)


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stdlib handler this module installs (the one a second ``configure`` replaces).

    It writes under ``_writelock.WRITE_LOCK``, the lock structlog's lines are written under, so
    a library's warning and an event logged at the same instant stay two lines.
    """

    def createLock(self) -> None:  # noqa: N802 - logging's name
        self.lock = WRITE_LOCK
