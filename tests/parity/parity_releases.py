"""The release list and the figures the tests against hal0's real releases share."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import hal0_install, hal0_releases

RELEASES = hal0_releases.releases()
# the ``installed_hal0`` fixture: (release, case) -> the root of a tree holding that release
InstallHal0 = Callable[[hal0_releases.Release, hal0_install.InstallCase], Path]
FIGURES: list[str] = []  # one line per release and lane, printed at the end of the run


def release_ids() -> list[str]:
    return [r.version for r in RELEASES]


def require(release: hal0_releases.Release, *, fail_in_ci: bool) -> Path:
    """The release's venv python; without it the test skips with the reason (fails instead
    with CI=true when ``fail_in_ci``: a parity test that could not run has not passed)."""
    try:
        return hal0_releases.ensure_venv(release)
    except hal0_releases.ReleaseUnavailableError as exc:
        if fail_in_ci and os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and hal0 {release.version} is unavailable: {exc}")
        pytest.skip(str(exc))
