"""CSV bytes → the kernel rows a build for the live target compiles into modules.        [pure]

Robust against the dirt real tables carry: a UTF-8 BOM, UTF-16, ragged rows, fields longer than
the csv module's limit, no final newline, header-only files. What cannot be read raises
``TableUnreadable`` with the reason; what could be read despite dirt is noted in ``quirks``.
"""

from __future__ import annotations

import csv
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.errors import ReconcilerError

CSV_FIELD_LIMIT = 131072
"""The csv module's default field size limit; longer fields are noted, not fatal."""

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_AFTER_LINE_BREAK = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


class TableUnreadable(ReconcilerError):
    """A tuned table cannot be read at all (the message is the reason)."""


@dataclass(frozen=True, order=True)
class Target:
    """A build target: what aiter's code generator compiles rows for."""

    gfx: str
    cu_num: int

    def __str__(self) -> str:
        return f"{self.gfx}:{self.cu_num}"


@dataclass(frozen=True)
class KernelRow:
    """One kernel name (or id, for id-keyed modules) a table references, on one line
    (1-based, header = line 1), and the target of its row (None: the column is absent)."""

    name: str
    line: int
    module: str
    gfx: str | None = None
    cu_num: int | None = None

    def on(self, targets: frozenset[Target]) -> bool:
        """Whether this row is for one of ``targets``."""
        return any(
            (self.gfx is None or t.gfx == self.gfx)
            and (self.cu_num is None or t.cu_num == self.cu_num)
            for t in targets
        )


@dataclass(frozen=True)
class BrokenRow:
    """A row that routes to a module but that no rebuild can make work."""

    line: int
    module: str
    reason: str


@dataclass(frozen=True)
class Shape:
    """One on-target row's duplicate-merge key and its ``us`` (inf when absent)."""

    line: int
    key: tuple[str, ...]
    us: float


@dataclass(frozen=True)
class Table:
    """The rows of one table kept for the targets, with what was dropped and why."""

    rows: tuple[KernelRow, ...]
    digest: str  # sha256 of the file's bytes
    data_rows: int
    other_target_rows: int
    uncompiled_rows: int  # libtype not compiled into a module (asm, triton...), `_ZN`, or empty
    quirks: tuple[str, ...] = ()
    broken: tuple[BrokenRow, ...] = ()
    shapes: tuple[Shape, ...] = ()  # filled when key columns are given (duplicate merge)


