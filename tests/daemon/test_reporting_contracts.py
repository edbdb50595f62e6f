"""Small contracts of what the daemon writes for others: modes, formats, exit codes."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

from hal0_reconciler import _log
from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import metrics, notify, status


def _settings(tmp_path: Path) -> settings_mod.Settings:
    return settings_mod.load(None, {"runtime_dir": str(tmp_path)})


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_status_and_metrics_are_readable_by_others_whatever_the_umask(tmp_path: Path) -> None:
    """status.json and the .prom file are 0644 even under the unit's UMask=0077."""
    old = os.umask(0o077)
    try:
        status.write_status(_settings(tmp_path), {"pid": 1})
        prom = tmp_path / "m.prom"
        metrics.write_textfile(prom, metrics.Metrics())
    finally:
        os.umask(old)
    assert (0o644, 0o644) == (_mode(tmp_path / "status.json"), _mode(prom))


def test_a_reused_pid_is_not_the_daemon(tmp_path: Path) -> None:
    """A live pid whose start time differs from the recorded one means: not running (exit 3)."""
    snapshot = {"pid": os.getpid(), "pid_start": -1.0, "updated_at": 1000.0, "healthy": True}
    status.write_status(_settings(tmp_path), snapshot)
    assert status.EXIT_NOT_RUNNING == status.report(_settings(tmp_path), now=1001.0)[1]


def test_an_unreadable_status_file_is_unknown(tmp_path: Path) -> None:
    """A status file that is not JSON gives exit 4 (LSB: status unknown), not 'not running'."""
    (tmp_path / "status.json").write_text("{half")
    assert status.EXIT_UNKNOWN == status.report(_settings(tmp_path))[1]


def test_metrics_escape_label_values_and_end_with_a_newline() -> None:
    """Prometheus text format: quotes escaped in label values, and a final newline."""
    text = metrics.render(metrics.Metrics(relabels={'x"y': 1}))
    assert 'hal0_reconciler_relabels_total{target="x\\"y"} 1' in text.splitlines()
    assert text.endswith("\n")


def test_status_line_is_short_printable_ascii() -> None:
    """sdnotify drops non-Latin-1 text silently: STATUS= is forced to printable ASCII, capped."""
    assert "na?ve?" == notify.ascii_status("naïve\n")
    assert 200 == len(notify.ascii_status("x" * 500))


def test_native_journal_sending_does_not_also_print() -> None:
    """With the journal module, an event goes to the journal only, not a second time to stderr."""
    sent: list[dict[str, str]] = []
    out = io.StringIO()
    _log.JournalLogger(file=out, send=lambda **f: sent.append(f)).msg("<6>x", {"MESSAGE": "x"})
    assert ("", [{"MESSAGE": "x"}]) == (out.getvalue(), sent)


def test_status_json_is_json(tmp_path: Path) -> None:
    """What write_status writes reads back as the same object."""
    status.write_status(_settings(tmp_path), {"pid": 1, "slots": {"a.toml": {"name": "a"}}})
    assert {"pid": 1, "slots": {"a.toml": {"name": "a"}}} == json.loads(
        (tmp_path / "status.json").read_text()
    )
