"""The release list and the test cache of hal0's wheels and venvs (tests/helpers/hal0_releases)."""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from pathlib import Path

import parity_releases as parity
import pytest
from packaging.version import Version

from helpers import hal0_releases

ERAS = ("pre-rule", "allowlist", "pins")


def test_the_release_list_is_oldest_first_with_a_sum_and_an_era_each() -> None:
    releases = hal0_releases.releases()
    versions = [Version(r.version) for r in releases]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert all(re.fullmatch(r"[0-9a-f]{64}", r.sha256) for r in releases)
    eras = [ERAS.index(r.era) for r in releases]  # an unknown era raises
    assert eras == sorted(eras)  # eras follow each other, never back


def test_a_newer_release_is_one_line(tmp_path: Path) -> None:
    listing = tmp_path / "releases.txt"
    text = hal0_releases.RELEASES_FILE.read_text(encoding="utf-8")
    listing.write_text(text + f"1.8.0 {'ab' * 32} pins\n", encoding="utf-8")
    assert hal0_releases.releases(listing)[-1] == hal0_releases.Release("1.8.0", "ab" * 32, "pins")


@pytest.mark.parametrize("release", parity.RELEASES, ids=parity.release_ids())
def test_the_cached_wheel_has_the_listed_sum(release: hal0_releases.Release) -> None:
    path = hal0_releases.wheel_path(release)
    if not path.is_file():
        pytest.skip(f"{path} is not fetched (tests/run fetches it)")
    assert hal0_releases.fetch_wheel(release) == path


def _offline(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setenv("HAL0_TEST_CACHE", str(cache))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no find-links, no extra index
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def test_without_the_package_index_the_release_is_unavailable_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline(monkeypatch, tmp_path)
    release = parity.RELEASES[-1]
    with pytest.raises(hal0_releases.ReleaseUnavailableError, match="package index"):
        hal0_releases.ensure_venv(release)
    assert not hal0_releases.venv_dir(release).exists()


def test_the_parity_test_skips_without_the_index_and_fails_with_ci_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline(monkeypatch, tmp_path)
    release = parity.RELEASES[-1]
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="package index"):
        parity.require(release, fail_in_ci=True)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        parity.require(release, fail_in_ci=True)
    with pytest.raises(pytest.skip.Exception):  # the era tests skip even in CI
        parity.require(release, fail_in_ci=False)


def test_a_wheel_whose_sum_differs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline(monkeypatch, tmp_path)
    release = hal0_releases.Release("9.9.9", "00" * 32, "pins")
    wheel = hal0_releases.wheel_path(release)
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("hal0/__init__.py", "")
    actual = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with pytest.raises(hal0_releases.ReleaseUnavailableError, match=f"sha256 {actual}"):
        hal0_releases.ensure_venv(release)
    assert not hal0_releases.venv_dir(release).exists()


def test_a_built_venv_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv holding ``.done`` is taken as it is (no wheel needed, nothing rebuilt); one
    without it is half-built and is not."""
    _offline(monkeypatch, tmp_path)
    release = hal0_releases.Release("9.9.9", "00" * 32, "pins")
    python = hal0_releases.venv_python(release)
    python.parent.mkdir(parents=True)
    python.write_text("")
    with pytest.raises(hal0_releases.ReleaseUnavailableError):
        hal0_releases.ensure_venv(release)  # no .done: rebuilt, and there is no wheel
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("")
    (hal0_releases.venv_dir(release) / ".done").touch()
    assert hal0_releases.ensure_venv(release) == python


def test_unpacking_lays_out_what_an_install_puts_in_site_packages(tmp_path: Path) -> None:
    release = parity.RELEASES[-1]
    if not hal0_releases.wheel_path(release).is_file():
        pytest.skip("the newest release's wheel is not fetched (tests/run fetches it)")
    hal0_releases.unpack_wheel(release, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hal0",
        f"hal0ai-{release.version}.dist-info",
    ]
    assert (tmp_path / "hal0/__init__.py").is_file()
