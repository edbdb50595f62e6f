"""Fixtures of the tests against hal0's real releases, and the figures printed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import parity_releases
import pytest


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Each release's wheel unpacked once per run (trees hard-link their code from it)."""
    return tmp_path_factory.mktemp("hal0-wheels")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if parity_releases.FIGURES:
        terminalreporter.section("parity with hal0's releases")
        for line in parity_releases.FIGURES:
            terminalreporter.write_line(line)
