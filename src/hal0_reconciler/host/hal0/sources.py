"""The one way the installed hal0's files are read, and what is said when one cannot be.

Every file is read through :mod:`hal0_reconciler.boundedread` (regular files only, never
blocking, capped: Python sources 4 MiB, ``hal0.toml`` and the manifests 1 MiB, ``VERSION`` and
the restore marker 64 KiB); a refusal is a :class:`SourceError` whose message says why in words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hal0_reconciler import boundedread

if TYPE_CHECKING:
    from pathlib import Path

MAX_SOURCE_BYTES = 4 * 1024 * 1024  # Python sources: hal0's largest is ~200 KB
MAX_CONFIG_BYTES = 1024 * 1024  # hal0.toml, the manifests
MAX_VERSION_BYTES = 64 * 1024


@dataclass(frozen=True)
class FactProblem:
    """One hal0 source that could not give its facts, and what is used instead."""

    source: str  # "hal0", "schema.py", "runners", "VERSION", "hal0.toml", "environment", ...
    path: str
    why: str
    not_understood: bool = False  # loud: nothing can be judged against it (degraded)

    def line(self) -> str:
        return f"{self.source} ({self.path}): {self.why}"


class SourceError(Exception):
    """A source file that could not be read (the message is for people)."""


def read_text(path: Path, *, cap: int = MAX_VERSION_BYTES, missing_ok: bool = False) -> str:
    """A regular file's text (through :mod:`boundedread`: never blocking, at most ``cap``
    bytes); "" for a missing one when allowed."""
    try:
        text = boundedread.read_bounded_text(path, max_bytes=cap, missing_ok=missing_ok)
    except boundedread.ReadRefused as exc:
        raise SourceError(exc.reason) from None
    return text or ""
