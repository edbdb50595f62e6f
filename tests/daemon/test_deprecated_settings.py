"""A deprecated setting (``[aiter] heal_shape_keyed`` from 0.1.0) is still accepted, with a
warning at every load of the file that names the release removing it: from the file or from
``--set``, by ``check-config`` (exit 0, on its output), at the daemon's start and at a reload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from hal0_reconciler import settings
from helpers.daemon_host import Host, running, wait_until
from integration.test_cli import cli

WARNING = (
    "setting 'aiter.heal_shape_keyed' {where} is deprecated and ignored; 0.4.0 removes it: it "
    "has had no effect since 0.2.0 (a shape-keyed module is never healed): remove it"
)


def _file(tmp_path: Path, text: str = "") -> Path:
    config = tmp_path / "reconciler.toml"
    config.write_text(f"demote_grace = 7.0\n{text}[aiter]\nheal_shape_keyed = true\n")
    return config


def test_the_file_loads_and_the_warning_names_the_file_and_0_4_0(tmp_path: Path) -> None:
    config = _file(tmp_path)
    loaded = settings.read(config)
    assert (7.0, (WARNING.format(where=f"in {config}"),)) == (
        loaded.settings.demote_grace,
        loaded.deprecated,
    )


def test_set_on_the_command_line_is_warned_about_too(tmp_path: Path) -> None:
    loaded = settings.read(None, {"aiter": {"heal_shape_keyed": True}, "state_dir": str(tmp_path)})
    assert (WARNING.format(where="by --set"),) == loaded.deprecated


def test_check_config_says_valid_with_the_warning_and_exits_0(tmp_path: Path) -> None:
    """On its own output (a person reads it), once: not also as a log line on the terminal."""
    config = _file(tmp_path)
    done = cli("check-config", "--config", str(config))
    assert 0 == done.returncode, done.stderr
    assert [
        f"{config}: valid, with 1 deprecated setting",
        "warning: " + WARNING.format(where=f"in {config}"),
    ] == done.stdout.splitlines()
    assert "settings.deprecated" not in done.stderr
    both = cli("check-config", "--config", str(config), "--set", "aiter.heal_shape_keyed=false")
    assert 0 == both.returncode
    assert f"{config}: valid, with 2 deprecated settings" == both.stdout.splitlines()[0]
    assert "warning: " + WARNING.format(where="by --set") in both.stdout.splitlines()


def test_the_journal_line_of_a_start_carries_the_warning(tmp_path: Path) -> None:
    """Where the log is the journal (or JSON), the event is logged at warning as well."""
    config = _file(tmp_path)
    done = cli("check-config", "--config", str(config), "--log-format", "journal")
    assert 0 == done.returncode
    assert [
        f'<4>settings.deprecated message="{WARNING.format(where=f"in {config}")}" effect=ignored'
    ] == [line for line in done.stderr.splitlines() if line.startswith("<")]
    shown = cli("check-config", "--config", str(config), "--log-format", "json")
    events = [json.loads(line) for line in shown.stderr.splitlines() if line.startswith("{")]
    assert [("settings.deprecated", "warning")] == [(e["event"], e["level"]) for e in events]


def test_every_reload_of_the_daemon_warns_again(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """Whatever else the file sets: each SIGHUP's load says it again."""
    config = _file(tmp_path, "resync_interval = 120\n")
    overrides = host.overrides()
    del overrides["resync_interval"]
    with (
        capture_logs() as logs,
        running(host.settings(), config_path=config, overrides=overrides) as d,
    ):
        notify_socket.wait_for("READY=1")
        for count in (1, 2):
            d.request_reload()
            wait_until(lambda n=count: sum(e["event"] == "daemon.reloaded" for e in logs) == n)
    said = [e for e in logs if e["event"] == "settings.deprecated"]
    assert [("warning", WARNING.format(where=f"in {config}"))] * 2 == [
        (e["log_level"], e["message"]) for e in said
    ]
