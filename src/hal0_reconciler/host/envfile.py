"""hal0's shell-style environment files (``/etc/hal0/api.env``): ``KEY=VALUE`` lines.

Its own small module so that reading hal0's facts does not load the HTTP client.
"""

from __future__ import annotations

import shlex
from pathlib import Path


def read_env_file(path: Path) -> dict[str, str]:
    """A shell-style ``KEY=VALUE`` file (comments, ``export``, quotes); missing file → empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
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
