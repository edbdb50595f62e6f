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
from collections.abc import Mapping
from dataclasses import dataclass
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


def set_device(
    text: str, *, table: tuple[str, ...], new: str, parsed: Mapping[str, Any] | None = None
) -> EditResult:
    """Set `device = new` in `table` (`()` is the root) and drop `backend` from that table.

    Text that already says so is returned unchanged. Raises EditRefused when the text is not
    TOML, the table does not exist, or no rewrite can be verified. ``parsed``: the caller's
    ``tomllib.loads(text)`` of exactly this text (not modified), so it is not parsed twice.
    """
    old = _load(text) if parsed is None else dict(parsed)
    expected = copy.deepcopy(old)
    target = _table(expected, table)
    target["device"] = new
    target.pop("backend", None)
    if _same(old, expected):
        return EditResult(text, byte_minimal=True)
    try:
        candidate = _rewrite(text, table, new)
    except _tomlscan.CannotEdit as exc:
        note = str(exc)
    except RecursionError:
        note = "values nested too deeply to scan"
    else:
        if _parses_to(candidate, expected):
            return EditResult(candidate, byte_minimal=True)
        note = "the byte-minimal rewrite did not re-parse to the intended document"
    return EditResult(_dump(expected, note), byte_minimal=False, note=note)


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
    headers, entries = _tomlscan.statements(text)
    mine = [entry for entry in entries if entry.table == table]
    device = next((entry for entry in mine if entry.key == "device"), None)
    backend = next((entry for entry in mine if entry.key == "backend"), None)
    edits: list[tuple[int, int, str]] = []
    if device is not None:
        old_value = text[device.value_start : device.value_end]
        if old_value.startswith(("'''", '"""')):
            raise _tomlscan.CannotEdit("device is written as a multi-line string")
        if not old_value.startswith(("'", '"')):
            raise _tomlscan.CannotEdit("device is not written as a string")
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


def _line_removal(text: str, entry: _tomlscan.Entry) -> tuple[int, int, str]:
    """Delete the statement's lines with their line ending; at an unterminated end of the
    document, delete the line ending before them instead, so the document still ends unterminated.
    """
    if entry.line_end == len(text) and not text.endswith("\n") and entry.line_start > 0:
        before = 2 if text.startswith("\r\n", entry.line_start - 2) else 1
        return (entry.line_start - before, entry.line_end, "")
    return (entry.line_start, entry.line_end, "")


def _insertion(
    text: str,
    table: tuple[str, ...],
    headers: list[_tomlscan.Header],
    mine: list[_tomlscan.Entry],
    new: str,
) -> tuple[int, int, str]:
    eol = "\r\n" if "\r\n" in text else "\n"
    indent = text[mine[0].line_start : mine[0].stmt_start] if mine else ""
    line = indent + "device = " + _quoted(new, like='"')
    if table:
        header = next((h for h in headers if h.path == table and not h.array), None)
        if header is None:
            raise _tomlscan.CannotEdit(
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
