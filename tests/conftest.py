"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler import settings as settings_mod
from helpers.hal0_tree import Hal0Tree
from helpers.hosts import DATA


def pytest_configure(config: pytest.Config) -> None:
    """A suite started with ``sudo`` is root's own run: the variables that mark a command run
    for another user are dropped for it and its children (tests/security/test_sudo.py sets
    them where it means to)."""
    del config
    for variable in (
        "SUDO_UID",
        "SUDO_GID",
        "SUDO_USER",
        "SUDO_COMMAND",
        "PKEXEC_UID",
        "DOAS_USER",
    ):
        os.environ.pop(variable, None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="reliability suite: the full counts (minutes to hours), not the CI size",
    )


@pytest.fixture
def host_dirs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Temp stand-ins for every host path, nothing in them yet (a non-AMD host), and an
    installed 1.1.0-shaped hal0 with ``ade07ba`` images (its default is not Vulkan-capable, only a pin
    to ``hal0-combined:0822`` is): the world most behaviour tests are written in.

    The fake /dev lives outside pytest's 0700 tmp dirs, so the service user can reach it.
    """
    dev = Path(tempfile.mkdtemp(prefix="hal0-dev-"))
    dev.chmod(0o755)
    dirs = {
        "slots_dir": tmp_path / "etc/hal0/slots",
        "state_dir": tmp_path / "var/lib/hal0-reconciler",
        "runtime_dir": tmp_path / "run/hal0-reconciler",
        "amdgpu_module_dir": tmp_path / "sys/module/amdgpu",
        "kfd_path": dev / "kfd",
        "dri_dir": dev / "dri",
        "profiles_file": tmp_path / "etc/hal0/profiles.toml",
    }
    tree = Hal0Tree(tmp_path).install("ade07ba")
    dirs |= {
        k: Path(v)
        for k, v in tree.settings().items()
        if k not in {"api_env_file", "restore_marker"}
    }
    dirs["slots_dir"].mkdir(parents=True)
    dirs["dri_dir"].mkdir(parents=True)
    dirs["dri_dir"].chmod(0o755)
    yield dirs
    shutil.rmtree(dev, ignore_errors=True)


@pytest.fixture
def make_settings(host_dirs: dict[str, Path]):  # type: ignore[no-untyped-def]
    """Build Settings on the temp host paths, with overrides."""

    def make(**overrides: object) -> settings_mod.Settings:
        values: dict[str, object] = {k: str(v) for k, v in host_dirs.items()}
        values["service_user"] = "54321:54321"
        values["lock_timeout"] = 2.0
        values.update(overrides)
        return settings_mod.load(None, values)

    return make


@pytest.fixture
def seeded_slots(host_dirs: dict[str, Path]) -> Path:
    """The project's own slot files, copied into the temp slots directory."""
    for f in sorted((DATA / "slots").glob("*.toml")):
        shutil.copy2(f, host_dirs["slots_dir"] / f.name)
    return host_dirs["slots_dir"]
