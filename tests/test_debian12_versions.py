"""The code runs on Debian 12's versions of its dependencies, not only on the newest."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers.hosts import REPO

PINS = REPO / "tests" / "debian12-versions.txt"
SUITES = ["tests/unit", "tests/integration", "tests/daemon", "tests/aiter"]


@pytest.mark.timeout(1500)
@pytest.mark.skipif(bool(os.environ.get("HAL0_INNER_RUN")), reason="already the Debian 12 run")
def test_suite_passes_on_debian12_versions(tmp_path: Path) -> None:
    """The behaviour suites pass with watchdog 2.2, structlog 22.3, psutil 5.9, tomli-w 1.0."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "-r",
            str(PINS),
            "pytest",
            "pytest-timeout",
            "hypothesis",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if install.returncode != 0:
        pytest.skip(
            f"could not install Debian 12's versions from the package index: {install.stderr[-500:]}"
        )
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HAL0_INNER_RUN": "1"}
    result = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1400,  # the sub-suite runs the aiter release tables too
        check=False,
        env=environment,
    )
    versions = subprocess.run(
        [python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True
    ).stdout
    assert "watchdog==2.2.1" in versions
    assert "structlog==22.3.0" in versions
    assert 0 == result.returncode, result.stdout[-4000:] + result.stderr[-2000:]


def test_pins_match_the_declared_lower_bounds() -> None:
    """pyproject's lower bounds are exactly Debian 12's versions (so nothing newer is assumed)."""
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    bounds = {d.split(">=")[0]: d.split(">=")[1] for d in deps}
    pins = dict(
        line.split("==")
        for line in PINS.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert {"watchdog", "structlog", "psutil", "tomli-w", "sdnotify"} == set(bounds) == set(pins)
    for name, pinned in pins.items():
        assert (
            pinned.startswith(bounds[name].rstrip(".0"))
            or pinned.split(".")[:2] == bounds[name].split(".")[:2]
        ), name
    assert sys.version_info >= (3, 11)
