"""Rewrite one slot's device label in TOML text, byte-minimal, checked by re-parsing.  [pure]

`set_device` sets `device` (and drops a legacy `backend` key) in one table and leaves every
other byte alone: comments, key order, spacing, blank lines, line endings, the final newline
or its absence. It finds the lines with a small scanner that knows just enough TOML to tell
which table a key lands in and to step over multi-line strings, multi-line arrays and inline
tables, so text that merely looks like `device = "..."` inside a value is never touched.

Whatever the scanner produces is parsed again and must equal the old document with exactly
the intended change. When that cannot be done (an inline `slot = {device = ...}` table, a
multi-line device string, a table without a header line of its own ...) the whole document is
re-serialised with tomli_w instead, and the result says so: comments and layout are then lost.

Where a missing `device` key is inserted:
- in a named table: as the first line after the table's header line;
- in the root table: after the last root key line, else just before the first table header,
  else at the end of the document.
It takes the indentation of the table's first key and the document's line ending (CRLF when
the document has any, else LF).
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from typing import Any

import tomli_w

from hal0_reconciler import errors

__all__ = ["EditResult", "set_device"]


@dataclass(frozen=True)
class EditResult:
    """The rewritten document, and whether it kept every byte but the device label."""

    text: str
    byte_minimal: bool  # False: re-serialised with tomli_w; comments and layout are gone
    note: str | None = None  # why the byte-minimal rewrite was not possible


def set_device(text: str, *, table: tuple[str, ...], new: str) -> EditResult:
    """Set `device = new` in `table` (`()` is the root) and drop `backend` from that table.

    Text that already says so is returned unchanged. Raises EditRefused when the text is not
    TOML, the table does not exist, or no rewrite can be verified.
    """
    old = _load(text)
    expected = copy.deepcopy(old)
    target = _table(expected, table)
    target["device"] = new
    target.pop("backend", None)
    if _same(old, expected):
        return EditResult(text, byte_minimal=True)
    try:
        candidate = _rewrite(text, table, new)
    except _CannotEdit as exc:
        note = str(exc)
    except RecursionError:
        note = "values nested too deeply to scan"
    else:
        if _parses_to(candidate, expected):
            return EditResult(candidate, byte_minimal=True)
        note = "the byte-minimal rewrite did not re-parse to the intended document"
    return EditResult(_dump(expected, note), byte_minimal=False, note=note)


class _CannotEdit(Exception):
    """The byte-minimal rewrite is not possible; the message says why."""


def _load(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise errors.EditRefused(f"the slot file is not valid TOML: {exc}") from exc


def _table(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The table at `path`, which must be a table all the way down."""
    node = data
    for depth, key in enumerate(path):
        child = node.get(key)
        if not isinstance(child, dict):
            raise errors.EditRefused(f"no table [{_dotted(path[: depth + 1])}] to set device in")
        node = child
    return node


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _same(a: Any, b: Any) -> bool:
    """Equality of parsed TOML that also tells 1 from 1.0 from true, and nan from nan."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


def _parses_to(text: str, expected: dict[str, Any]) -> bool:
    try:
        return _same(tomllib.loads(text), expected)
    except (tomllib.TOMLDecodeError, RecursionError):
        return False


def _dump(expected: dict[str, Any], note: str) -> str:
    try:
        text = tomli_w.dumps(expected)
    except (TypeError, ValueError) as exc:
        raise errors.EditRefused(f"{note}, and tomli_w cannot write the document: {exc}") from exc
    if not _parses_to(text, expected):
        raise errors.EditRefused(f"{note}, and tomli_w's rewrite does not re-parse identically")
    return text


# --- the byte-minimal rewrite ---------------------------------------------------------------


def _rewrite(text: str, table: tuple[str, ...], new: str) -> str:
    headers, entries = _statements(text)
    mine = [entry for entry in entries if entry.table == table]
    device = next((entry for entry in mine if entry.key == "device"), None)
    backend = next((entry for entry in mine if entry.key == "backend"), None)
    edits: list[tuple[int, int, str]] = []
    if device is not None:
        old_value = text[device.value_start : device.value_end]
        if old_value.startswith(("'''", '"""')):
            raise _CannotEdit("device is written as a multi-line string")
        if not old_value.startswith(("'", '"')):
            raise _CannotEdit("device is not written as a string")
        edits.append((device.value_start, device.value_end, _quoted(new, like=old_value)))
        if backend is not None:
            edits.append(_line_removal(text, backend))
    elif backend is not None:
        old_value = text[backend.value_start : backend.value_end]
        edits.append((backend.key_start, backend.key_end, "device"))
        edits.append((backend.value_start, backend.value_end, _quoted(new, like=old_value)))
    else:
        edits.append(_insertion(text, table, headers, mine, new))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _line_removal(text: str, entry: _Entry) -> tuple[int, int, str]:
    """Delete the statement's lines with their line ending; at an unterminated end of the
    document, delete the line ending before them instead, so the document still ends unterminated.
    """
    if entry.line_end == len(text) and not text.endswith("\n") and entry.line_start > 0:
        before = 2 if text.startswith("\r\n", entry.line_start - 2) else 1
        return (entry.line_start - before, entry.line_end, "")
    return (entry.line_start, entry.line_end, "")


