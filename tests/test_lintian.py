"""lintian at its strictest (`-EvIL +pedantic`) on the Debian package and on its source package:
nothing but what packaging/debian's lintian-overrides justify (each with its reason).

Builds both with the project's own tools (packaging/build-deb; dpkg-source on the same sdist):
a few minutes. Skipped, saying why, without lintian or the build tools."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from helpers.hosts import REPO

pytestmark = pytest.mark.timeout(900)
CLEAN_PATH = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # Debian's python3, not a venv's


def _missing() -> str | None:
    for tool, package in (
        ("lintian", "lintian"),
        ("dpkg-buildpackage", "dpkg-dev"),
        ("dh", "debhelper"),
    ):
        if shutil.which(tool) is None:
            return f"no {tool} (Debian package {package}; tests/run installs it as root)"
    done = subprocess.run(
        ["/usr/bin/python3", "-c", "import hatchling"], capture_output=True, check=False
    )
    if done.returncode != 0:
        return "no Debian python3-hatchling (apt-get build-dep ./packaging)"
    return None


MISSING = _missing()
needs_tools = pytest.mark.skipif(MISSING is not None, reason=f"lintian: {MISSING}")


def lintian(target: Path) -> list[str]:
    """What lintian says, its notes and its root-privileges remark left out."""
    done = subprocess.run(
        ["lintian", "-EvIL", "+pedantic", str(target)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=CLEAN_PATH,
    )
    lines = (done.stdout + done.stderr).splitlines()
    return [ln for ln in lines if ln[:2] in {"E:", "W:", "I:", "P:", "X:", "O:"}]


@needs_tools
def test_the_binary_package_is_lintian_clean(tmp_path: Path) -> None:
    """The .deb packaging/build-deb makes: no error, warning, info, pedantic or experimental
    tag (bogus-mail-host and the long description lines are fixed; the no-init.d-script tag
    is overridden: a systemd-only daemon)."""
    done = subprocess.run(
        [str(REPO / "packaging/build-deb"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=CLEAN_PATH,
    )
    assert 0 == done.returncode, done.stderr[-3000:]
    deb = Path(done.stdout.strip().splitlines()[-1])
    assert [] == lintian(deb)


@needs_tools
def test_the_source_package_is_lintian_clean(tmp_path: Path) -> None:
    """The source package of the same sdist (format 3.0 native): clean but for the hostile
    slot files of the reliability corpus, whose long lines are overridden with their reason."""
    done = subprocess.run(
        ["/usr/bin/python3", "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=CLEAN_PATH,
    )
    assert 0 == done.returncode, done.stderr
    (sdist,) = tmp_path.glob("hal0_reconciler-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (tree,) = (p for p in tmp_path.iterdir() if p.is_dir())
    shutil.copytree(tree / "packaging/debian", tree / "debian", symlinks=False)
    built = subprocess.run(
        ["dpkg-source", "-b", "."],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=CLEAN_PATH,
    )
    assert 0 == built.returncode, built.stderr
    (dsc,) = tmp_path.glob("*.dsc")
    assert [] == lintian(dsc)