def parse_table(
    data: bytes,
    *,
    route: routing.TableRoute,
    targets: frozenset[Target],
    key_columns: tuple[str, ...] = (),
) -> Table:
    """Kernel rows of ``data`` for ``targets`` that compile into one of ``route``'s modules.

    With ``key_columns`` (aiter's duplicate-merge keys), each on-target row's key and ``us``.
    """
    quirks: list[str] = []
    text = _decode(data, quirks)
    if not text.strip():
        raise TableUnreadable("empty file")
    if not text.endswith(("\n", "\r")):
        quirks.append("no final newline (the file may still be being written)")
    records = _records(text, quirks)
    header = [h.strip() for h in records[0][1]]
    index = {name: i for i, name in reversed(list(enumerate(header)))}
    name_cols = [index[c] for c in route.columns if c in index]
    if not name_cols and route.keyed is not routing.Keyed.ID:  # no id: each opus row is broken
        wanted = " or ".join(route.columns)
        raise TableUnreadable(  # never the header's bytes: the file may be anything
            f"no {wanted} column in its first line ({len(header)} comma-separated fields, "
            "none of them so named): not an aiter table"
        )
    lib_col = index.get("libtype")
    gfx_col = index.get("gfx")
    cu_col = index.get("cu_num")
    key_cols = [index.get(c) for c in key_columns]
    us_col = index.get("us")
    gfxs = {t.gfx for t in targets}
    rows: list[KernelRow] = []
    broken: list[BrokenRow] = []
    shapes: list[Shape] = []
    whole_rows: set[tuple[str, ...]] = set()
    ragged: list[int] = []
    data_rows = other = uncompiled = 0
    for line, fields in records[1:]:
        if not any(f.strip() for f in fields):
            continue
        data_rows += 1
        if len(fields) != len(header):
            ragged.append(line)
        gfx = _field(fields, gfx_col).lower()
        cu = _field(fields, cu_col)
        if (gfx_col is not None and gfx not in gfxs) or (
            cu_col is not None and not _on_target(gfx if gfx_col is not None else None, cu, targets)
        ):
            other += 1
            continue
        where = {
            "gfx": gfx if gfx_col is not None else None,
            "cu_num": int(cu) if cu_col is not None else None,
        }
        if key_columns and tuple(fields) not in whole_rows:
            # an identical row is dropped by aiter's lookup (drop_duplicates()) before it
            # needs unique shapes: only rows that differ can collide
            whole_rows.add(tuple(fields))
            shapes.append(
                Shape(line, tuple(_norm(_field(fields, c)) for c in key_cols), _us(fields, us_col))
            )
        libtype = _field(fields, lib_col) if lib_col is not None else None
        reader = _id_row if route.keyed is routing.Keyed.ID else _name_row
        found, bad = reader(route, libtype, [_cell(fields, c) for c in name_cols], line, where)
        rows.extend(found)
        broken.extend(bad)
        if not (found or bad):
            uncompiled += 1
    if ragged:
        shown = ", ".join(str(n) for n in ragged[:5]) + (" ..." if len(ragged) > 5 else "")
        quirks.append(f"{len(ragged)} ragged row(s) at line {shown} (read by position)")
    return Table(
        tuple(rows),
        hashlib.sha256(data).hexdigest(),
        data_rows,
        other,
        uncompiled,
        tuple(quirks),
        tuple(broken),
        tuple(shapes),
    )


_Found = tuple[list[KernelRow], list[BrokenRow]]


def _name_row(
    route: routing.TableRoute,
    libtype: str | None,
    names: list[str],
    line: int,
    where: dict[str, Any],
) -> _Found:
    """Name-keyed and shape-keyed tables: each name, as pandas reads the cell, goes to its
    module. In a row that compiles into a name-keyed module, a cell pandas reads as NaN (empty,
    ``NA``, ``null``...) is broken (aiter turns it into 'nan'), and so is a name with outer
    whitespace (pandas keeps it; the code generator finds no such kernel and raises)."""
    rows: list[KernelRow] = []
    broken: list[BrokenRow] = []
    for name in names:
        module = route.module_for(libtype, name.strip())
        if module is None:
            continue
        if route.keyed is not routing.Keyed.NAME:
            if name.strip() and name not in NA_VALUES:
                rows.append(KernelRow(name.strip(), line, module, **where))
        elif name in NA_VALUES:
            broken.append(BrokenRow(line, module, EMPTY_NAME if not name else na_name(name)))
        elif name != name.strip():
            broken.append(BrokenRow(line, module, spaced_name(name)))
        else:
            rows.append(KernelRow(name, line, module, **where))
    return rows, broken


def _id_row(
    route: routing.TableRoute,
    libtype: str | None,
    ids: list[str],
    line: int,
    where: dict[str, Any],
) -> _Found:
    """Id-keyed modules: the first id column with a value (aiter: solidx, then kernelId)."""
    module = route.modules.get((libtype or "").strip())
    if module is None:
        return [], []
    value = next((v for v in ids if v), "")
    try:
        kid = float(value)
        ok = kid.is_integer()
    except (ValueError, OverflowError):
        ok = False
    if not ok:
        return [], [BrokenRow(line, module, f"kernel id {value!r} is not an integer")]
    return [KernelRow(str(int(kid)), line, module, **where)], []


EMPTY_NAME = (
    "empty kernelName: aiter reads it as 'nan', and both its code generator and the registry "
    "lookup fail on it; no rebuild fixes it (fill in the kernel or delete the row)"
)


