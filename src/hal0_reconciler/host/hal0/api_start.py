"""When the running hal0-api started: 1.4+ reads its manifest once per process, so a manifest
changed after that start is not what hal0-api judges by until it restarts.

hal0-api is ``<venv>/bin/hal0 serve`` (or ``python -m hal0 serve``) run from hal0's venv; the
earliest such process's start time counts. No such process: None (nothing to say).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def started_at(venv: Path) -> float | None:
    """The start time (epoch seconds) of the oldest ``hal0 serve`` of this venv, or None."""
    import psutil  # noqa: PLC0415 - only once a 1.4+ manifest is read (psutil loads subprocess)

    prefix = str(venv).rstrip("/") + "/"
    found: list[float] = []
    for process in psutil.process_iter(["cmdline", "create_time"]):
        try:
            argv = process.info.get("cmdline") or []
            created = process.info.get("create_time")
        except (psutil.Error, OSError):
            continue
        if created is None or "serve" not in argv[1:3]:
            continue
        if any(str(a).startswith(prefix) for a in argv[:2]):
            found.append(float(created))
    return min(found) if found else None