def _insertion(
    text: str, table: tuple[str, ...], headers: list[_Header], mine: list[_Entry], new: str
) -> tuple[int, int, str]:
    eol = "\r\n" if "\r\n" in text else "\n"
    indent = text[mine[0].line_start : mine[0].stmt_start] if mine else ""
    line = indent + "device = " + _quoted(new, like='"')
    if table:
        header = next((h for h in headers if h.path == table and not h.array), None)
        if header is None:
            raise _CannotEdit(
                f"[{_dotted(table)}] has no header line of its own (inline table or dotted keys)"
            )
        at = header.line_end
    elif mine:
        at = mine[-1].line_end
    elif headers:
        return (headers[0].line_start, headers[0].line_start, line + eol)
    else:
        at = len(text)
    if at == len(text) and text and not text.endswith("\n"):
        return (at, at, eol + line)
    return (at, at, line + eol)


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_LITERAL_SAFE = re.compile(r"[^'\x00-\x08\x0a-\x1f\x7f]*")


def _quoted(value: str, *, like: str) -> str:
    """`value` as a single-line TOML string, in the quote style of `like` when it fits."""
    if like.startswith("'") and not like.startswith("'''") and _LITERAL_SAFE.fullmatch(value):
        return f"'{value}'"
    escaped = "".join(
        _ESCAPES.get(char) or (f"\\u{ord(char):04x}" if char < " " or char == "\x7f" else char)
        for char in value
    )
    return f'"{escaped}"'


# --- the scanner ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Header:
    path: tuple[str, ...]
    array: bool  # [[path]]
    line_start: int
    line_end: int  # after the line ending (or the end of the document)


@dataclass(frozen=True)
class _Entry:
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


def _statements(text: str) -> tuple[list[_Header], list[_Entry]]:
    """Every table header and every top-level key/value statement of a valid TOML document."""
    scan = _Scanner(text)
    headers: list[_Header] = []
    entries: list[_Entry] = []
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
            headers.append(_Header(current, array, line_start, scan.end_of_line()))
        elif scan.pos < len(text) and text[scan.pos] not in "#\r\n":
            parts, (key_start, key_end) = scan.key()
            scan.expect("=")
            scan.skip_spaces()
            value_start = scan.pos
            scan.value()
            value_end = scan.pos
            entries.append(
                _Entry(
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
            raise _CannotEdit(f"unexpected text at offset {self.pos} (wanted {token!r})")
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
            raise _CannotEdit(f"unexpected text at offset {self.pos} (wanted a line end)")
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
                    raise _CannotEdit(f"no key at offset {self.pos}")
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
        raise _CannotEdit("unterminated string")

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
        raise _CannotEdit("unterminated multi-line string")

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
                raise _CannotEdit("unterminated array or inline table")
            if keyed:
                self.key()
                self.expect("=")
                self.skip_spaces()
            self.value()

    def scalar(self) -> None:
        """A number, boolean or date-time (which may hold one space: `1979-05-27 07:32:00`)."""
        match = _SCALAR.match(self.text, self.pos)
        if match is None:
            raise _CannotEdit(f"no value at offset {self.pos}")
        self.pos = match.end()
        if _DATE.fullmatch(match.group()) and _TIME_AFTER_SPACE.match(self.text, self.pos):
            self.pos += 1
            self.scalar()


def _decode_basic(quoted: str) -> str:
    """The text of a basic-string key, escapes resolved (by tomllib itself)."""
    try:
        value = tomllib.loads(f"k = {quoted}")["k"]
    except tomllib.TOMLDecodeError as exc:
        raise _CannotEdit(f"bad quoted key {quoted}") from exc
    if not isinstance(value, str):
        raise _CannotEdit(f"bad quoted key {quoted}")
    return value