NA_VALUES = frozenset(
    {
        "",
        "#N/A",
        "#N/A N/A",
        "#NA",
        "-1.#IND",
        "-1.#QNAN",
        "-NaN",
        "-nan",
        "1.#IND",
        "1.#QNAN",
        "<NA>",
        "N/A",
        "NA",
        "NULL",
        "NaN",
        "None",
        "n/a",
        "nan",
        "null",
    }
)
"""pandas' default ``na_values`` (the same in pandas 2.x and 3.x): such a cell reads as NaN."""


def na_name(cell: str) -> str:
    return (
        f"kernelName {cell!r}: pandas reads it as NaN, aiter as 'nan', and both its code "
        "generator and the registry lookup fail on it; no rebuild fixes it (fill in the "
        "kernel or delete the row)"
    )


def spaced_name(cell: str) -> str:
    return (
        f"kernelName {cell!r} has outer whitespace: pandas keeps it, so aiter's code generator "
        "finds no such kernel and raises (and the lookup would miss); no rebuild fixes it "
        "(remove the whitespace)"
    )


def _norm(value: str) -> str:
    """A key cell as pandas compares it: numbers by value (``1`` == ``1.0``)."""
    try:
        number = float(value)
    except ValueError:
        return value
    return repr(number) if number == number else value  # noqa: PLR0124 - NaN stays text


def _us(fields: list[str], col: int | None) -> float:
    try:
        us = float(_field(fields, col))
    except ValueError:
        return float("inf")
    return us if us == us else float("inf")  # noqa: PLR0124 - NaN sorts last, as in pandas


def _on_target(gfx: str | None, cu: str, targets: frozenset[Target]) -> bool:
    try:
        cu_num = int(cu)
    except ValueError:
        return False
    return any(t.cu_num == cu_num and (gfx is None or t.gfx == gfx) for t in targets)


def _cell(fields: list[str], col: int | None) -> str:
    """A cell exactly as pandas reads it (no strip; a missing cell of a short row is NaN)."""
    if col is None or col >= len(fields):
        return ""
    return fields[col]


def _field(fields: list[str], col: int | None) -> str:
    if col is None or col >= len(fields):
        return ""
    return fields[col].strip()


def _decode(data: bytes, quirks: list[str]) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise TableUnreadable(f"UTF-16 byte order mark but not UTF-16: {exc.reason}") from None
        quirks.append("UTF-16 encoded (pandas in aiter may not read it)")
        return text
    if data.startswith(b"\xef\xbb\xbf"):
        quirks.append("UTF-8 byte order mark")
    if b"\x00" in data:
        raise TableUnreadable("binary data (NUL bytes) in a CSV file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TableUnreadable(f"not UTF-8 at line {line}: {exc.reason}") from None


def _records(text: str, quirks: list[str]) -> list[tuple[int, list[str]]]:
    """(line number, fields) pairs. Quote-free text (every real aiter table) splits on commas,
    which has no field size limit; quoted text goes through the csv module."""
    if '"' not in text:
        lines = _LINE_BREAK.split(text)
        if lines and lines[-1] == "":
            lines.pop()
        records = [(n, line.split(",")) for n, line in enumerate(lines, start=1)]
        longest = max((len(f), n) for n, fields in records for f in fields)
        if longest[0] > CSV_FIELD_LIMIT:
            quirks.append(
                f"field of {longest[0]} characters at line {longest[1]} "
                f"(over the csv module's {CSV_FIELD_LIMIT} limit)"
            )
        return records
    reader = csv.reader(_AFTER_LINE_BREAK.split(text), strict=False)
    records = []
    try:
        for fields in reader:
            records.append((reader.line_num, fields))
    except csv.Error as exc:
        raise TableUnreadable(f"CSV error at line {reader.line_num}: {exc}") from None
    if not records:
        raise TableUnreadable("no header row")
    return records
