"""Bounds on the work one TOML file may cost, checked before the parser runs.  [pure]

A slot file is written by whoever can write to the slots folder, so the parser must never see
input that makes it (or the editor after it) slow, deeply recursive or huge. Real slot files are
a few KB, a handful of tables deep, with short keys. ``check_text`` scans the text once with a
regular-expression tokenizer that knows just enough TOML (strings, comments, brackets, keys,
headers) and raises :class:`~hal0_reconciler.errors.OverLimit` naming the limit and its value:

- ``max_bytes``: the file's size (a setting, ``slot_max_bytes``);
- ``max_depth``: how deep tables and arrays nest (a table header or dotted key counts each
  part); Python's parser and ``copy.deepcopy`` recurse once per level;
- ``max_key_length``: the length of one key or table header, quotes and dots included;
- ``max_digits``: the length of one bare number (Python refuses integers of more than 4,300
  digits with a ValueError, and converting long ones costs quadratic time);
- ``max_items``: keys, table headers and array elements in the whole file (the parser spends
  about 10 microseconds on each, and the editor parses a file up to three times).

Within these bounds a file costs a fixed, small budget (see the README's reliability section
for the measured worst case). ``check_depth`` re-checks the parsed data, iteratively, so a
mismatch between this scanner and the parser can never let a deeper document through.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hal0_reconciler.errors import OverLimit

__all__ = ["DEFAULT", "Limits", "check_depth", "check_size", "check_text"]


@dataclass(frozen=True)
class Limits:
    """The most a slot file may hold before it is reported instead of parsed."""

    max_bytes: int = 16384
    max_depth: int = 32
    max_key_length: int = 256
    max_digits: int = 64
    max_items: int = 1000


DEFAULT = Limits()


@functools.cache
def _token() -> re.Pattern[str]:
    """The tokenizer's pattern, compiled at its first use: most processes never tokenize
    (a plain slot file is proved within the limits by counting characters)."""
    return re.compile(
        r'''
          (?P<string>
              """(?:[^"\\]|\\.|"(?!""))*(?:"{3,5}|\Z)      # multi-line basic string
            | \'\'\'(?:[^']|'(?!''))*(?:'{3,5}|\Z)          # multi-line literal string
            | "(?:[^"\\\n]|\\[^\n])*(?:"|(?=\n)|\Z)         # basic string (ends at the line)
            | '[^'\n]*(?:'|(?=\n)|\Z)                       # literal string
          )
        | (?P<comment>\#[^\n]*)
        | (?P<newline>\n)
        | (?P<punct>[\[\]{}=,.])
        | (?P<digits>[0-9_]+)
        | (?P<space>[ \t\r]+)
        | (?P<other>[^\s"'\#\[\]{}=,.0-9_]+)
        | (?P<stray>.)
        ''',
        re.VERBOSE | re.DOTALL,
    )


def check_size(size: int, limits: Limits = DEFAULT) -> None:
    """Raise OverLimit when a file of ``size`` bytes is larger than the size limit."""
    if size > limits.max_bytes:
        raise OverLimit(f"over the size limit: {size} bytes > {limits.max_bytes} bytes")


def check_text(text: str, limits: Limits = DEFAULT) -> None:
    """Raise OverLimit when ``text`` breaks a limit; linear in its length, never recursive."""
    check_size(len(text.encode("utf-8", "surrogatepass")), limits)
    if not _within_by_counts(text, limits):  # the tokenizer, when counts cannot tell
        _Scan(limits).run(text)


def _within_by_counts(text: str, limits: Limits) -> bool:
    """True when counting characters proves that no token of ``text`` breaks a limit, so the
    tokenizer (~50 us for a real slot file) need not run; False says nothing. For any text:

    - each item the tokenizer counts is one ``=``, ``]`` or ``,`` character;
    - each level of depth past a key's first part is one ``.``, ``[`` or ``{`` character (a
      header's first part comes with its ``[``);
    - a number is a run of digits and underscores;
    - without ``{`` (so no inline table: keys are only read at the start of a line) and without
      a multi-line string, a key or a table header lies within one line.
    """
    if "{" in text or '"""' in text or "'''" in text:
        return False
    items = text.count("=") + text.count("]") + text.count(",")
    if items > limits.max_items or 1 + text.count(".") + text.count("[") > limits.max_depth:
        return False
    if max(map(len, text.split("\n"))) > limits.max_key_length:
        return False
    return _long_number(limits.max_digits).search(text) is None


@functools.cache
def _long_number(max_digits: int) -> re.Pattern[str]:
    return re.compile(f"[0-9_]{{{max_digits + 1}}}")


def check_depth(data: Mapping[str, Any], limits: Limits = DEFAULT) -> None:
    """Raise OverLimit when parsed data nests deeper than ``max_depth`` (iteratively)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limits.max_depth:
            raise _too_deep(depth, limits)
        stack.extend((child, depth + 1) for child in children)


def _too_deep(depth: int, limits: Limits) -> OverLimit:
    return OverLimit(f"over the nesting limit: deeper than {limits.max_depth} levels ({depth}+)")


_KEY, _VALUE, _HEADER, _REST = range(4)  # what the scanner expects next


class _Scan:
    """One pass over the tokens, tracking keys, headers and the open arrays / inline tables."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.mode = _KEY
        self.table_depth = 0  # depth of the table the last header opened
        self.base = 0  # depth of the table the current key lives in
        self.key_length = 0
        self.parts = 1
        self.value_depth = 0
        self.stack: list[tuple[bool, int]] = []  # (is_array, depth of that value)
        self.header_offset = 0  # 1 in an [[array.of.tables]] header: one level more
        self.items = 0

    def run(self, text: str) -> None:
        for match in _token().finditer(text):
            kind = match.lastgroup
            if kind in ("space", "comment"):
                continue
            lexeme = match.group()
            if kind == "newline":
                if not self.stack:
                    self._start_key(self.table_depth)
                continue
            if self.mode == _KEY:
                self._in_key(kind, lexeme)
            elif self.mode == _HEADER:
                self._in_header(kind, lexeme)
            elif self.mode == _VALUE:
                self._in_value(kind, lexeme)

    def _start_key(self, base: int) -> None:
        self.mode, self.base, self.key_length, self.parts = _KEY, base, 0, 1

    def _grow_key(self, lexeme: str, what: str) -> None:
        self.key_length += len(lexeme)
        if lexeme == ".":
            self.parts += 1
        if self.key_length > self.limits.max_key_length:
            raise OverLimit(
                f"over the key length limit: a {what} longer than "
                f"{self.limits.max_key_length} characters"
            )
        self._depth(self.base + self.parts)

    def _count_item(self) -> None:
        self.items += 1
        if self.items > self.limits.max_items:
            raise OverLimit(
                f"over the item limit: more than {self.limits.max_items} keys, tables and "
                "array elements"
            )

    def _depth(self, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise _too_deep(depth, self.limits)

    def _in_key(self, kind: str | None, lexeme: str) -> None:
        if lexeme == "[" and not self.stack and self.key_length == 0:
            self.mode, self.base, self.key_length, self.parts = _HEADER, 0, 0, 1
        elif lexeme == "=":
            self._count_item()
            self.mode = _VALUE
            self.value_depth = self.base + self.parts
        elif lexeme == "}":
            self._close(is_array=False)
        elif kind in ("string", "other", "digits") or lexeme == ".":
            self._grow_key(lexeme, "key")

    def _in_header(self, kind: str | None, lexeme: str) -> None:
        if lexeme == "[" and self.key_length == 0:
            self.header_offset = 1
            return
        if lexeme == "]":
            self._count_item()
            self.table_depth = self.parts + self.header_offset
            self.header_offset = 0
            self._depth(self.table_depth)
            self.mode = _REST
        elif kind in ("string", "other", "digits") or lexeme == ".":
            self._grow_key(lexeme, "table header")

    def _in_value(self, kind: str | None, lexeme: str) -> None:
        if lexeme == "[":
            self.stack.append((True, self.value_depth))
            self.value_depth += 1
            self._depth(self.value_depth)
        elif lexeme == "{":
            self.stack.append((False, self.value_depth))
            self._start_key(self.value_depth)
        elif lexeme == "]":
            self._close(is_array=True)
        elif lexeme == "}":
            self._close(is_array=False)
        elif lexeme == ",":
            if self.stack and not self.stack[-1][0]:
                self._start_key(self.stack[-1][1])
            elif self.stack:
                self._count_item()
                self.value_depth = self.stack[-1][1] + 1
        elif kind == "digits":
            digits = len(lexeme.replace("_", ""))
            if digits > self.limits.max_digits:
                raise OverLimit(
                    f"over the number length limit: {digits} digits > {self.limits.max_digits}"
                )

    def _close(self, *, is_array: bool) -> None:
        if self.stack and self.stack[-1][0] == is_array:
            _, self.value_depth = self.stack.pop()
            self.mode = _VALUE
