"""The reliability suite's fixtures and its figures, printed at the end of the run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import devnodes
from helpers.daemon_host import Host
from reliability import support


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--soak", default=False):
        support.set_soak(max(1.0, float(os.environ.get("HAL0_SOAK", "1") or 1)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not support.FIGURES and not support.NOTES:
        return
    figures = {name: support.FIGURES.get(name, 0) for name in support.FIGURE_ORDER}
    figures.update(support.FIGURES)
    mode = "soak" if support.soaking() else "ci"
    terminalreporter.section(f"reliability figures ({mode})")
    terminalreporter.write_line(", ".join(f"{k}: {v}" for k, v in figures.items()))
    for key, value in sorted(support.NOTES.items()):
        terminalreporter.write_line(f"{key}: {value}")
    out = os.environ.get("HAL0_RELIABILITY_FIGURES")
    if out:
        Path(out).write_text(json.dumps({"mode": mode, **figures, **support.NOTES}, indent=1))


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    if os.geteuid() != 0:
        pytest.skip("needs root: mknod and the probe's credential switch")
    with devnodes.dev_tree() as dev:
        yield Host(tmp_path, dev)
