"""The layers hold: the pure core does no I/O, and the linters are clean."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hosts import REPO

SRC = REPO / "src" / "hal0_reconciler"
PURE = [
    "slots/document.py",
    "slots/runtime.py",
    "slots/policy.py",
    "slots/image.py",
    "host/hal0/pysource.py",
    "host/hal0/release.py",
    "host/hal0/pins.py",
    "host/hal0/defaults.py",
    "slots/conversion.py",
    "host/restarts/running_lane.py",
    "slots/edit.py",
    "slots/_tomlscan.py",
    "slots/limits.py",
    "model.py",
    "aiter/tables/resolve.py",
    "aiter/tables/rows.py",
    "aiter/rules/routing.py",
    "aiter/decision/plan.py",
    "aiter/decision/verdict.py",
    "aiter/rules/sets.py",
    "aiter/trees/whose.py",
    "reconcile/judge.py",
]
PURE_PATH_NAMES = {"PurePath", "PurePosixPath"}  # path arithmetic without touching the disk
IO_MODULES = {
    "os",
    "io",
    "subprocess",
    "fcntl",
    "socket",
    "shutil",
    "pathlib",
    "watchdog",
    "structlog",
    "sdnotify",
    "psutil",
    "threading",
    "time",
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "pathlib" and {a.name for a in node.names} <= PURE_PATH_NAMES:
                continue
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    """Pure decision modules import nothing that does I/O."""
    assert set() == imported_roots(SRC / module) & IO_MODULES


@pytest.mark.parametrize("module", ["daemon/workqueue.py"])
def test_workqueue_knows_nothing_of_watchdog(module: str) -> None:
    """Events become keys in watch.py; the work queue never sees watchdog."""
    path = SRC / module
    if not path.exists():
        pytest.skip(f"{module} not written yet")
    assert "watchdog" not in imported_roots(path)


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return found


@pytest.mark.timeout(120)
def test_ruff_is_clean() -> None:
    """ruff (select = ALL, each ignore with its reason) finds nothing in src/ and tests/."""
    result = subprocess.run(
        [_tool("ruff"), "check", "src", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 == result.returncode, result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_mypy_strict_is_clean() -> None:
    """mypy --strict finds nothing in src/."""
    result = subprocess.run(
        [_tool("mypy"), "--strict", "src/hal0_reconciler"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 == result.returncode, result.stdout + result.stderr


@pytest.mark.timeout(120)
def test_import_layers_are_kept() -> None:
    """import-linter's layer and forbidden contracts hold."""
    result = subprocess.run(
        [_tool("lint-imports")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert 0 == result.returncode, result.stdout + result.stderr
