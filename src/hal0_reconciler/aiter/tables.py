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

from hal0_reconciler.aiter import routing
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
    """One kernel name a table references, on one (1-based, header = line 1) line."""

    name: str
    line: int
    module: str


@dataclass(frozen=True)
class Table:
    """The rows of one table kept for a target, with what was dropped and why."""

    rows: tuple[KernelRow, ...]
    digest: str  # sha256 of the file's bytes
    data_rows: int
    other_target_rows: int
    uncompiled_rows: int  # libtype not compiled into a module (asm, triton...), `_ZN`, or empty
    quirks: tuple[str, ...] = ()


def parse_table(data: bytes, *, route: routing.TableRoute, targets: frozenset[Target]) -> Table:
    """Kernel rows of ``data`` for ``targets`` that compile into one of ``route``'s modules."""
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
    if not name_cols:
        wanted = " or ".join(route.columns)
        raise TableUnreadable(f"no {wanted} column (header: {','.join(header)[:200]})")
    lib_col = index.get("libtype")
    gfx_col = index.get("gfx")
    cu_col = index.get("cu_num")
    gfxs = {t.gfx for t in targets}
    rows: list[KernelRow] = []
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
        libtype = _field(fields, lib_col) if lib_col is not None else None
        kept = False
        for col in name_cols:
            name = _field(fields, col)
            if not name:
                continue
            module = route.module_for(libtype, name)
            if module is not None:
                rows.append(KernelRow(name, line, module))
                kept = True
        if not kept:
            uncompiled += 1
    if ragged:
        shown = ", ".join(str(n) for n in ragged[:5]) + (" ..." if len(ragged) > 5 else "")
        quirks.append(f"{len(ragged)} ragged row(s) at line {shown} (read by position)")
    return Table(
        tuple(rows), hashlib.sha256(data).hexdigest(), data_rows, other, uncompiled, tuple(quirks)
    )


def _on_target(gfx: str | None, cu: str, targets: frozenset[Target]) -> bool:
    try:
        cu_num = int(cu)
    except ValueError:
        return False
    return any(t.cu_num == cu_num and (gfx is None or t.gfx == gfx) for t in targets)


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
