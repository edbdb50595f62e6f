"""status.json and its report, the Prometheus textfile, and journal-friendly log lines."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import structlog

from hal0_reconciler import _log
from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import metrics, status
from hal0_reconciler.settings import LogFormat


def _settings(tmp_path: Path) -> settings_mod.Settings:
    return settings_mod.load(None, {"runtime_dir": str(tmp_path)})


def _snapshot(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "pid": os.getpid(),
        "pid_start": status.process_start_time(os.getpid()),
        "updated_at": 1000.0,
        "heartbeat": 30.0,
        "healthy": True,
        "ready": True,
        "last_pass": {"at": 990.0, "slots": 1, "duration": 0.01},
        "slots": {"agent": {"status": "unchanged", "device": "gpu-rocm", "reason": "x"}},
    }
    base.update(extra)
    return base


def test_no_status_file_means_not_running(tmp_path: Path) -> None:
    """Without status.json the report says not running and exits 3."""
    text, code = status.report(_settings(tmp_path))
    assert (status.EXIT_NOT_RUNNING, True) == (code, "not running" in text)


def test_a_live_healthy_writer_reports_ok(tmp_path: Path) -> None:
    """A fresh file from a live pid that is healthy: exit 0, slot listed."""
    status.write_status(_settings(tmp_path), _snapshot())
    text, code = status.report(_settings(tmp_path), now=1005.0)
    assert status.EXIT_OK == code
    assert "agent" in text
    assert [] == [p.name for p in tmp_path.iterdir() if p.name != status.FILE_NAME]


def test_a_gone_pid_is_not_running(tmp_path: Path) -> None:
    """A status file whose pid is dead is stale: exit 3."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    status.write_status(_settings(tmp_path), _snapshot(pid=int(child.stdout), pid_start=1.0))
    assert status.EXIT_NOT_RUNNING == status.report(_settings(tmp_path), now=1005.0)[1]


def test_unhealthy_or_silent_daemons_exit_1(tmp_path: Path) -> None:
    """healthy=false, or no update for three heartbeats: exit 1."""
    s = _settings(tmp_path)
    status.write_status(s, _snapshot(healthy=False, problems=["stuck"]))
    text, code = status.report(s, now=1005.0)
    assert (status.EXIT_UNHEALTHY, True) == (code, "stuck" in text)
    status.write_status(s, _snapshot())
    assert status.EXIT_UNHEALTHY == status.report(s, now=1000.0 + 91)[1]


def test_metrics_textfile_is_prometheus_text(tmp_path: Path) -> None:
    """Every sample follows its HELP and TYPE lines; counters end in _total; file is atomic."""
    m = metrics.Metrics(passes=3, relabels={"gpu-rocm": 2, "cpu": 1}, restarts={"restarted": 1})
    target = tmp_path / "hal0_reconciler.prom"
    metrics.write_textfile(target, m)
    lines = target.read_text().splitlines()
    sample = re.compile(r'^hal0_reconciler_[a-z_]+(\{[a-z]+="[^"]*"\})? -?[0-9.]+$')
    declared: dict[str, str] = {}
    assert metrics.HEADER == lines[0]  # the daemon's own file: what the postrm looks for
    for line in lines[1:]:
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            declared[name] = kind
        elif not line.startswith("# HELP "):
            assert sample.match(line), line
            assert line.split("{")[0].split()[0] in declared
    assert all(n.endswith("_total") == (k == "counter") for n, k in declared.items())
    assert 'hal0_reconciler_relabels_total{target="cpu"} 1' in lines
    assert "hal0_reconciler_rocm_lane_usable 0" in lines
    assert [target] == list(tmp_path.iterdir())


