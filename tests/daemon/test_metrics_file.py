"""The metrics textfile as a file on the host: a missing folder said as such (never made with
its parents), picked up when it appears (outside the unit at the next try, under the unit by
asking systemd for a fresh sandbox), the path written recorded in the state folder, the daemon's
own file removed when the setting is turned off or moved (and only its own), and a clean stop
leaving ``hal0_reconciler_running 0``."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import metrics, metricsfile
from helpers.daemon_host import Host, running, wait_until

TEXT = metrics.render(metrics.Metrics())
MISSING = "does not exist: install prometheus-node-exporter or create it"


def test_a_folder_whose_parent_is_missing_is_said_missing_and_never_made(tmp_path: Path) -> None:
    target = tmp_path / "prometheus/node-exporter/hal0_reconciler.prom"
    file = metricsfile.MetricsFile(tmp_path / "state", under_unit=False)
    problem = file.write(target, TEXT)
    assert f"cannot write metrics to {target}: the folder {target.parent} {MISSING}" == problem
    assert not (tmp_path / "prometheus").exists(), "a parent of the folder was made"
    assert file.due(target)


def test_outside_the_unit_a_folder_made_later_is_written_at_the_next_try(tmp_path: Path) -> None:
    target = tmp_path / "prometheus/node-exporter/hal0_reconciler.prom"
    state = tmp_path / "state"
    state.mkdir()
    file = metricsfile.MetricsFile(state, under_unit=False)
    assert file.write(target, TEXT) is not None
    target.parent.mkdir(parents=True)
    assert file.write(target, TEXT) is None
    assert (False, None) == (file.due(target), file.restart_for)
    assert TEXT == target.read_text()
    assert f"{target}\n" == (state / metricsfile.RECORD).read_text(), "the path is not recorded"
    assert metricsfile.is_own(target)


def _read_only_folder(folder: Path) -> Any:
    """The write as the unit's sandbox makes it for a folder that did not exist at the start."""
    real = metricsfile.fsio.write_atomically

    def write(path: Path, data: bytes, **kw: Any) -> None:
        if path.parent == folder:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real(path, data, **kw)

    return mock.patch.object(metricsfile.fsio, "write_atomically", write)


def test_under_the_unit_a_folder_made_after_the_start_asks_for_a_fresh_sandbox(
    tmp_path: Path,
) -> None:
    """Found missing, then there but read-only (the sandbox skipped its ReadWritePaths= entry):
    the daemon asks for exit 75 (restart_for); never said as "Read-only file system"."""
    target = tmp_path / "prometheus/node-exporter/hal0_reconciler.prom"
    file = metricsfile.MetricsFile(tmp_path / "state", under_unit=True)
    assert MISSING in (file.write(target, TEXT) or "")
    assert file.restart_for is None
    target.parent.mkdir(parents=True)
    with _read_only_folder(target.parent):
        problem = file.write(target, TEXT)
    assert f"cannot write metrics to {target}: {target.parent} is read-only until a restart" == (
        problem
    )
    assert (
        f"the metrics folder {target.parent} was created after the start; restarting so the "
        "service's sandbox includes it"
    ) == file.restart_for


def test_under_the_unit_a_folder_there_from_the_start_but_read_only_names_the_fix(
    tmp_path: Path,
) -> None:
    """A folder outside the unit's ReadWritePaths=: no restart (it would not help), the line
    says which setting to add."""
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    target.parent.mkdir()
    file = metricsfile.MetricsFile(tmp_path / "state", under_unit=True)
    with _read_only_folder(target.parent):
        problem = file.write(target, TEXT)
    assert file.restart_for is None
    assert (
        f"cannot write metrics to {target}: {target.parent} is read-only in the service's "
        f"sandbox: add ReadWritePaths={target.parent} (systemctl edit hal0-reconciler)"
    ) == problem


@pytest.mark.parametrize("kind", ["other-file", "symlink", "fifo"])
def test_only_the_daemons_own_file_is_removed(tmp_path: Path, kind: str) -> None:
    """Turning the setting off removes the file the daemon wrote; at that path another file,
    a link to the daemon's file or a FIFO is left alone (never opened through, never blocked)."""
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    target.parent.mkdir()
    file = metricsfile.MetricsFile(state, under_unit=False)
    assert file.write(target, TEXT) is None
    if kind == "other-file":
        target.write_text("# HELP someone_else A metric.\nsomeone_else 1\n")
    elif kind == "symlink":
        own = tmp_path / "own.prom"
        own.write_text(TEXT)
        target.unlink()
        target.symlink_to(own)
    else:
        target.unlink()
        os.mkfifo(target)
    before = target.lstat()
    with capture_logs() as logs:
        file.settle(None)
    assert (before.st_ino, before.st_mode) == (target.lstat().st_ino, target.lstat().st_mode)
    assert [] == [e for e in logs if e["event"] == "daemon.metrics_removed"]
    assert (state / metricsfile.RECORD).exists(), "the record of a file still there was dropped"


