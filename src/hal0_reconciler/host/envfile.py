"""hal0's shell-style environment files (``/etc/hal0/api.env``): ``KEY=VALUE`` lines.

Its own small module so that reading hal0's facts does not load the HTTP client. The file is
hal0's, not ours: it is read through :mod:`hal0_reconciler.boundedread` (a regular file only,
never a FIFO or a device, never through a final symlink, at most ``MAX_BYTES``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hal0_reconciler.boundedread import ReadRefused, read_bounded

MAX_BYTES = 1 << 20
"""The cap on an environment file (hal0's is a few hundred bytes)."""


class EnvFileRefused(ReadRefused, OSError):
    """The environment file was not read (not a regular file, a symlink, over the cap, not
    UTF-8...). An ``OSError`` too, so every caller that treats an unreadable file as "no
    values, and say so" does so for a refused one; ``strerror`` is the reason in words."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(path, reason)
        self.strerror = reason
        self.filename = str(path)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def read_env_file(path: Path) -> dict[str, str]:
    """A shell-style ``KEY=VALUE`` file (comments, ``export``, quotes); missing file → empty.

    Raises ``EnvFileRefused`` (an ``OSError``) for a file that is there but not read."""
    try:
        data = read_bounded(path, max_bytes=MAX_BYTES, missing_ok=True)
        text = "" if data is None else data.decode("utf-8")
    except ReadRefused as exc:
        raise EnvFileRefused(path, exc.reason) from None
    except UnicodeDecodeError as exc:
        raise EnvFileRefused(path, f"not UTF-8 text (byte {exc.start} is not valid)") from None
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        line = line.removeprefix("export ").strip()
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value, comments=True)
        except ValueError:
            parts = [value.strip()]
        values[key.strip()] = parts[0] if parts else ""
    return values
