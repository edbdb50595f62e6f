"""The real-systemd suite: the Debian package installed in a booted Debian 12 container.

Needs root, ``systemd-nspawn`` (systemd-container), ``debootstrap`` and the package's build
tools (``dpkg-buildpackage``); skipped with the reason where any is missing. ``tests/run``
installs them on Debian. On failure, the container's journal is attached to the report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import nspawn, rootfs
from helpers.hal0_tree import Hal0Tree, manifest
from helpers.hosts import REPO

NULL_DEVICE = os.makedev(1, 3)  # the kernel's null device: safe to open
FILES = nspawn.FILES
DEV = nspawn.DEV


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, debootstrap, cgroups)"
    for tool, package in (
        ("systemd-nspawn", "systemd-container"),
        ("debootstrap", "debootstrap"),
        ("dpkg-buildpackage", "dpkg-dev"),
        ("dh", "debhelper"),
        ("nsenter", "util-linux"),
    ):
        if shutil.which(tool) is None:
            return f"no {tool} (Debian package {package}; tests/run installs it)"
    return None


MISSING = _missing()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if MISSING is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.skip(reason=f"real-systemd suite: {MISSING}"))


class FakeDev:
    """The fake GPU nodes on the host (char devices 1:3), seen at ``DEV`` in the container."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "dri").mkdir(parents=True)
        for folder in (root, root / "dri"):
            folder.chmod(0o755)
        self.make_kfd()
        self._node(root / "dri/renderD128")

    @staticmethod
    def _node(path: Path) -> None:
        os.mknod(path, 0o666 | 0o020000, NULL_DEVICE)
        path.chmod(0o666)

    def make_kfd(self) -> None:
        self._node(self.root / "kfd")

    def remove_kfd(self) -> None:
        (self.root / "kfd").unlink()


@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hal0-reconciler_<version>_all.deb, built by the README's one command."""
    out = tmp_path_factory.mktemp("deb")
    done = subprocess.run(
        [str(REPO / "packaging/build-deb"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"packaging/build-deb failed:\n{done.stdout}\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def box(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[nspawn.Container]:
    """A booted Debian 12 with the package installed as the README says (``apt install``;
    no network inside: the Debian dependencies are in the cached root)."""
    root = rootfs.ensure()
    files = tmp_path_factory.mktemp("files")
    shutil.copy2(deb, files / deb.name)
    dev = Path(tempfile.mkdtemp(prefix="hal0-nspawn-dev-"))
    container = nspawn.Container(
        root=root,
        binds={files: FILES, dev: DEV},
        log_path=files.parent / "console.log",
    )
    container.files = files  # type: ignore[attr-defined]
    container.dev = FakeDev(dev)  # type: ignore[attr-defined]
    # an installed hal0 1.7.0 (release-shaped, project-written) where the package looks for it
    # (/usr/lib/hal0), its manifest's standard pin not gated for Vulkan: a gpu-vulkan llama.cpp
    # slot is relabelled
    Hal0Tree(files / "hal0").install_pins("1.7.0", manifest(gated=False))
    try:
        container.boot()
        container.run(f"cp -a {FILES}/hal0/usr/lib/hal0 /usr/lib/hal0")
        container.run(f"apt install -y {FILES}/{deb.name}", timeout=120)
        yield container
    finally:
        container.shutdown()
        shutil.rmtree(dev, ignore_errors=True)


_CURRENT: list[nspawn.Container] = []


@pytest.fixture(autouse=True)
def _remember_box(request: pytest.FixtureRequest) -> Iterator[None]:
    """Lets the report hook find the container of a failing test."""
    if "box" in request.fixturenames:
        _CURRENT.append(request.getfixturevalue("box"))
    yield
    _CURRENT.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _CURRENT and call.when in {"call", "setup"}:
        box_ = _CURRENT[-1]
        try:
            journal = box_.journal(lines=300)
        except Exception as exc:  # the container itself may be the failure
            journal = f"(journal unavailable: {exc})\n{box_.console()}"
        report.sections.append(("container journal (last 300 lines)", journal))
