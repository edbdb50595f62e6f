"""Fixtures of the tests against hal0's real releases, and the figures printed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import parity_releases
import pytest

from helpers import hal0_install, hal0_releases


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Each release's wheel unpacked once per run (trees hard-link their code from it)."""
    return tmp_path_factory.mktemp("hal0-wheels")


@pytest.fixture
def installed_hal0(tmp_path: Path, wheel_cache: Path) -> parity_releases.InstallHal0:
    """``installed_hal0(release, case)``: a tree under ``tmp_path`` holding that real release
    (its wheel fetched into the test cache when missing; skips with the reason without it) as
    an install lays it out, with the case's slot files, settings and manifests."""
    count = iter(range(1_000_000))

    def install(release: hal0_releases.Release, case: hal0_install.InstallCase) -> Path:
        try:
            hal0_releases.fetch_wheel(release)
        except hal0_releases.ReleaseUnavailableError as exc:
            pytest.skip(str(exc))
        root = tmp_path / f"hal0-{release.version}-{next(count)}"
        return hal0_install.install_tree(root, release, case, wheel_cache=wheel_cache)

    return install


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if parity_releases.FIGURES:
        terminalreporter.section("parity with hal0's releases")
        for line in parity_releases.FIGURES:
            terminalreporter.write_line(line)
