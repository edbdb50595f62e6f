"""Just enough of a TOML scanner to edit one key in place.  [pure]

It finds every table header, every `key = value` statement and every inline table of a valid
document, with the offsets an edit needs: statements on lines of their own, and the key/value
pairs inside inline tables (which may nest). It steps over strings and arrays, so text that
merely looks like a key inside a value is never taken for one. Inline tables inside arrays are
stepped over too: their tables have no path an edit could name. (Paths under an array of
tables are noted as if it were one table; the editor never asks for one, as its target must be
a table all the way down.)
"""

from __future__ import annotations

import dataclasses
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
    """One `key = value` pair, with the offsets an edit needs."""

    table: tuple[str, ...]  # the table the key lands in: `base` + the dotted-key prefix
    base: tuple[str, ...]  # the table its container defines: a header's path, an inline table's
    key: str  # the last part of the key, decoded
    inline: int | None  # offset of the `{` of the inline table it sits in; None: its own line
    line_start: int  # start of its first physical line (inline: = stmt_start)
    stmt_start: int  # where its key starts
    key_spans: tuple[tuple[int, int], ...]  # each key part as written
    value_start: int
    value_end: int
    line_end: int  # after the line ending of its last line, or EOF (inline: = value_end)

    @property
    def key_start(self) -> int:
        return self.key_spans[-1][0]

    @property
    def key_end(self) -> int:
        return self.key_spans[-1][1]


@dataclass(frozen=True)
class InlineTable:
    path: tuple[str, ...]  # the table it defines
    start: int  # offset of `{`
    end: int  # offset of `}`


@dataclass(frozen=True)
class Scan:
    headers: tuple[Header, ...]
    entries: tuple[Entry, ...]  # in the order their values end (inner pairs before outer ones)
    inlines: tuple[InlineTable, ...]


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^ \t\r\n#,\]}]+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME_AFTER_SPACE = re.compile(r" \d{2}:")


def scan(text: str) -> Scan:
    """Every table header, key/value pair and inline table of a valid TOML document."""
    scanner = _Scanner(text)
    headers: list[Header] = []
    current: tuple[str, ...] = ()
    while scanner.pos < len(text):
        line_start = scanner.pos
        scanner.skip_spaces()
        if scanner.at("["):
            array = scanner.at("[[")
            scanner.pos += 2 if array else 1
            current, _ = scanner.key()
            scanner.expect("]]" if array else "]")
            headers.append(Header(current, array, line_start, scanner.end_of_line()))
        elif scanner.pos < len(text) and text[scanner.pos] not in "#\r\n":
            scanner.pair(current, line_start=line_start)
        else:
            scanner.end_of_line()
    return Scan(tuple(headers), tuple(scanner.entries), tuple(scanner.inlines))


class _Scanner:
    """A cursor over TOML text that steps over keys and values, noting where pairs are."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.entries: list[Entry] = []
        self.inlines: list[InlineTable] = []

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
        """Spaces, line endings and comments (inside inline tables)."""
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

    def pair(self, base: tuple[str, ...], *, line_start: int) -> None:
        """One `key = value` statement on its own line(s)."""
        stmt_start = self.pos
        parts, spans = self.key()
        self.expect("=")
        self.skip_spaces()
        value_start = self.pos
        if self.at("{"):
            self.inline_tables(base + parts)
        else:
            self.value()
        value_end = self.pos
        self.entries.append(
            Entry(
                table=base + parts[:-1],
                base=base,
                key=parts[-1],
                inline=None,
                line_start=line_start,
                stmt_start=stmt_start,
                key_spans=spans,
                value_start=value_start,
                value_end=value_end,
                line_end=self.end_of_line(),
            )
        )

    def inline_tables(self, path: tuple[str, ...]) -> None:
        """An inline table defining `path`, and every inline table nested in it, noting each
        pair. A loop with a stack of the open tables, not recursion: nesting depth is no limit.
        """
        opened: list[tuple[InlineTable, Entry | None]] = []  # each with the pair it is the value of
        table, pair = InlineTable(path, self.pos, -1), None
        self.pos += 1
        while True:
            self.skip_blank()
            if self.at("}"):
                self.inlines.append(dataclasses.replace(table, end=self.pos))
                self.pos += 1
                if pair is not None:
                    self.entries.append(
                        dataclasses.replace(pair, value_end=self.pos, line_end=self.pos)
                    )
                if not opened:
                    return
                table, pair = opened.pop()
            elif self.at(","):
                self.pos += 1
            elif self.pos >= len(self.text):
                raise CannotEdit("unterminated inline table")
            else:
                stmt_start = self.pos
                parts, spans = self.key()
                self.expect("=")
                self.skip_spaces()
                found = Entry(
                    table=table.path + parts[:-1],
                    base=table.path,
                    key=parts[-1],
                    inline=table.start,
                    line_start=stmt_start,
                    stmt_start=stmt_start,
                    key_spans=spans,
                    value_start=self.pos,
                    value_end=-1,
                    line_end=-1,
                )
                if self.at("{"):
                    opened.append((table, pair))
                    table, pair = InlineTable(table.path + parts, self.pos, -1), found
                    self.pos += 1
                else:
                    self.value()
                    self.entries.append(
                        dataclasses.replace(found, value_end=self.pos, line_end=self.pos)
                    )

    def key(self) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
        """A (dotted) key: its decoded parts and the span of each part as written."""
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
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
            spans.append((start, self.pos))
            self.skip_spaces()
            if not self.at("."):
                return tuple(parts), tuple(spans)
            self.pos += 1

    def value(self) -> None:
        """Step over one value, noting nothing in it."""
        if self.at('"""') or self.at("'''"):
            self.multi_line_string(self.text[self.pos : self.pos + 3])
        elif self.at('"') or self.at("'"):
            self.single_line_string(self.text[self.pos])
        elif self.at("[") or self.at("{"):
            self.collection()
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

    def collection(self) -> None:
        """An array or inline table, over as many lines as it takes, however deeply nested (a
        loop, not recursion). Nothing in it is noted: the tables in an array have no path.
        """
        depth = 0
        while True:
            if self.pos >= len(self.text):
                raise CannotEdit("unterminated array or inline table")
            if self.at('"""') or self.at("'''"):
                self.multi_line_string(self.text[self.pos : self.pos + 3])
            elif self.at('"') or self.at("'"):
                self.single_line_string(self.text[self.pos])
            elif self.at("#"):
                self.skip_comment()
            else:  # brackets, commas, `=`, dots, bare keys and scalars: a character at a time
                char = self.text[self.pos]
                self.pos += 1
                depth += (char in "[{") - (char in "]}")
                if depth == 0:
                    return

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