def test_turning_metrics_off_or_moving_them_removes_the_old_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    first, second = tmp_path / "a/h.prom", tmp_path / "b/h.prom"
    first.parent.mkdir()
    second.parent.mkdir()
    file = metricsfile.MetricsFile(state, under_unit=False)
    assert file.write(first, TEXT) is None
    with capture_logs() as logs:
        file.settle(second)
    assert not first.exists()
    assert [("daemon.metrics_removed", str(first))] == [
        (e["event"], e["path"]) for e in logs if e["event"] == "daemon.metrics_removed"
    ]
    assert not (state / metricsfile.RECORD).exists()
    assert file.write(second, TEXT) is None
    file.settle(second)  # the configured one stays
    assert second.exists()
    file.settle(None)
    assert not second.exists()


def _value(path: Path, name: str) -> str | None:
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith(f"hal0_reconciler_{name} "):
            return line.split()[1]
    return None


def test_a_running_daemon_picks_up_a_folder_made_later_and_a_clean_stop_says_so(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """Degraded while the folder is missing (status names it); healthy with the file written
    once the folder is there, no pass needed; ``running 0`` in the file a clean stop leaves."""
    target = tmp_path / "prometheus/node-exporter/hal0_reconciler.prom"
    settings = host.settings(metrics_textfile=str(target))
    with running(settings):
        notify_socket.wait_for("READY=1")
        wait_until(lambda: _problems(settings), what="the missing folder in status.json")
        assert any(MISSING in p for p in _problems(settings))
        target.parent.mkdir(parents=True)
        wait_until(lambda: _value(target, "running") == "1", timeout=20, what="the textfile")
        wait_until(lambda: not _problems(settings), timeout=20, what="healthy again")
    assert "0" == _value(target, "running")
    assert f"{target}\n" == (Path(settings.state_dir) / metricsfile.RECORD).read_text()


def test_a_reload_that_turns_metrics_off_removes_the_file(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    target.parent.mkdir()
    config = tmp_path / "reconciler.toml"
    config.write_text(f'metrics_textfile = "{target}"\n')
    overrides = host.overrides()
    overrides.pop("metrics_textfile", None)
    first = settings_mod.load(config, overrides)
    with running(first, config_path=config, overrides=overrides) as daemon:
        notify_socket.wait_for("READY=1")
        wait_until(lambda: _value(target, "running") == "1", timeout=20, what="the textfile")
        config.write_text("")
        daemon.request_reload()
        wait_until(lambda: not target.exists(), timeout=20, what="the textfile removed")
    assert not target.exists(), "a stop wrote a textfile the settings no longer name"


def _problems(settings: Any) -> list[str]:
    import json

    from hal0_reconciler.daemon import status

    try:
        snap = json.loads(status.status_path(settings).read_text())
    except (OSError, ValueError):
        return []
    return list(snap.get("problems") or [])


def test_a_write_begun_before_the_reload_does_not_bring_a_removed_file_back(
    tmp_path: Path,
) -> None:
    """A pass that read the old settings finishes after the reload turned metrics off: its
    write is dropped, the file stays removed (and a moved file is written at the new path only)."""
    state = tmp_path / "state"
    state.mkdir()
    old, new = tmp_path / "a/h.prom", tmp_path / "b/h.prom"
    old.parent.mkdir()
    new.parent.mkdir()
    file = metricsfile.MetricsFile(state, under_unit=False)
    file.settle(old)
    assert file.write(old, TEXT) is None
    file.settle(None)
    assert file.write(old, TEXT) is None
    assert not old.exists()
    file.settle(new)
    assert file.write(old, TEXT) is None
    assert (False, True) == (old.exists(), file.write(new, TEXT) is None and new.exists())


def test_the_file_and_its_record_are_0644_whatever_the_umask(tmp_path: Path) -> None:
    """node_exporter reads the textfile, the postrm the record (the unit's UMask is 0077)."""
    import stat

    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    old = os.umask(0o077)
    try:
        assert metricsfile.MetricsFile(state, under_unit=False).write(target, TEXT) is None
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (target, state / metricsfile.RECORD)}
    assert {0o644} == modes
    assert 0o755 == stat.S_IMODE(target.parent.stat().st_mode)


def _failing_with(code: int) -> Any:
    def write(path: Path, data: bytes, **kw: Any) -> None:
        raise OSError(code, os.strerror(code), str(path))

    return mock.patch.object(metricsfile.fsio, "write_atomically", write)


@pytest.mark.parametrize(
    ("code", "under_unit"), [(errno.EACCES, True), (errno.EROFS, False), (errno.ENOSPC, False)]
)
def test_other_failures_are_said_as_the_system_says_them(
    tmp_path: Path, code: int, under_unit: bool
) -> None:
    """Not the sandbox's read-only view: the system's own words, and no restart asked."""
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    target.parent.mkdir()
    file = metricsfile.MetricsFile(tmp_path / "state", under_unit=under_unit)
    with _failing_with(code):
        problem = file.write(target, TEXT)
    assert (f"cannot write metrics to {target}: {os.strerror(code)}", None) == (
        problem,
        file.restart_for,
    )
    assert file.due(target)


def test_a_file_that_can_no_longer_be_written_is_due_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    file = metricsfile.MetricsFile(state, under_unit=False)
    assert (None, False) == (file.write(target, TEXT), file.due(target))
    with _failing_with(errno.ENOSPC):
        assert file.write(target, TEXT) is not None
    assert file.due(target)
    assert (None, False) == (file.write(target, TEXT), file.due(target))
    target.unlink()
    target.parent.rmdir()
    (tmp_path / "textfiles").write_text("")  # the folder is now a file: cannot be made
    assert f"{target.parent} is not a folder" in (file.write(target, TEXT) or "")
    assert file.due(target)


def test_a_folder_that_cannot_be_made_is_said_missing(tmp_path: Path) -> None:
    """Its parent is there but read-only (the sandbox, for a folder missing at the start)."""
    target = tmp_path / "prometheus/node-exporter/hal0_reconciler.prom"
    target.parent.parent.mkdir()
    file = metricsfile.MetricsFile(tmp_path / "state", under_unit=True)

    def refuse(self: Path, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    with mock.patch.object(Path, "mkdir", refuse):
        problem = file.write(target, TEXT)
    assert f"the folder {target.parent} {MISSING}" in (problem or "")
    assert not target.parent.exists()


def test_a_folder_written_since_it_was_missing_asks_no_restart_later(tmp_path: Path) -> None:
    """Missing, then written (the sandbox included it after all), then read-only: that is a
    ReadWritePaths= matter, not a new folder: no restart asked."""
    target = tmp_path / "prometheus/node-exporter/hal0_reconciler.prom"
    state = tmp_path / "state"
    state.mkdir()
    file = metricsfile.MetricsFile(state, under_unit=True)
    assert file.write(target, TEXT) is not None
    target.parent.mkdir(parents=True)
    assert file.write(target, TEXT) is None
    with _read_only_folder(target.parent):
        problem = file.write(target, TEXT)
    assert file.restart_for is None
    assert "add ReadWritePaths=" in (problem or "")


@pytest.mark.parametrize("failing", ["read", "unlink"])
def test_a_file_that_cannot_be_read_or_removed_is_not_said_removed(
    tmp_path: Path, failing: str
) -> None:
    """A header that cannot be read is not the daemon's; a removal that fails is not said."""
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    file = metricsfile.MetricsFile(state, under_unit=False)
    assert file.write(target, TEXT) is None

    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    where = (os, "read") if failing == "read" else (Path, "unlink")
    with capture_logs() as logs, mock.patch.object(*where, fail):
        file.settle(None)
    assert target.exists()
    assert [] == [e for e in logs if e["event"] == "daemon.metrics_removed"]
    assert (state / metricsfile.RECORD).exists()


def test_looking_at_a_file_leaves_no_descriptor_open(tmp_path: Path) -> None:
    target = tmp_path / "h.prom"
    target.write_text(TEXT)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        assert metricsfile.is_own(target)
    assert before == len(os.listdir("/proc/self/fd"))


def test_a_start_after_metrics_were_turned_off_removes_the_last_file(tmp_path: Path) -> None:
    """The setting removed while the daemon was stopped: the next start reads the record the
    last run left and removes that file (its own); a relative line in a record is ignored."""
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    assert metricsfile.MetricsFile(state, under_unit=False).write(target, TEXT) is None
    metricsfile.MetricsFile(state, under_unit=False).settle(target)  # still configured: kept
    assert target.exists()
    metricsfile.MetricsFile(state, under_unit=False).settle(None)
    assert not target.exists()
    assert not (state / metricsfile.RECORD).exists()
    assert metricsfile.MetricsFile(state, under_unit=False).write(target, TEXT) is None
    (state / metricsfile.RECORD).write_text(f"{target.relative_to(tmp_path)}\n{target}\n")
    metricsfile.MetricsFile(state, under_unit=False).settle(None)
    assert target.exists(), "a record whose first line is not a whole path was followed"


def test_a_reload_to_another_state_folder_reads_that_folders_record(tmp_path: Path) -> None:
    first, second = tmp_path / "s1", tmp_path / "s2"
    first.mkdir()
    second.mkdir()
    old = tmp_path / "old/h.prom"
    assert metricsfile.MetricsFile(second, under_unit=False).write(old, TEXT) is None
    file = metricsfile.MetricsFile(first, under_unit=False)
    file.settle(None)  # nothing recorded in the first folder
    assert old.exists()
    file.settle(None, second)
    assert not old.exists()
