"""Just enough of a TOML scanner to edit one key in place.  [pure]

It finds every table header and every top-level `key = value` statement of a valid document,
with the offsets an edit needs, stepping over multi-line strings, multi-line arrays and inline
tables so that text which merely looks like a key inside a value is never taken for one.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass


class CannotEdit(Exception):
    """The byte-minimal rewrite is not possible; the message says why."""


@dataclass(frozen=True)
class Header:
    path: tuple[str, ...]
    array: bool  # [[path]]
    line_start: int
    line_end: int  # after the line ending (or the end of the document)


@dataclass(frozen=True)
class Entry:
    """One `key = value` statement, with the offsets an edit needs."""

    table: tuple[str, ...]  # the table the key lands in: header path + dotted-key prefix
    key: str  # the last part of the key, decoded
    line_start: int  # start of its first physical line
    stmt_start: int  # after the indentation
    key_start: int  # span of the last key part as written
    key_end: int
    value_start: int
    value_end: int
    line_end: int  # after the line ending of its last line (or the end of the document)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^ \t\r\n#,\]}]+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME_AFTER_SPACE = re.compile(r" \d{2}:")


def statements(text: str) -> tuple[list[Header], list[Entry]]:
    """Every table header and every top-level key/value statement of a valid TOML document."""
    scan = _Scanner(text)
    headers: list[Header] = []
    entries: list[Entry] = []
    current: tuple[str, ...] = ()
    while scan.pos < len(text):
        line_start = scan.pos
        scan.skip_spaces()
        stmt_start = scan.pos
        if scan.at("["):
            array = scan.at("[[")
            scan.pos += 2 if array else 1
            current, _ = scan.key()
            scan.expect("]]" if array else "]")
            headers.append(Header(current, array, line_start, scan.end_of_line()))
        elif scan.pos < len(text) and text[scan.pos] not in "#\r\n":
            parts, (key_start, key_end) = scan.key()
            scan.expect("=")
            scan.skip_spaces()
            value_start = scan.pos
            scan.value()
            value_end = scan.pos
            entries.append(
                Entry(
                    table=current + parts[:-1],
                    key=parts[-1],
                    line_start=line_start,
                    stmt_start=stmt_start,
                    key_start=key_start,
                    key_end=key_end,
                    value_start=value_start,
                    value_end=value_end,
                    line_end=scan.end_of_line(),
                )
            )
        else:
            scan.end_of_line()
    return headers, entries


class _Scanner:
    """A cursor over TOML text that steps over keys and values without interpreting them."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def at(self, token: str) -> bool:
        return self.text.startswith(token, self.pos)

    def expect(self, token: str) -> None:
        self.skip_spaces()
        if not self.at(token):
            raise CannotEdit(f"unexpected text at offset {self.pos} (wanted {token!r})")
        self.pos += len(token)

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def skip_comment(self) -> None:
        if self.at("#"):
            newline = self.text.find("\n", self.pos)
            end = len(self.text) if newline < 0 else newline
            self.pos = end - 1 if self.text[end - 1 : end] == "\r" else end

    def skip_blank(self) -> None:
        """Spaces, line endings and comments (inside arrays and inline tables)."""
        while True:
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
                self.pos += 1
            self.skip_comment()
            if self.pos == start:
                return

    def end_of_line(self) -> int:
        """Step over trailing spaces, a comment and the line ending; return the offset after."""
        self.skip_spaces()
        self.skip_comment()
        for eol in ("\r\n", "\n"):
            if self.at(eol):
                self.pos += len(eol)
                return self.pos
        if self.pos < len(self.text):
            raise CannotEdit(f"unexpected text at offset {self.pos} (wanted a line end)")
        return self.pos

    def key(self) -> tuple[tuple[str, ...], tuple[int, int]]:
        """A (dotted) key: its decoded parts and the span of its last part."""
        parts: list[str] = []
        while True:
            self.skip_spaces()
            start = self.pos
            if self.at('"'):
                self.single_line_string('"')
                parts.append(_decode_basic(self.text[start : self.pos]))
            elif self.at("'"):
                self.single_line_string("'")
                parts.append(self.text[start + 1 : self.pos - 1])
            else:
                match = _BARE_KEY.match(self.text, self.pos)
                if match is None:
                    raise CannotEdit(f"no key at offset {self.pos}")
                self.pos = match.end()
                parts.append(match.group())
            span = (start, self.pos)
            self.skip_spaces()
            if not self.at("."):
                return tuple(parts), span
            self.pos += 1

    def value(self) -> None:
        if self.at('"""') or self.at("'''"):
            self.multi_line_string(self.text[self.pos : self.pos + 3])
        elif self.at('"') or self.at("'"):
            self.single_line_string(self.text[self.pos])
        elif self.at("["):
            self.collection("]", keyed=False)
        elif self.at("{"):
            self.collection("}", keyed=True)
        else:
            self.scalar()

    def single_line_string(self, quote: str) -> None:
        self.pos += 1
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\" and quote == '"':
                self.pos += 2
            elif char == quote:
                self.pos += 1
                return
            elif char == "\n":
                break
            else:
                self.pos += 1
        raise CannotEdit("unterminated string")

    def multi_line_string(self, delimiter: str) -> None:
        self.pos += 3
        while self.pos < len(self.text):
            if delimiter == '"""' and self.at("\\"):
                self.pos += 2
            elif self.at(delimiter):
                # up to two more quotes right before the delimiter belong to the content
                quotes = 3
                while quotes < 5 and self.at(delimiter[0] * (quotes + 1)):
                    quotes += 1
                self.pos += quotes
                return
            else:
                self.pos += 1
        raise CannotEdit("unterminated multi-line string")

    def collection(self, closer: str, *, keyed: bool) -> None:
        """An array (`keyed=False`) or an inline table, over as many lines as it takes."""
        self.pos += 1
        while True:
            self.skip_blank()
            if self.at(closer):
                self.pos += 1
                return
            if self.at(","):
                self.pos += 1
                continue
            if self.pos >= len(self.text):
                raise CannotEdit("unterminated array or inline table")
            if keyed:
                self.key()
                self.expect("=")
                self.skip_spaces()
            self.value()

    def scalar(self) -> None:
        """A number, boolean or date-time (which may hold one space: `1979-05-27 07:32:00`)."""
        match = _SCALAR.match(self.text, self.pos)
        if match is None:
            raise CannotEdit(f"no value at offset {self.pos}")
        self.pos = match.end()
        if _DATE.fullmatch(match.group()) and _TIME_AFTER_SPACE.match(self.text, self.pos):
            self.pos += 1
            self.scalar()


def _decode_basic(quoted: str) -> str:
    """The text of a basic-string key, escapes resolved (by tomllib itself)."""
    try:
        value = tomllib.loads(f"k = {quoted}")["k"]
    except tomllib.TOMLDecodeError as exc:
        raise CannotEdit(f"bad quoted key {quoted}") from exc
    if not isinstance(value, str):
        raise CannotEdit(f"bad quoted key {quoted}")
    return value