def test_journal_lines_carry_the_priority_and_stay_on_one_line() -> None:
    """A warning is <4>; an exception's traceback is escaped onto the same line."""

    def boom() -> None:
        raise ValueError("boom")

    try:
        boom()
    except ValueError:
        exc_info = sys.exc_info()
    rendered = structlog.processors.format_exc_info(
        None, "error", {"event": "x.failed", "exc_info": exc_info}
    )
    line = _log.journal_line("error", {"level": "error", **rendered})
    assert line.startswith("<3>x.failed exception=")
    assert "\n" not in line
    assert "<4>slot.demoted_to_cpu slot=agent" == _log.journal_line(
        "warning", {"event": "slot.demoted_to_cpu", "slot": "agent", "level": "warning"}
    )


def test_native_journal_fields_name_the_event_and_slot() -> None:
    """With systemd.journal available the event goes out as fields (EVENT=, SLOT=, PRIORITY=)."""
    sent: list[dict[str, str]] = []
    sink = _log.JournalLogger(file=io.StringIO(), send=lambda **f: sent.append(f))
    event = {"event": "slot.relabeled", "slot": "agent", "old": "gpu-vulkan", "level": "info"}
    line = _log.journal_line("info", event)
    sink.msg(line, fields=_log.native_fields(line, event))
    assert 1 == len(sent)
    assert ("slot.relabeled", "agent", "6") == (
        sent[0]["EVENT"],
        sent[0]["SLOT"],
        sent[0]["PRIORITY"],
    )


def test_journal_format_is_chosen_when_journal_stream_is_stderr(tmp_path: Path) -> None:
    """JOURNAL_STREAM naming stderr selects the journal format; its lines carry <N>."""
    code = (
        "import os,sys,structlog;"
        "st=os.fstat(2);os.environ['JOURNAL_STREAM']=f'{st.st_dev}:{st.st_ino}';"
        "from hal0_reconciler import _log;from hal0_reconciler.settings import LogFormat;"
        "print(_log.configure(LogFormat.AUTO,'info'));"
        "structlog.get_logger().warning('daemon.problem', problem='x')"
    )
    err = tmp_path / "err"
    with err.open("w") as fh:
        out = subprocess.run(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=fh,
            check=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
        )
    assert LogFormat.JOURNAL.value == out.stdout.decode().strip()
    if importlib.util.find_spec("systemd") is None:  # else the event went to the journal natively
        assert "<4>daemon.problem problem=x" == err.read_text().splitlines()[0]


def test_configure_twice_replaces_only_its_own_handler() -> None:
    """A second configure() (SIGHUP) leaves one handler of its own and keeps others' handlers."""
    import logging

    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    saved_config = structlog.get_config()
    foreign = logging.NullHandler()
    root.addHandler(foreign)
    try:
        _log.configure(LogFormat.JSON, "info")
        _log.configure(LogFormat.CONSOLE, "debug")
        ours = [h for h in root.handlers if isinstance(h, _log._OurHandler)]
        assert (1, True) == (len(ours), foreign in root.handlers)
        assert isinstance(ours[0].formatter, logging.Formatter)
        assert not isinstance(ours[0].formatter, _log._StdlibJsonFormatter)
    finally:
        for handler in list(root.handlers):
            if handler not in saved_handlers:
                root.removeHandler(handler)
        root.setLevel(saved_level)
        structlog.configure(**saved_config)


def test_the_report_shows_the_aiter_self_heal(tmp_path: Path) -> None:
    """Verdict counts, a pending heal and the modules that do not converge are reported."""
    summary: dict[str, object] = {
        "verdicts": {"covered": 2, "uncovered": 1},
        "heal_pending": True,
        "heals": 1,
    }
    summary["not_converging"] = ["base:module_x"]
    status.write_status(_settings(tmp_path), _snapshot(aiter=summary))
    text, _ = status.report(_settings(tmp_path), now=1005.0)
    assert [
        "  aiter:      2 covered, 1 uncovered; heal pending; 1 healed",
        "  aiter not converging: base:module_x",
    ] == [line for line in text.splitlines() if "aiter" in line]
