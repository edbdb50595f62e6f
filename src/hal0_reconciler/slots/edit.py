"""Rewrite one slot's device label in TOML text, byte-minimal, checked by re-parsing.  [pure]

`set_device` sets `device` (and drops a legacy `backend` key) in one table and leaves every
other byte alone: comments, key order, spacing, blank lines, line endings, the final newline
or its absence. A small scanner (`_tomlscan`) finds where each key/value pair is, whatever shape
holds it: a line of a `[table]` or of the root, a dotted key (`slot.device = ...`), a pair inside
an inline table (`slot = {device = ...}`, nested or not). Text that merely looks like
`device = "..."` inside a string, an array or another table is never touched.

The edit, for the target table:
- `device` present: only its value's span is replaced, in its own style (a basic, literal,
  multi-line basic or multi-line literal string stays one when the new value fits; a
  non-string value becomes a basic string). A `backend` beside it is deleted: its line(s), or
  inside an inline table the pair with one comma beside it.
- only `backend`: its key becomes `device` and its value is replaced, in place.
- neither: one pair is inserted: as the first line after the table's header line; in the root
  after the last root key line, else before the first table header, else at the end; inside an
  inline table after its last pair (`, device = "..."`); beside the last dotted key that makes the
  table, with the same prefix; or, for a table only made by `[table.sub]` headers, as a new
  `[table]` header with the pair, just before the first of them. A new line takes the indentation
  of the table's first key and the document's line ending (CRLF when it has any, else LF).

The common shape (one line `device = "..."` in the file, no `backend` in the table) is found
with one regular expression instead of the scanner; its edit is the scanner's, and is verified
the same way (a wrong line fails the re-parse, and the scanner is used).

Whatever the scanner produces is parsed again and must equal the old document with exactly the
intended change. Only when that cannot be done (`device` or `backend` is a table of its own,
made by a header or dotted sub-keys; values nested too deeply to scan) is the whole document
re-serialised with tomli_w instead, and the result says so: comments and layout are then lost.
`set_device` is pure, so a dry run can call it to say beforehand whether a write would be
byte-minimal.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from hal0_reconciler import errors
from hal0_reconciler.slots import _tomlscan

__all__ = ["EditResult", "set_device"]


@dataclass(frozen=True)
class EditResult:
    """The rewritten document, and whether it kept every byte but the device label."""

    text: str
    byte_minimal: bool  # False: re-serialised with tomli_w; comments and layout are gone
    note: str | None = None  # why the byte-minimal rewrite was not possible
    # what ``text`` parses to (checked by the re-parse): derived from ``text``, not compared
    data: dict[str, Any] | None = field(default=None, compare=False)


def set_device(
    text: str, *, table: tuple[str, ...], new: str, parsed: Mapping[str, Any] | None = None
) -> EditResult:
    """Set `device = new` in `table` (`()` is the root) and drop `backend` from that table.

    Text that already says so is returned unchanged. Raises EditRefused when the text is not
    TOML, the table does not exist, or no rewrite can be verified. Pure: a dry run calls it to
    learn beforehand whether the write would be byte-minimal (and why not). ``parsed``: the
    caller's ``tomllib.loads(text)`` of exactly this text (copied, not changed), so the text is
    not parsed once more.
    """
    # ours to change into the intended document
    expected = _load(text) if parsed is None else copy.deepcopy(dict(parsed))
    target = _table(expected, table)
    if target.get("device") == new and "backend" not in target:
        return EditResult(text, byte_minimal=True, data=expected)
    target["device"] = new
    had_backend = target.pop("backend", None) is not None
    plain = None if had_backend else _rewrite_plain(text, new)
    if plain is not None and _parses_to(plain, expected):
        return EditResult(plain, byte_minimal=True, data=expected)
    try:
        candidate = _rewrite(text, table, new)
    except _tomlscan.CannotEdit as exc:
        note = str(exc)
    else:
        if _parses_to(candidate, expected):
            return EditResult(candidate, byte_minimal=True, data=expected)
        note = "the byte-minimal rewrite did not re-parse to the intended document"
    return EditResult(_dump(expected, note), byte_minimal=False, note=note, data=expected)


def set_device_in(
    text: str,
    *,
    tables: tuple[tuple[str, ...], ...],
    new: str,
    parsed: Mapping[str, Any] | None = None,
) -> EditResult:
    """:func:`set_device` in each of ``tables`` (in order), as one result: byte-minimal only
    when every step is."""
    result: EditResult | None = None
    for table in tables:
        step = set_device(
            text if result is None else result.text,
            table=table,
            new=new,
            parsed=parsed if result is None else result.data,
        )
        if result is not None and not (result.byte_minimal and step.byte_minimal):
            note = result.note or step.note
            step = EditResult(step.text, byte_minimal=False, note=note, data=step.data)
        result = step
    if result is None:
        raise errors.EditRefused("no table to write the device into")
    return result


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
    """Equality of parsed TOML that also tells 1 from 1.0 from true, and nan from nan.

    A loop over a stack, not recursion: any nesting that tomllib parsed can be compared.
    """
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if x.keys() != y.keys():
                return False
            pending.extend((x[key], y[key]) for key in x)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif (repr(x) != repr(y)) if isinstance(x, float) else (x != y):
            return False
    return True


def _parses_to(text: str, expected: dict[str, Any]) -> bool:
    try:
        return _same(tomllib.loads(text), expected)
    except (tomllib.TOMLDecodeError, RecursionError):
        return False


def _dump(expected: dict[str, Any], note: str) -> str:
    try:
        text = tomli_w.dumps(expected)
    except (TypeError, ValueError, RecursionError) as exc:
        raise errors.EditRefused(f"{note}, and tomli_w cannot write the document: {exc}") from exc
    if not _parses_to(text, expected):
        raise errors.EditRefused(f"{note}, and tomli_w's rewrite does not re-parse identically")
    return text


# --- the byte-minimal rewrite ---------------------------------------------------------------


_DEVICE_LINE = re.compile(
    r"""^[ \t]*device[ \t]*=[ \t]*("[^"\\\r\n]*"|'[^'\r\n]*')[ \t]*(?:\#[^\r\n]*)?\r?$""",
    re.MULTILINE,
)


