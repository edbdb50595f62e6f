"""What a one-shot verb (``once``, ``plan``) checks before it starts."""

from __future__ import annotations

import os

from hal0_reconciler import settings
from hal0_reconciler.errors import SettingsError


def require_slots_dir(current: settings.Settings) -> None:
    """A one-shot run against a folder that is not there is a mistake, not "no changes"."""
    folder = current.slots_dir
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a directory"
        raise SettingsError(f"slots directory {folder} {what}")
    if not os.access(folder, os.R_OK | os.X_OK):
        raise SettingsError(f"slots directory {folder} cannot be read")
