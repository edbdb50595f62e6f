"""What the command line shows a person: one error prefix, colour only where it belongs, and
JSON with ``null`` for nothing.

Colour is used only when the stream is a terminal and nobody asked otherwise: ``--no-color``,
``NO_COLOR`` set to anything non-empty (https://no-color.org) or ``TERM=dumb`` turn it off, and
a file or a pipe never gets an escape code.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

PROG = "hal0-reconciler"

_STYLES = {"bold": "1", "red": "31", "green": "32", "yellow": "33", "dim": "2"}
_colour_refused = False  # --no-color: set once by the command line, for the whole process


def refuse_colour() -> None:
    """``--no-color``: no escape codes anywhere in this process (logs included)."""
    global _colour_refused  # noqa: PLW0603 - one process-wide switch, set once at start
    _colour_refused = True


def colour_enabled(stream: TextIO | None = None) -> bool:
    """True only for a terminal, without --no-color, NO_COLOR or TERM=dumb."""
    if _colour_refused or os.environ.get("NO_COLOR", "") != "":
        return False
    if os.environ.get("TERM", "") == "dumb":
        return False
    try:
        return (stream if stream is not None else sys.stdout).isatty()
    except (AttributeError, ValueError):
        return False


def paint(text: str, style: str, stream: TextIO | None = None) -> str:
    """``text`` in ``style`` when ``stream`` takes colour, else unchanged."""
    if not text or not colour_enabled(stream):
        return text
    return f"\033[{_STYLES[style]}m{text}\033[0m"


def error(message: str) -> None:
    """The one error line every verb prints: ``hal0-reconciler: error: <message>``."""
    sys.stderr.write(f"{PROG}: {paint('error', 'red', sys.stderr)}: {message}\n")


def nulls(value: Any) -> Any:
    """JSON for machines: an empty text is ``null``, not ``""`` (recursively)."""
    if isinstance(value, dict):
        return {k: nulls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [nulls(v) for v in value]
    return None if value == "" else value


def dump_json(doc: dict[str, Any], stream: TextIO | None = None) -> None:
    out = stream if stream is not None else sys.stdout
    out.write(json.dumps(nulls(doc), indent=2, default=str) + "\n")