def _rewrite_plain(text: str, new: str) -> str | None:
    """The common shape without the scanner: the one line ``device = "..."`` (a bare key, a
    plain one-line string, a comment or nothing after it) gets its value replaced, as the
    scanner would. None when there is not exactly one such line. Whether it was the target
    table's ``device`` (and not, say, a line inside a multi-line string) is for the re-parse to
    say: any other line changes some other value, and the caller falls back to the scanner."""
    found = _DEVICE_LINE.finditer(text)
    match = next(found, None)
    if match is None or next(found, None) is not None:
        return None
    start, end = match.span(1)
    return text[:start] + _replacement(match.group(1), new) + text[end:]


def _rewrite(text: str, table: tuple[str, ...], new: str) -> str:
    found = _tomlscan.scan(text)
    for key in ("device", "backend"):
        if _defined_apart(found, (*table, key)):
            raise _tomlscan.CannotEdit(
                f"{key} is a table of its own (a header or dotted sub-keys), not one value"
            )
    mine = [entry for entry in found.entries if entry.table == table]
    device = next((entry for entry in mine if entry.key == "device"), None)
    backend = next((entry for entry in mine if entry.key == "backend"), None)
    edits: list[tuple[int, int, str]] = []
    if device is not None:
        old_value = text[device.value_start : device.value_end]
        edits.append((device.value_start, device.value_end, _replacement(old_value, new)))
        if backend is not None:
            edits.append(_removal(text, found, backend))
    elif backend is not None:
        old_value = text[backend.value_start : backend.value_end]
        edits.append((backend.key_start, backend.key_end, "device"))
        edits.append((backend.value_start, backend.value_end, _replacement(old_value, new)))
    else:
        edits.append(_insertion(text, found, table, new))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _defined_apart(found: _tomlscan.Scan, path: tuple[str, ...]) -> bool:
    """Whether `path` is a table made by a header or by dotted keys (not one value to replace)."""
    depth = len(path)
    return any(header.path[:depth] == path for header in found.headers) or any(
        entry.table[:depth] == path and len(entry.base) < depth for entry in found.entries
    )


def _removal(text: str, found: _tomlscan.Scan, entry: _tomlscan.Entry) -> tuple[int, int, str]:
    """Delete a pair: its lines, or inside an inline table the pair and one comma beside it."""
    if entry.inline is None:
        return _line_removal(text, entry)
    siblings = sorted(
        (other for other in found.entries if other.inline == entry.inline),
        key=lambda other: other.stmt_start,
    )
    at = siblings.index(entry)
    if at + 1 < len(siblings):  # `backend = "x", ` up to the next pair
        return (entry.stmt_start, siblings[at + 1].stmt_start, "")
    # the last pair (`device` is in the same inline table, before it): from the end of the pair
    # before it, the comma included
    return (siblings[at - 1].value_end, entry.value_end, "")


