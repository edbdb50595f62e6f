"""hal0 1.4+'s downgrade restore markers: while the ``version=`` line of
``/var/lib/hal0/runner-migration.restored`` names the installed release, hal0's runner-system
conversion stands down; ``profile-centric.restored`` beside it (same rule, 1.4.0
config/migrations/profile_centric_apply.py) stands the profile-centric conversion down, the one
that sets ``device`` from a legacy ``backend``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal0_reconciler.host.hal0.sources import FactProblem, SourceError, read_text

if TYPE_CHECKING:
    from pathlib import Path


PROFILE_CENTRIC_MARKER = "profile-centric.restored"


def active(path: Path, version: str | None, problems: list[FactProblem]) -> bool:
    """Whether hal0's downgrade restore marker holds (written under the running release)."""
    try:
        text = read_text(path, missing_ok=True)
    except SourceError as exc:
        problems.append(FactProblem("restore marker", str(path), f"{exc}: judged as absent"))
        return False
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "version":
            active = version is not None and value.strip() == version.strip()
            if active:
                why = "holds: hal0 does not convert this install, raw values are judged"
                problems.append(FactProblem("restore marker", str(path), why))
            return active
    return False
