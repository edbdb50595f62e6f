"""The on-disk form of the aiter check's caches (``tables.json``, ``needs.json``).

One JSON object ``{"version": N, "package": "<hal0-reconciler version>", "<field>": {...}}``.
Its entries are trusted only when both versions are this code's: a file of another format or
another release of the package reads as empty, like an absent one, and is replaced whole at the
next save (atomically, like every file the daemon writes). It is read back through
:mod:`hal0_reconciler.boundedread`: a FIFO, a link or a file over ``MAX_BYTES`` is not trusted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hal0_reconciler import __version__, fsio
from hal0_reconciler.boundedread import ReadRefused, read_bounded

MAX_BYTES = 256 << 20
"""The cap on a cache read back: larger (or not a regular file, or a link) reads as untrusted."""


def read(path: Path, version: int, field: str) -> tuple[dict[str, Any], bool]:
    """(entries, replace): the trusted entries (empty when there are none), and whether a file
    is there that is not trusted (unreadable, not JSON, another version) and should be
    replaced."""
    try:
        data = read_bounded(path, max_bytes=MAX_BYTES, missing_ok=True)
        if data is None:
            return {}, False
        raw = json.loads(data)
    except (ReadRefused, ValueError, RecursionError):
        return {}, True
    if (
        isinstance(raw, dict)
        and raw.get("version") == version
        and raw.get("package") == __version__
        and isinstance(raw.get(field), dict)
    ):
        return raw[field], False
    return {}, True


def write(path: Path, version: int, field: str, entries: dict[str, Any]) -> None:
    payload = {"version": version, "package": __version__, field: entries}
    fsio.write_json(path, payload, separators=(",", ":"))
