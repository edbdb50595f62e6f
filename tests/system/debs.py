"""The packages the system suite installs besides the current one: an old release built from
its recorded commit (cached under ``HAL0_TEST_CACHE``, ``old-debs/<commit>/``), and this tree
rebuilt as a version apt sees as newer."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import rootfs
from helpers.hosts import REPO

RELEASES = {"0.1.0": "12f8b41", "0.2.0": "6aef203"}  # the recorded commits of each release
BUILD_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEB_BUILD_OPTIONS": "nocheck"}


def build(tree: Path, out: Path) -> Path:
    """``packaging/build-deb`` of ``tree``, run from inside it (0.1.0's builds the current
    folder's sdist), unit tests skipped (they ran when the release was made)."""
    done = subprocess.run(
        [str(tree / "packaging/build-deb"), str(out)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=BUILD_ENV,
    )
    assert 0 == done.returncode, f"build-deb of {tree} failed:\n{done.stdout}\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


def old_deb(version: str) -> Path:
    """The package of ``version`` built from its recorded commit (``git archive``), cached by
    commit: an interrupted build never becomes the cache (built aside, renamed when done)."""
    commit = RELEASES[version]
    cached = rootfs.CACHE / "old-debs" / commit / f"hal0-reconciler_{version}_all.deb"
    if cached.is_file():
        return cached
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
        timeout=30,
    )
    if known.returncode != 0:
        pytest.skip(f"no git history with {commit} here (a source tree without .git)")
    with tempfile.TemporaryDirectory(prefix=f"hal0-reconciler-{version}-") as work:
        tree = Path(work) / "src"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit],
            capture_output=True,
            check=True,
            timeout=120,
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        built = build(tree, Path(work) / "out")
        assert built.name == cached.name
        cached.parent.mkdir(parents=True, exist_ok=True)
        aside = cached.with_suffix(".partial")
        shutil.copy2(built, aside)
        aside.rename(cached)
    return cached


def rebuilt_newer(tree_root: Path, out: Path, *, above: str = "") -> Path:
    """This tree's package as a version apt sees as an upgrade: its own version when that is
    above ``above``, else ``<version>+upgrade1`` (version and Debian changelog only; a
    local version to Python, newer to dpkg); built from a copy (build-deb builds the tree it
    is in, wherever it is called from)."""
    tree = tree_root / "src"
    shutil.copytree(
        REPO,
        tree,
        ignore=shutil.ignore_patterns(".git", ".venv", "dist", "__pycache__", "*.pyc"),
        symlinks=True,
    )
    init = tree / "src/hal0_reconciler/__init__.py"
    current = re.search(r'__version__ = "([^"]*)"', init.read_text())
    assert current is not None
    newer = subprocess.run(
        ["dpkg", "--compare-versions", current[1], "gt", above or current[1]],
        check=False,
        timeout=30,
    )
    if newer.returncode != 0:
        version = f"{current[1]}+upgrade1"
        init.write_text(init.read_text().replace(current[0], f'__version__ = "{version}"'))
        changelog = tree / "packaging/debian/changelog"
        entry = (
            f"hal0-reconciler ({version}) unstable; urgency=medium\n\n"
            "  * Rebuilt for the upgrade test.\n\n"
            " -- hal0-reconciler authors <hal0-reconciler@users.noreply.github.com>  "
            "Wed, 02 Dec 2026 08:00:00 +0000\n\n"
        )
        changelog.write_text(entry + changelog.read_text())
    return build(tree, out)
