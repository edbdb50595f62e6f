"""What the command line shows a person: one error prefix, colour only where it belongs, text
that cannot drive the terminal, and JSON with ``null`` for nothing.

Colour is used only when the stream is a terminal and nobody asked otherwise: ``--no-color``,
``NO_COLOR`` set to anything non-empty (https://no-color.org) or ``TERM=dumb`` turn it off, and
a file or a pipe never gets an escape code.

Terminal output is inert: names, paths, images and messages come from files other users write,
so every control character in human-readable text (C0 with ESC, DEL, C1, and the Unicode bidi
overrides and isolates) is shown escaped, ``\\x1b`` / ``\\u202e`` style (:func:`inert`), and the
only escape codes that reach a terminal are this module's own colours (:func:`say`). JSON stays
exact: ``json.dumps`` escapes control characters itself.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, TextIO, cast

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


_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
CONTROLS = frozenset(
    (*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))
)
"""What is never written raw to a terminal: C0 (ESC included), DEL, C1, bidi overrides/isolates."""
_ESCAPES = {c: _NAMED.get(c, f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in CONTROLS}
_ESCAPES_BUT_NEWLINE = {c: e for c, e in _ESCAPES.items() if c != 0x0A}
_OUR_CODES = re.compile("(\033\\[(?:0|" + "|".join(sorted(_STYLES.values())) + ")m)")


def inert(value: object) -> str:
    """``value`` as text that cannot drive a terminal: each control character (newline and tab
    too: one value stays on one line) becomes its escape, ``\\x1b``, ``\\n``, ``\\u202e``."""
    return str(value).translate(_ESCAPES)


def inert_lines(text: str) -> str:
    """Like :func:`inert` for a whole report: its newlines stay, every other control is escaped."""
    return text.translate(_ESCAPES_BUT_NEWLINE)


def plain(value: object) -> str:
    """A logged value as text for a person (console and journal lines): a list as ``a, b``
    (``a; b`` when an item holds a comma itself; ``none`` when empty), a table as
    ``key: value, ...``, a flag as ``true``/``false``; text as it is. Not yet inert."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple | set | frozenset):
        items = [
            plain(v)
            for v in (sorted(value, key=str) if isinstance(value, set | frozenset) else value)
        ]
        joiner = "; " if any("," in item for item in items) else ", "
        return joiner.join(items) or "none"
    return "none" if value is None else str(value)


def say(text: str, stream: TextIO | None = None, *, painted: bool = False) -> None:
    """Write a report's ``text`` and a newline, inert (:func:`inert_lines`). ``painted``: the
    text holds :func:`paint`'s colours, kept on a stream that takes colour (the values in it
    must have gone through :func:`inert` already); any other escape code is shown escaped."""
    out = stream if stream is not None else sys.stdout
    if painted and colour_enabled(out):
        pieces = _OUR_CODES.split(text)  # odd items: our own colour codes
        text = "".join(p if i % 2 else inert_lines(p) for i, p in enumerate(pieces))
    else:
        text = inert_lines(text)
    out.write(text + "\n")


class InertWriter:
    """A text stream's stand-in for a report printed line by line (``print(..., file=out)``):
    each write is made inert (:func:`inert`, its newlines too), except the newline ``print``
    ends it with, so one ``print`` is one line on the screen whatever its values hold."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(text if text == "\n" else inert(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @classmethod
    def over(cls, stream: TextIO) -> TextIO:
        """``stream`` behind an inert writer, typed as the stream it stands in for."""
        return cast("TextIO", cls(stream))


def paint(text: str, style: str, stream: TextIO | None = None) -> str:
    """``text`` in ``style`` when ``stream`` takes colour, else unchanged."""
    if not text or not colour_enabled(stream):
        return text
    return f"\033[{_STYLES[style]}m{text}\033[0m"


def error(message: str) -> None:
    """The one error line every verb prints: ``hal0-reconciler: error: <message>`` (inert:
    a message names paths and quotes what files say)."""
    sys.stderr.write(f"{PROG}: {paint('error', 'red', sys.stderr)}: {inert(message)}\n")


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
