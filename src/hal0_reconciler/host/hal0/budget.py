"""How long a restart may take: hal0's own restart budget of the installed release.

hal0's ``slot_lifecycle_timeout_s(1, 1)``: 2415 s on 1.0.0-1.2.0, 3243 s from 1.3.0 (a release
newer than every known one: the newest's). A ``restart_timeout`` setting overrides it; with no
budget to read (0.9.8, 1.0.0a2, no hal0, an unreadable ``VERSION``) 1200 s. ``VERSION`` is read
again only when it changes (by identity).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hal0_reconciler import fsio
from hal0_reconciler.host.hal0 import release
from hal0_reconciler.host.hal0.sources import SourceError, read_text

if TYPE_CHECKING:
    from pathlib import Path

    from hal0_reconciler.settings import Settings

WITHOUT_BUDGET = 1200.0
_cache: dict[str, tuple[object, float]] = {}


def restart_timeout(settings: Settings) -> float:
    """The seconds to wait for hal0's answer to one restart."""
    if settings.restart_timeout is not None:
        return settings.restart_timeout
    path = settings.hal0_release_dir / "VERSION"
    try:
        identity: object = fsio.identity_of(os.stat(path))
    except OSError:
        identity = None
    cached = _cache.get(str(path))
    if cached is not None and cached[0] == identity:
        return cached[1]
    value = budget_of(_version(path) if identity is not None else None)
    _cache[str(path)] = (identity, value)
    return value


def budget_of(version: str | None) -> float:
    """The restart budget of the release ``version`` names (1200 s: none known)."""
    base = release.base_release(version) if version else None
    if base is None:
        return WITHOUT_BUDGET
    known = release.BY_VERSION.get(base)
    if known is None and release.version_key(base) > release.version_key(release.NEWEST.version):
        known = release.NEWEST
    if known is None:
        older = [
            r
            for r in release.RELEASES
            if release.version_key(r.version) <= release.version_key(base)
        ]
        known = older[-1] if older else None
    if known is None or known.restart_budget is None:
        return WITHOUT_BUDGET
    return known.restart_budget


def _version(path: Path) -> str | None:
    try:
        return read_text(path, missing_ok=True).strip() or None
    except SourceError:
        return None