def _line_removal(text: str, entry: _tomlscan.Entry) -> tuple[int, int, str]:
    """Delete the statement's lines with their line ending; at an unterminated end of the
    document, delete the line ending before them instead, so the document still ends unterminated.
    """
    if entry.line_end == len(text) and not text.endswith("\n") and entry.line_start > 0:
        before = 2 if text.startswith("\r\n", entry.line_start - 2) else 1
        return (entry.line_start - before, entry.line_end, "")
    return (entry.line_start, entry.line_end, "")


def _insertion(
    text: str, found: _tomlscan.Scan, table: tuple[str, ...], new: str
) -> tuple[int, int, str]:
    """Where and what to insert when the table has neither `device` nor `backend`."""
    eol = "\r\n" if "\r\n" in text else "\n"
    pair = "device = " + _quoted(new, like='"')
    own = [e for e in found.entries if e.table == table and e.inline is None]
    indent = text[own[0].line_start : own[0].stmt_start] if own else ""
    if not table:
        if own:
            return _line_at(text, own[-1].line_end, indent + pair, eol)
        if found.headers:
            at = found.headers[0].line_start
            return (at, at, pair + eol)
        return _line_at(text, len(text), pair, eol)
    header = next((h for h in found.headers if h.path == table and not h.array), None)
    if header is not None:
        return _line_at(text, header.line_end, indent + pair, eol)
    inline = next((t for t in found.inlines if t.path == table), None)
    if inline is not None:
        pairs = [e for e in found.entries if e.inline == inline.start]
        if pairs:
            after = max(e.value_end for e in pairs)
            return (after, after, ", " + pair)
        inner = text[inline.start + 1 : inline.end]
        return (inline.end, inline.end, pair + inner)
    dotted = [
        e for e in found.entries if e.table[: len(table)] == table and len(e.base) < len(table)
    ]
    if dotted:  # `slot.name = ...`: one more dotted key beside the last one
        last = max(dotted, key=lambda e: e.stmt_start)
        prefix = text[last.stmt_start : last.key_spans[len(table) - len(last.base)][0]]
        if last.inline is not None:
            return (last.value_end, last.value_end, ", " + prefix + pair)
        line = text[last.line_start : last.stmt_start] + prefix + pair
        return _line_at(text, last.line_end, line, eol)
    sub = next((h for h in found.headers if h.path[: len(table)] == table), None)
    if sub is not None:  # only `[slot.sub]` made it: give it a header before that one
        at = sub.line_start
        return (at, at, f"[{_key_text(table)}]{eol}{pair}{eol}")
    raise _tomlscan.CannotEdit(f"found no place to write device in [{_dotted(table)}]")


def _line_at(text: str, at: int, line: str, eol: str) -> tuple[int, int, str]:
    """Insert a line at a line start, or at the unterminated end of the document."""
    if at == len(text) and text and not text.endswith("\n"):
        return (at, at, eol + line)
    return (at, at, line + eol)


def _key_text(path: tuple[str, ...]) -> str:
    return ".".join(part if _BARE.fullmatch(part) else _quoted(part, like='"') for part in path)


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
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _replacement(old: str, new: str) -> str:
    """`new` written in the style of the value it replaces (`old`, as written).

    A multi-line string stays multi-line, keeping the line break TOML trims after its opening
    delimiter; a literal string stays literal when `new` can be written as one; any other value
    (a basic string, or not a string at all) becomes a basic string.
    """
    if not old.startswith(('"""', "'''")):
        return _quoted(new, like=old)
    trimmed = next((eol for eol in ("\r\n", "\n") if old.startswith(eol, 3)), "")
    if old.startswith("'''") and _LITERAL_SAFE.fullmatch(new):
        return f"'''{trimmed}{new}'''"
    return f'"""{trimmed}{_escaped(new)}"""'


def _quoted(value: str, *, like: str) -> str:
    """`value` as a single-line TOML string, in the quote style of `like` when it fits."""
    if like.startswith("'") and not like.startswith("'''") and _LITERAL_SAFE.fullmatch(value):
        return f"'{value}'"
    return f'"{_escaped(value)}"'


def _escaped(value: str) -> str:
    """`value` with every character a basic string cannot hold as written escaped."""
    return "".join(
        _ESCAPES.get(char) or (f"\\u{ord(char):04x}" if char < " " or char == "\x7f" else char)
        for char in value
    )
