"""Settings an operator cannot hurt the host with: ranges, closed sets, human messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_type_hints

import pytest

from hal0_reconciler import settings
from hal0_reconciler.errors import SettingsError


def _numeric_names(cls: type = settings.Settings, where: str = "") -> list[str]:
    hints = get_type_hints(cls)
    names: list[str] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            names += _numeric_names(hint, f"{where}{f.name}.")
        elif hint in (int, float, int | None, float | None):
            names.append(where + f.name)
    return names


def test_every_numeric_setting_has_a_range() -> None:
    """A new numeric setting must say its allowed values (a zero interval busy-loops)."""
    assert sorted(_numeric_names()) == sorted(settings.RANGES)


def test_the_defaults_are_inside_their_ranges() -> None:
    """The built-in values pass their own checks."""
    for name, allowed in settings.RANGES.items():
        value: object = settings.Settings()
        for part in name.split("."):
            value = getattr(value, part)
        assert value is None or value in allowed, name  # None: read from the installed hal0


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "resync_interval",
            "0",
            "setting 'resync_interval' = 0 is out of range: allowed 0.5 to 86400 seconds",
        ),
        (
            "resync_interval",
            "-5",
            "setting 'resync_interval' = -5 is out of range: allowed 0.5 to 86400 seconds",
        ),
        (
            "resync_interval",
            "nan",
            "setting 'resync_interval' = nan is out of range: allowed 0.5 to 86400 seconds",
        ),
        (
            "resync_interval",
            "inf",
            "setting 'resync_interval' = inf is out of range: allowed 0.5 to 86400 seconds",
        ),
        (
            "demote_grace",
            "-1",
            "setting 'demote_grace' = -1 is out of range: allowed 0 to 86400 seconds",
        ),
        (
            "settle_cap",
            "-2",
            "setting 'settle_cap' = -2 is out of range: allowed 0.01 to 600 seconds",
        ),
        (
            "settle_window",
            "0",
            "setting 'settle_window' = 0 is out of range: allowed 0.01 to 60 seconds",
        ),
        (
            "fight_limit",
            "-3",
            "setting 'fight_limit' = -3 is out of range: allowed 1 to 1000 relabels",
        ),
        (
            "restart_concurrency",
            "9",
            "setting 'restart_concurrency' = 9 is out of range: allowed 1 to 8 restarts",
        ),
        (
            "restart_concurrency",
            "0",
            "setting 'restart_concurrency' = 0 is out of range: allowed 1 to 8 restarts",
        ),
        (
            "fight_window",
            "0",
            "setting 'fight_window' = 0 is out of range: allowed 1 to 86400 seconds",
        ),
        (
            "stuck_after",
            "0",
            "setting 'stuck_after' = 0 is out of range: allowed 0.5 to 86400 seconds",
        ),
        (
            "lock_timeout",
            "0",
            "setting 'lock_timeout' = 0 is out of range: allowed 0.1 to 3600 seconds",
        ),
        (
            "probe_timeout",
            "0",
            "setting 'probe_timeout' = 0 is out of range: allowed 0.5 to 300 seconds",
        ),
        (
            "api_timeout",
            "-1",
            "setting 'api_timeout' = -1 is out of range: allowed 0.1 to 300 seconds",
        ),
        (
            "restart_min_interval",
            "-1",
            "setting 'restart_min_interval' = -1 is out of range: allowed 0 to 86400 seconds",
        ),
    ],
)
def test_a_value_out_of_range_is_one_line_naming_key_value_and_range(
    key: str, value: str, message: str
) -> None:
    """Each numeric setting refuses values outside its range, saying which, as typed."""
    with pytest.raises(SettingsError) as caught:
        settings.load(None, {key: value})
    assert message == str(caught.value)


def test_nested_ranges_are_checked_in_the_file(tmp_path: Path) -> None:
    """A nested setting out of range names the file and its dotted key."""
    cfg = tmp_path / "r.toml"
    cfg.write_text("[aiter]\nsettle_window = -1\n")
    with pytest.raises(
        SettingsError, match=r"r.toml: setting 'aiter.settle_window' = -1 is out of"
    ):
        settings.load(cfg)


def test_the_settle_cap_is_not_below_the_settle_window() -> None:
    """A cap shorter than the window would cut every settle short."""
    with pytest.raises(SettingsError, match=r"'settle_cap' = 0.1 is out of range: allowed 0.5"):
        settings.load(None, {"settle_window": "0.5", "settle_cap": "0.1"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"resync_interval": "abc"},
            "setting 'resync_interval' has a bad value 'abc': expected a number",
        ),
        (
            {"fight_limit": "1.5"},
            "setting 'fight_limit' has a bad value '1.5': expected a whole number",
        ),
        (
            {"restart_concurrency": "2.5"},
            "setting 'restart_concurrency' has a bad value '2.5': expected a whole number",
        ),
        (
            {"watch_dev": "maybe"},
            "setting 'watch_dev' has a bad value 'maybe': expected true or false",
        ),
        (
            {"log_format": "xml"},
            "setting 'log_format' has a bad value 'xml': valid values are auto, console, json, journal",
        ),
        (
            {"restart_fallback": "reboot"},
            "setting 'restart_fallback' has a bad value 'reboot': valid values are stop, none",
        ),
        (
            {"log_level": "verbose"},
            "setting 'log_level' has a bad value 'verbose': valid values are debug, info, warning, error",
        ),
        ({"slot_dir": "/x"}, "unknown setting 'slot_dir' (did you mean 'slots_dir'?)"),
        (
            {"resync_intervall": "5"},
            "unknown setting 'resync_intervall' (did you mean 'resync_interval'?)",
        ),
        ({"heal": "false"}, "unknown setting 'heal' (did you mean 'aiter.heal'?)"),
        ({"aiter": {"heel": "false"}}, "unknown setting 'aiter.heel' (did you mean 'aiter.heal'?)"),
        ({"zzz": "1"}, "unknown setting 'zzz'"),
    ],
)
def test_refusals_speak_to_people(raw: dict[str, object], message: str) -> None:
    """No Python internals; the valid values are listed; a near miss gets a suggestion."""
    with pytest.raises(SettingsError) as caught:
        settings.load(None, raw)
    assert message == str(caught.value)


def test_a_settings_file_that_is_a_folder_is_said_plainly(tmp_path: Path) -> None:
    """No '[Errno 21]' in the message."""
    with pytest.raises(SettingsError) as caught:
        settings.load(tmp_path)
    expected = f"{tmp_path}: cannot read the settings file: a folder, not a regular file"
    assert expected == str(caught.value)


def test_nested_overrides_merge_into_the_file_table(tmp_path: Path) -> None:
    """`--set aiter.heal=false` changes one key and keeps the file's other aiter keys."""
    cfg = tmp_path / "r.toml"
    cfg.write_text("[aiter]\nkeep_quarantines = 5\n")
    s = settings.load(cfg, {"aiter": {"heal": "false"}})
    assert (False, 5) == (s.aiter.heal, s.aiter.keep_quarantines)
