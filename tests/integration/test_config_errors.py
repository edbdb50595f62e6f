"""A mistake in the settings file: exit 78 (EX_CONFIG) where the file is needed, `check-config`
before a restart, `status` that answers anyway, removed settings that only warn."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from hal0_reconciler import cli as cli_mod
from hal0_reconciler import settings
from hal0_reconciler.daemon import status
from integration.test_cli import cli

BROKEN = {
    "unknown key": ("slot_dir = '/x'\n", "unknown setting 'slot_dir' (did you mean 'slots_dir'?)"),
    "not TOML": ("demote_grace = = 1\n", "not valid TOML"),
    "out of range": ("resync_interval = 0\n", "'resync_interval' = 0 is out of range"),
    "wrong kind": ("watch_dev = 'maybe'\n", "'watch_dev' has a bad value 'maybe'"),
}
NEEDS_THE_FILE = [["once"], ["plan"], ["probe"], ["run"], ["check-config"], ["aiter", "plan"]]


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """The in-process command line configures structlog: put the test run's setup back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def run_main(args: list[str]) -> int:
    try:
        return cli_mod.main(args)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("verb", NEEDS_THE_FILE, ids=" ".join)
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_an_invalid_settings_file_exits_78_naming_the_file_and_the_key(
    verb: list[str], case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every verb that needs the file refuses it with one line that starts with its path, and
    exit 78, which the unit's RestartPreventExitStatus= keeps from burning the start limit."""
    text, says = BROKEN[case]
    config = tmp_path / "reconciler.toml"
    config.write_text(text)
    code = run_main([*verb, "--runtime-dir", str(tmp_path), "--config", str(config)])
    last = capsys.readouterr().err.splitlines()[-1]
    assert 78 == code
    assert last.startswith(f"hal0-reconciler: error: {config}: ")
    assert says in last


def test_a_settings_file_that_is_a_folder_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder where the file should be is the file's error, said without Python's errno."""
    code = run_main(["check-config", "--config", str(tmp_path)])
    err = capsys.readouterr().err
    assert 78 == code
    assert f"{tmp_path}: cannot read the settings file: a folder, not a regular file" in err
    assert "Errno" not in err


@pytest.mark.parametrize("verb", NEEDS_THE_FILE, ids=" ".join)
def test_a_bad_set_value_with_a_valid_file_stays_a_usage_error(
    verb: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line's mistake is not the file's: exit 1, and no path in the line."""
    config = tmp_path / "reconciler.toml"
    config.write_text("resync_interval = 120\n")
    argv = [*verb, "--runtime-dir", str(tmp_path), "--config", str(config)]
    code = run_main([*argv, "--set", "resync_interval=0"])
    last = capsys.readouterr().err.splitlines()[-1]
    assert 1 == code
    assert "hal0-reconciler: error: setting 'resync_interval' = 0 is out of range" in last


def test_a_broken_file_is_blamed_even_when_an_override_is_given(tmp_path: Path) -> None:
    """`--set` of another key does not turn the file's error into a usage error."""
    config = tmp_path / "reconciler.toml"
    config.write_text("slot_dir = '/x'\n")
    assert 78 == run_main(["check-config", "--config", str(config), "--set", "demote_grace=5"])


def test_check_config_says_a_valid_file_is_valid(tmp_path: Path) -> None:
    """Exit 0 and the path on stdout: safe to chain before `systemctl restart`."""
    config = tmp_path / "reconciler.toml"
    config.write_text("demote_grace = 5.0\n[aiter]\nheal = false\n")
    result = cli("check-config", "--config", str(config))
    assert (0, f"{config}: valid\n", "") == (result.returncode, result.stdout, result.stderr)


def test_check_config_without_a_file_says_the_defaults_apply(tmp_path: Path) -> None:
    """No /etc/hal0/reconciler.toml is not an error: the defaults are valid."""
    result = cli("check-config", env={"HAL0_HOME": str(tmp_path)})
    expected = f"no settings file at {tmp_path}/etc/hal0/reconciler.toml: the defaults apply\n"
    assert (0, expected) == (result.returncode, result.stdout)


def test_check_config_reads_the_default_file_as_run_does(tmp_path: Path) -> None:
    """Without --config it checks the file `run` would read (under $HAL0_HOME here)."""
    config = tmp_path / "etc/hal0/reconciler.toml"
    config.parent.mkdir(parents=True)
    config.write_text("stuck_after = 0\n")
    result = cli("check-config", env={"HAL0_HOME": str(tmp_path)})
    assert 78 == result.returncode
    assert f"{config}: setting 'stuck_after' = 0 is out of range" in result.stderr


def live_snapshot(runtime: Path) -> None:
    """A status file whose writer is alive (this test process) and healthy."""
    current = settings.load(None, {"runtime_dir": str(runtime)})
    snapshot = {
        "pid": os.getpid(),
        "pid_start": status.process_start_time(os.getpid()),
        "updated_at": time.time(),
        "heartbeat": 30.0,
        "healthy": True,
        "health": "healthy",
        "ready": True,
        "lane": {"amd": True, "state": "usable", "reason": "ok"},
    }
    status.write_status(current, snapshot)


def test_status_json_answers_while_the_file_on_disk_is_invalid(tmp_path: Path) -> None:
    """Monitoring reads the daemon's state (exit 0: it runs on the settings it read) and the
    file's error as a field of its own."""
    live_snapshot(tmp_path)
    config = tmp_path / "reconciler.toml"
    config.write_text("slot_dir = '/x'\n")
    result = cli("status", "--json", "--runtime-dir", str(tmp_path), "--config", str(config))
    doc = json.loads(result.stdout)
    assert (0, "running") == (result.returncode, doc["state"])
    assert (
        f"{config}: unknown setting 'slot_dir' (did you mean 'slots_dir'?)"
        == doc["settings_file_error"]
    )


def test_status_says_in_a_line_that_the_file_on_disk_is_invalid(tmp_path: Path) -> None:
    """The text report keeps its first line and adds one naming the broken file."""
    live_snapshot(tmp_path)
    config = tmp_path / "reconciler.toml"
    config.write_text("[aiter\n")
    result = cli("status", "--runtime-dir", str(tmp_path), "--config", str(config))
    lines = result.stdout.splitlines()
    assert (0, "hal0-reconciler: running (pid") == (result.returncode, lines[0][:29])
    assert lines[1].startswith(f"  settings file on disk is invalid: {config}: not valid TOML")


def test_status_json_of_a_valid_file_has_a_null_settings_error(tmp_path: Path) -> None:
    """The field is always there, null when the file is fine."""
    live_snapshot(tmp_path)
    result = cli("status", "--json", "--runtime-dir", str(tmp_path))
    assert None is json.loads(result.stdout)["settings_file_error"]


def test_status_with_a_broken_file_still_takes_a_bad_set_as_usage(tmp_path: Path) -> None:
    """Only the file is set aside: a bad `--set` is still refused with exit 1."""
    config = tmp_path / "reconciler.toml"
    config.write_text("slot_dir = '/x'\n")
    result = cli("status", "--config", str(config), "--set", "resync_interval=0")
    assert 1 == result.returncode


def test_a_removed_setting_is_ignored_with_a_deprecation_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file written for the previous release still loads (never 78 after an upgrade): the
    removed keys, top level and nested, are named in a warning and ignored."""
    monkeypatch.setattr(
        settings, "REMOVED", {"old_knob": "delete the line", "aiter.old_flag": "use heal"}
    )
    config = tmp_path / "reconciler.toml"
    config.write_text("old_knob = 3\ndemote_grace = 7.0\n[aiter]\nold_flag = true\nheal = false\n")
    loaded = settings.read(config)
    assert (7.0, False) == (loaded.settings.demote_grace, loaded.settings.aiter.heal)
    assert (
        f"setting 'old_knob' in {config} was removed and is ignored: delete the line",
        f"setting 'aiter.old_flag' in {config} was removed and is ignored: use heal",
    ) == loaded.deprecated
    code = run_main(["check-config", "--config", str(config), "--log-format", "json"])
    err = capsys.readouterr().err
    assert 0 == code
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [("settings.deprecated", "warning")] * 2 == [(e["event"], e["level"]) for e in events]


def test_a_removed_name_that_is_a_setting_again_is_not_dropped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The table of removed names never hides a current setting."""
    monkeypatch.setattr(settings, "REMOVED", {"demote_grace": "gone"})
    config = tmp_path / "reconciler.toml"
    config.write_text("demote_grace = 7.0\n")
    loaded = settings.read(config)
    assert (7.0, ()) == (loaded.settings.demote_grace, loaded.deprecated)


# --- output that fits pipes ----------------------------------------------------------------------


def test_plan_says_a_hal0_fallback_once_in_its_header_not_also_on_stderr(tmp_path: Path) -> None:
    """Without hal0 installed, `plan 2>&1 | less` shows the fallback in the header only; the
    structured event is there when JSON logs are asked for."""
    slots = tmp_path / "slots"
    slots.mkdir()
    args = ["plan", "--slots-dir", str(slots), "--assume-amd", "--assume-rocm=usable"]
    args += ["--hal0-venv", str(tmp_path / "no-venv"), "--state-dir", str(tmp_path / "state")]
    args += ["--hal0-release-dir", str(tmp_path / "no-release")]
    args += ["--hal0-config-file", str(tmp_path / "no-hal0.toml")]
    plain = cli(*args)
    assert "hal0: " in plain.stdout
    assert "hal0.facts_note" not in plain.stderr
    logged = cli(*args, "--log-format", "json")
    events = [json.loads(line)["event"] for line in logged.stderr.splitlines() if line]
    assert "hal0.facts_note" in events
    assert "hal0: " in logged.stdout


def test_log_lines_into_a_pipe_are_for_people_unless_json_is_asked(tmp_path: Path) -> None:
    """stderr not a terminal (a pipe, cron mail): the event as a human line, no escape codes,
    no JSON; `--log-format json` gives the JSON."""
    (tmp_path / "amdgpu").mkdir()
    (tmp_path / "slots").mkdir()
    args = ["once", "--slots-dir", str(tmp_path / "slots"), "--state-dir", str(tmp_path / "st")]
    args += ["--amdgpu-module-dir", str(tmp_path / "amdgpu"), "--user", "no-such-user-here"]
    human = cli(*args).stderr.splitlines()
    said = [line for line in human if "host.probe_failed" in line]
    assert 1 == len(said), human
    assert not said[0].lstrip().startswith("{")
    assert "\033[" not in "".join(human)
    logged = cli(*args, "--log-format", "json").stderr.splitlines()
    assert "host.probe_failed" in [json.loads(line)["event"] for line in logged]
