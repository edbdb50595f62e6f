"""An installed hal0 from a real release's wheel, laid out as an install lays it out.

``<root>/usr/lib/hal0/venv/lib/python3.12/site-packages/{hal0,hal0ai-<v>.dist-info}`` (the
wheel's own files), ``<root>/usr/lib/hal0/current/VERSION`` (+ ``manifest.json`` when the case
has one), ``<root>/etc/hal0/{slots/,hal0.toml,api.env,manifest.json}`` and the downgrade restore
marker ``<root>/var/lib/hal0/runner-migration.restored`` when the case has them.

hal0 itself run with ``HAL0_HOME=<dir>`` reads ``<dir>/usr-lib/hal0/current``,
``<dir>/etc/hal0`` and ``<dir>/var-lib/hal0`` (hal0's ``config/paths.py``): ``hal0_home_copy``
makes that copy of a tree for hal0's reference run, the original stays for the reconciler.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from helpers import hal0_releases

SITE = f"usr/lib/hal0/venv/lib/python{hal0_releases.PYTHON_MINOR}/site-packages"
RESTORE_MARKER = "runner-migration.restored"
PROFILE_CENTRIC_MARKER = "profile-centric.restored"
_UNPACKING = threading.Lock()


@dataclass(frozen=True)
class InstallCase:
    """What one installed box holds besides hal0's code (``None``: the file is absent)."""

    slots: Mapping[str, str]  # slot file name -> its text
    hal0_toml: str | None = None
    api_env: str | None = None
    release_manifest: str | None = None  # /usr/lib/hal0/current/manifest.json
    etc_manifest: str | None = None  # /etc/hal0/manifest.json
    restore_marker: str | None = None  # /var/lib/hal0/runner-migration.restored
    extra: Mapping[str, str] = field(default_factory=dict)  # more files, by path under the root


def unpacked(release: hal0_releases.Release, cache: Path) -> Path:
    """The release's wheel unpacked once into ``cache`` (a site-packages folder)."""
    site = cache / release.version
    with _UNPACKING:
        if not (site / ".unpacked").is_file():
            shutil.rmtree(site, ignore_errors=True)
            site.mkdir(parents=True)
            hal0_releases.unpack_wheel(release, site)
            (site / ".unpacked").touch()
    return site


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def install_tree(
    root: Path, release: hal0_releases.Release, case: InstallCase, *, wheel_cache: Path
) -> Path:
    """Lay ``release`` and ``case`` out under ``root``; the code is hard-linked from the
    unpacked wheel (real files, never links the reconciler would refuse)."""
    shutil.copytree(
        unpacked(release, wheel_cache),
        root / SITE,
        copy_function=os.link,
        ignore=shutil.ignore_patterns(".unpacked"),
    )
    _write(root / "usr/lib/hal0/current/VERSION", release.version + "\n")
    etc = root / "etc/hal0"
    (etc / "slots").mkdir(parents=True, exist_ok=True)
    for name, text in case.slots.items():
        _write(etc / "slots" / name, text)
    optional = {
        etc / "hal0.toml": case.hal0_toml,
        etc / "api.env": case.api_env,
        etc / "manifest.json": case.etc_manifest,
        root / "usr/lib/hal0/current/manifest.json": case.release_manifest,
        root / "var/lib/hal0" / RESTORE_MARKER: case.restore_marker,
        **{root / rel: text for rel, text in case.extra.items()},
    }
    for path, text in optional.items():
        if text is not None:
            _write(path, text)
    return root


def settings_toml(root: Path, state: Path) -> str:
    """The reconciler's settings file for a tree (every hal0 path a setting pointing into it;
    the reconciler's own folders under ``state``). A setting the reconciler under test does
    not have (an older checkout) is left out."""
    values = {
        "slots_dir": root / "etc/hal0/slots",
        "profiles_file": root / "etc/hal0/profiles.toml",
        "hal0_venv": root / "usr/lib/hal0/venv",
        "hal0_release_dir": root / "usr/lib/hal0/current",
        "hal0_config_file": root / "etc/hal0/hal0.toml",
        "api_env_file": root / "etc/hal0/api.env",
        "update_jobs_dir": root / "var/lib/hal0/update-jobs",
        "quadlet_dir": root / "etc/containers/systemd",
        "state_dir": state / "state",
        "runtime_dir": state / "run",
        "kfd_path": root / "dev/kfd",
        "dri_dir": root / "dev/dri",
        "amdgpu_module_dir": root / "sys/module/amdgpu",
        "restore_marker": root / "var/lib/hal0" / RESTORE_MARKER,  # from 0.3.0
    }
    known = _known_settings()
    values = {key: value for key, value in values.items() if key in known}
    return "".join(f'{key} = "{value}"\n' for key, value in values.items())


@functools.cache
def _known_settings() -> frozenset[str]:
    """The settings of the reconciler the tests run (``python -m hal0_reconciler`` with this
    environment: ``PYTHONPATH`` may name another checkout than the test process imports)."""
    code = "import dataclasses as d, hal0_reconciler.settings as s\n"
    code += "print(' '.join(f.name for f in d.fields(s.Settings)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return frozenset(done.stdout.split())


def hal0_home_copy(root: Path, dest: Path) -> Path:
    """A copy of the tree's hal0 files in hal0's own ``HAL0_HOME`` layout (no code: hal0 runs
    from its venv)."""
    shutil.copytree(root / "etc", dest / "etc")
    for fhs, home in (("usr/lib/hal0/current", "usr-lib/hal0/current"), ("var/lib", "var-lib")):
        if (root / fhs).is_dir():
            shutil.copytree(root / fhs, dest / home)
    return dest
