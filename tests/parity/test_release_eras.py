"""The reconciler places each real installed hal0 release in its era and names the release.

Every release of the list is unpacked from its real wheel where an install puts it; ``probe
--json`` and ``plan --json`` must name the release and the era the list gives it (decisions 7
and 12: the ``rule`` axis is ``pre-rule``, ``allowlist``, ``pins`` or ``not-placeable``, and
``release`` names the known release whose rules apply, ``version`` what is installed). The placements of decision 7 that are not a plain
install are checked on the same real code: no ``VERSION`` (the dist-info names the release), a
nightly (its base release), two ``python3.*`` folders (the one whose dist-info matches
``VERSION``), a release newer than any known on the newest era's code (the newest rules), and
code of no known release (not placeable).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import parity_releases as parity
import pytest

from helpers import hal0_install, hal0_releases

TIMEOUT = 60.0
NEWEST = parity.RELEASES[-1]


def _wheel(release: hal0_releases.Release) -> None:
    try:
        hal0_releases.fetch_wheel(release)
    except hal0_releases.ReleaseUnavailableError as exc:
        pytest.skip(str(exc))


CASE = hal0_install.InstallCase(slots={"chat.toml": '[slot]\ndevice = "gpu-vulkan"\n'})


def _run(root: Path, verb: str) -> dict[str, Any]:
    state = root.parent / "reconciler"
    state.mkdir(exist_ok=True)
    config = state / "reconciler.toml"
    config.write_text(hal0_install.settings_toml(root, state), encoding="utf-8")
    argv = [sys.executable, "-m", "hal0_reconciler", verb, "--json", "--config", str(config)]
    if verb == "plan":
        argv += ["--assume-amd", "--assume-rocm=usable"]
    env = {k: v for k, v in os.environ.items() if k != "HAL0_HOME"}
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False
    )
    try:
        doc: dict[str, Any] = json.loads(done.stdout)
    except ValueError as exc:
        msg = f"{verb} --json gave no JSON (exit {done.returncode}): {done.stderr[-2000:]}"
        raise AssertionError(msg) from exc
    return doc


def _value(entry: object) -> object:
    return entry.get("value") if isinstance(entry, dict) else entry


def _placed(doc: dict[str, Any]) -> tuple[object, object]:
    """``(rule, release)`` as ``probe``/``plan`` name them (a field or its ``value``)."""
    hal0 = doc.get("hal0") or {}
    return _value(hal0.get("rule")), _value(hal0.get("release"))


@pytest.mark.parametrize("release", parity.RELEASES, ids=parity.release_ids())
@pytest.mark.parametrize("verb", ["probe", "plan"])
def test_each_release_is_placed_in_its_era(
    release: hal0_releases.Release, verb: str, installed_hal0: parity.InstallHal0
) -> None:
    root = installed_hal0(release, CASE)
    assert _placed(_run(root, verb)) == (release.era, release.version)


@pytest.mark.parametrize("release", parity.RELEASES, ids=parity.release_ids())
def test_without_version_the_dist_info_names_the_release(
    release: hal0_releases.Release, installed_hal0: parity.InstallHal0
) -> None:
    root = installed_hal0(release, CASE)
    (root / "usr/lib/hal0/current/VERSION").unlink()
    assert _placed(_run(root, "probe")) == (release.era, release.version)


def test_a_nightly_is_judged_as_its_base_release(installed_hal0: parity.InstallHal0) -> None:
    root = installed_hal0(NEWEST, CASE)
    (root / "usr/lib/hal0/current/VERSION").write_text(f"{NEWEST.version}.dev20261115\n")
    doc = _run(root, "probe")
    assert _placed(doc) == (NEWEST.era, NEWEST.version)
    assert doc["hal0"]["version"] == f"{NEWEST.version}.dev20261115"


def test_of_two_python_folders_the_one_matching_version_is_read(
    installed_hal0: parity.InstallHal0, wheel_cache: Path
) -> None:
    """The newest release's code in python3.12 (VERSION names it), the oldest's in a
    leftover python3.13 folder: the era is the newest's, never the leftover's."""
    oldest = parity.RELEASES[0]
    root = installed_hal0(NEWEST, CASE)
    _wheel(oldest)
    leftover = root / "usr/lib/hal0/venv/lib/python3.13/site-packages"
    shutil.copytree(
        hal0_install.unpacked(oldest, wheel_cache),
        leftover,
        copy_function=os.link,
        ignore=shutil.ignore_patterns(".unpacked"),
    )
    assert _placed(_run(root, "probe")) == (NEWEST.era, NEWEST.version)


def test_a_release_newer_than_known_on_the_newest_code_gets_the_newest_rules(
    installed_hal0: parity.InstallHal0,
) -> None:
    root = installed_hal0(NEWEST, CASE)
    (root / "usr/lib/hal0/current/VERSION").write_text("99.0.0\n")
    doc = _run(root, "probe")
    assert _placed(doc) == (NEWEST.era, NEWEST.version)  # the rules of the newest known
    assert doc["hal0"]["version"] == "99.0.0"
    assert "99.0.0" in json.dumps(doc["hal0"]["summary"])  # said, not silently renamed


def test_code_of_no_known_release_is_not_placeable(
    installed_hal0: parity.InstallHal0, wheel_cache: Path
) -> None:
    """The newest release with the last allowlist release's ``config/schema.py`` in it (its
    ``VULKAN_CAPABLE_IMAGE_REFS`` beside ``runners/pins.py``): no release has that structure."""
    allowlist = [r for r in parity.RELEASES if r.era == "allowlist"][-1]
    root = installed_hal0(NEWEST, CASE)
    _wheel(allowlist)
    schema = root / hal0_install.SITE / "hal0/config/schema.py"
    schema.unlink()
    shutil.copyfile(hal0_install.unpacked(allowlist, wheel_cache) / "hal0/config/schema.py", schema)
    rule, _release = _placed(_run(root, "probe"))
    assert rule == "not-placeable"
