"""Settings: hal0's defaults, a TOML file, command-line overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hal0_reconciler import settings
from hal0_reconciler.errors import SettingsError


def test_defaults_match_a_real_hal0_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without HAL0_HOME, every path is hal0's real one."""
    monkeypatch.delenv("HAL0_HOME", raising=False)
    s = settings.Settings()
    assert Path("/etc/hal0/slots") == s.slots_dir
    assert Path("/etc/hal0/slots.lock") == s.effective_lock_file
    assert Path("/etc/hal0/profiles.toml") == s.profiles_file
    assert "auto" == s.service_user  # the slot services' own identity
    assert Path("/dev/kfd") == s.kfd_path
    assert None is s.vulkan_validated_images  # read from the installed hal0
    assert Path("/usr/lib/hal0/venv") == s.hal0_venv
    assert Path("/usr/lib/hal0/current") == s.hal0_release_dir
    assert Path("/etc/hal0/hal0.toml") == s.hal0_config_file


@pytest.mark.parametrize(
    ("home", "expected"), [("/opt/h", "/opt/h/etc/hal0/slots"), ("  ", "/etc/hal0/slots")]
)
def test_hal0_home_moves_every_root(
    monkeypatch: pytest.MonkeyPatch, home: str, expected: str
) -> None:
    """HAL0_HOME, when set and not blank, moves the slots (and lock) under it."""
    monkeypatch.setenv("HAL0_HOME", home)
    s = settings.Settings()
    assert Path(expected) == s.slots_dir
    assert Path(expected + ".lock") == s.effective_lock_file


def test_hal0_home_moves_hal0s_other_files_and_our_settings_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under HAL0_HOME the profiles file, api.env and reconciler.toml move too."""
    monkeypatch.setenv("HAL0_HOME", str(tmp_path))
    (tmp_path / "etc/hal0").mkdir(parents=True)
    (tmp_path / "etc/hal0/reconciler.toml").write_text("demote_grace = 7\n")
    s = settings.load(None)
    assert (tmp_path / "etc/hal0/profiles.toml", tmp_path / "etc/hal0/api.env", 7.0) == (
        s.profiles_file,
        s.api_env_file,
        s.demote_grace,
    )


def test_file_then_overrides(tmp_path: Path) -> None:
    """Values come from the file, and command-line overrides win over it."""
    cfg = tmp_path / "reconciler.toml"
    cfg.write_text(
        'slots_dir = "/srv/slots"\ndemote_grace = 5\nvulkan_validated_images = ["a:1", "b:2"]\n'
        "[aiter]\nkeep_quarantines = 5\n"
    )
    s = settings.load(cfg, {"demote_grace": "7.5", "watch_dev": "false"})
    assert (Path("/srv/slots"), 7.5, ("a:1", "b:2"), False) == (
        s.slots_dir,
        s.demote_grace,
        s.vulkan_validated_images,
        s.watch_dev,
    )
    assert 5 == s.aiter.keep_quarantines


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slot_dir = '/x'\n", "'slot_dir'"),
        ("[aiter]\nkeep = 1\n", "'aiter.keep'"),
        ("demote_grace = 'soon'\n", "'demote_grace'"),
        ("demote_grace = true\n", "'demote_grace'"),
        ("restart_fallback = 'reboot'\n", "'restart_fallback'"),
        ("vulkan_validated_images = 'a:1'\n", "'vulkan_validated_images'"),
        ("this is not toml\n", "reconciler.toml"),
    ],
)
def test_bad_settings_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    """An unknown key or a bad value is an error that names the key (or the file)."""
    cfg = tmp_path / "reconciler.toml"
    cfg.write_text(text)
    with pytest.raises(SettingsError, match=message):
        settings.load(cfg)


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    """A settings file named on the command line must exist."""
    with pytest.raises(SettingsError, match="not found"):
        settings.load(tmp_path / "nope.toml")


def test_absent_default_file_means_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without /etc/hal0/reconciler.toml the defaults apply."""
    monkeypatch.setenv("HAL0_HOME", str(tmp_path))
    assert settings.Settings() == settings.load(None)


def test_hands_off_is_read_once_into_a_set_of_stripped_names(tmp_path: Path) -> None:
    """Each name is stripped when the settings are read, empty ones dropped: every check after
    that is a set lookup (the judge, the label check)."""
    conf = tmp_path / "reconciler.toml"
    conf.write_text('hands_off = [" agent ", "", "coder-id", "agent"]\n')
    assert frozenset({"agent", "coder-id"}) == settings.load(conf).hands_off
    assert frozenset() == settings.load(None, {}).hands_off


def test_hands_off_must_be_a_list(tmp_path: Path) -> None:
    conf = tmp_path / "reconciler.toml"
    conf.write_text('hands_off = "agent"\n')
    with pytest.raises(SettingsError, match="'hands_off' must be a list"):
        settings.load(conf)
