"""Where promtool is: ``HAL0_PROMTOOL`` (tests/run sets it), the test cache tests/run unpacks
Debian's prometheus package into (never installed), or PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CACHE = Path(os.environ.get("HAL0_TEST_CACHE", "/var/cache/hal0-reconciler-tests"))


def find() -> str | None:
    given = os.environ.get("HAL0_PROMTOOL", "")
    if given and os.access(given, os.X_OK):
        return given
    unpacked = CACHE / "prometheus/usr/bin/promtool"
    if os.access(unpacked, os.X_OK):
        return str(unpacked)
    return shutil.which("promtool")


SKIP_REASON = "promtool is absent (tests/run unpacks it from Debian's prometheus package)"
