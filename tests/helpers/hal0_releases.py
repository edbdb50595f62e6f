"""hal0's published releases for the tests: the list, the wheels, a venv per release.

The list (``tests/data/hal0-releases.txt``: version, the wheel's sha256 and the era per line) is the
project's; the wheels are hal0's and live only in the test cache,
``${HAL0_TEST_CACHE:-/var/cache/hal0-reconciler-tests}/hal0ai``: ``wheels/`` as ``pip download``
leaves them, and ``venv-<version>/`` a Python 3.12+ venv with that wheel installed, complete when
it holds ``.done``. Nothing of hal0 is ever written into the repository.

Stdlib only, so ``tests/run`` can call it before anything is installed:
``python3 tests/helpers/hal0_releases.py [--versions ...]`` fetches, checks and builds what is
missing (quick when everything is cached) and exits 0 even without the package index, printing
why each release is unavailable; the tests then skip with that reason.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

RELEASES_FILE = Path(__file__).resolve().parent.parent / "data" / "hal0-releases.txt"
PACKAGE = "hal0ai"
PYTHON_MINOR = "3.12"  # the venvs' Python: hal0 needs >= 3.12; the install layout names it
DOWNLOAD_TIMEOUT = 300.0
VENV_TIMEOUT = 600.0


class ReleaseUnavailableError(Exception):
    """A release's wheel or venv cannot be had here; the message says why."""


@dataclass(frozen=True)
class Release:
    version: str
    sha256: str
    era: str  # the rule it judges Vulkan slots by: pre-rule, allowlist, pins

    @property
    def wheel_name(self) -> str:
        return f"{PACKAGE}-{self.version}-py3-none-any.whl"


def releases(path: Path = RELEASES_FILE) -> tuple[Release, ...]:
    """The release list, oldest first (comments and blank lines skipped)."""
    out = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            version, digest, era = line.split()
            out.append(Release(version, digest.lower(), era))
    return tuple(out)


def cache_dir() -> Path:
    return Path(os.environ.get("HAL0_TEST_CACHE") or "/var/cache/hal0-reconciler-tests") / "hal0ai"


def wheel_path(release: Release) -> Path:
    return cache_dir() / "wheels" / release.wheel_name


def venv_dir(release: Release) -> Path:
    return cache_dir() / f"venv-{release.version}"


def venv_python(release: Release) -> Path:
    return venv_dir(release) / "bin" / "python"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(release: Release) -> Path:
    """The release's wheel in the cache, downloaded when absent, its sha256 checked."""
    path = wheel_path(release)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "pip", "download", "-q", "--no-deps",
            "--python-version", PYTHON_MINOR, "--only-binary=:all:",
            f"{PACKAGE}=={release.version}", "-d", str(path.parent),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            msg = f"{PACKAGE}=={release.version}: pip download failed: {exc}"
            raise ReleaseUnavailableError(msg) from exc
        if done.returncode != 0 or not path.is_file():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            msg = f"{PACKAGE}=={release.version}: not fetched from the package index ({tail})"
            raise ReleaseUnavailableError(msg)
    actual = sha256_of(path)
    if actual != release.sha256:
        msg = f"{path}: sha256 {actual}, the release list says {release.sha256}"
        raise ReleaseUnavailableError(msg)
    return path


def find_python() -> Path:
    """A Python >= 3.12: pyenv's 3.12.1, else python3.12 or python3.13 on PATH."""
    candidates: list[Path] = []
    pyenv = shutil.which("pyenv")
    if pyenv:
        try:
            root = subprocess.run(
                [pyenv, "root"], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            root = ""
        if root:
            candidates.append(Path(root) / "versions/3.12.1/bin/python3.12")
    candidates += [Path(p) for n in ("python3.12", "python3.13") if (p := shutil.which(n))]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    msg = "no Python 3.12 or 3.13 here (pyenv 3.12.1, python3.12, python3.13) for hal0's venvs"
    raise ReleaseUnavailableError(msg)


def ensure_venv(release: Release) -> Path:
    """The release's venv python, built (and marked ``.done``) when absent."""
    venv = venv_dir(release)
    if (venv / ".done").is_file() and venv_python(release).exists():
        return venv_python(release)
    wheel = fetch_wheel(release)
    python = find_python()
    shutil.rmtree(venv, ignore_errors=True)  # a half-built venv from an interrupted run
    for argv in (
        [str(python), "-m", "venv", str(venv)],
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)],
    ):
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=VENV_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            msg = f"{PACKAGE}=={release.version}: venv not built: {exc}"
            raise ReleaseUnavailableError(msg) from exc
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            msg = f"{PACKAGE}=={release.version}: venv not built ({' '.join(argv[:3])}: {tail})"
            raise ReleaseUnavailableError(msg)
    (venv / ".done").touch()
    return venv_python(release)


def unpack_wheel(release: Release, site_packages: Path) -> None:
    """The wheel's files into ``site_packages`` as pip lays them out (``hal0/`` and its
    dist-info; the wheel holds nothing else that an install puts in site-packages)."""
    with zipfile.ZipFile(fetch_wheel(release)) as wheel:
        for member in wheel.infolist():
            name = member.filename
            top = name.split("/", 1)[0]
            if name.startswith(("/", "..")) or "/../" in name or top.endswith(".data"):
                continue
            wheel.extract(member, site_packages)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="*", help="only these releases (default: the list)")
    args = parser.parse_args()
    wanted = set(args.versions or [])
    unavailable = 0
    for release in releases():
        if wanted and release.version not in wanted:
            continue
        try:
            ensure_venv(release)
        except ReleaseUnavailableError as exc:
            unavailable += 1
            print(f"hal0 releases: {exc}; the tests that need it skip", file=sys.stderr)
    if unavailable:
        print(f"hal0 releases: {unavailable} unavailable", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
