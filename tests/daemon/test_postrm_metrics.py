"""The package's postrm removes the metrics textfile the daemon wrote (its path recorded in the
state folder) on remove and purge: only while its first line is the daemon's header, never
through a link, never on an upgrade. Run with /bin/sh on a copy whose record path is a temp
folder's (the only change); the real-systemd suite runs it as dpkg does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hal0_reconciler.daemon import metrics, metricsfile
from helpers.hosts import REPO

POSTRM = REPO / "packaging/debian/hal0-reconciler.postrm"
RECORD = "/var/lib/hal0-reconciler/metrics-path"


def _postrm(tmp_path: Path, action: str) -> None:
    state = tmp_path / "state"
    script = tmp_path / "postrm"
    text = POSTRM.read_text()
    assert text.count(RECORD) == 1
    # the metrics part only: purge's own removals (the real state folder) are not run here
    metrics_part = text.split("# Purge removes")[0]
    script.write_text(metrics_part.replace(RECORD, str(state / metricsfile.RECORD)) + "exit 0\n")
    subprocess.run(["/bin/sh", str(script), action], check=True, timeout=30)


def _daemon_wrote(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "textfiles/hal0_reconciler.prom"
    target.parent.mkdir()
    assert (
        metricsfile.MetricsFile(state, under_unit=False).write(
            target, metrics.render(metrics.Metrics())
        )
        is None
    )
    return target


def test_the_postrm_knows_the_daemons_header() -> None:
    assert f'= "{metrics.HEADER}" ]' in POSTRM.read_text()


@pytest.mark.parametrize("action", ["remove", "purge"])
def test_remove_and_purge_take_the_daemons_file_away(tmp_path: Path, action: str) -> None:
    target = _daemon_wrote(tmp_path)
    _postrm(tmp_path, action)
    assert not target.exists()


@pytest.mark.parametrize("action", ["upgrade", "failed-upgrade", "abort-install"])
def test_other_actions_leave_it(tmp_path: Path, action: str) -> None:
    target = _daemon_wrote(tmp_path)
    _postrm(tmp_path, action)
    assert target.exists()


def test_another_file_at_that_path_stays(tmp_path: Path) -> None:
    target = _daemon_wrote(tmp_path)
    target.write_text("# HELP node_other Someone else's.\nnode_other 1\n")
    _postrm(tmp_path, "purge")
    assert target.exists()


def test_a_link_is_never_followed(tmp_path: Path) -> None:
    """The recorded path now a symlink to the daemon's file elsewhere, or under a linked
    folder: both stay."""
    target = _daemon_wrote(tmp_path)
    elsewhere = tmp_path / "elsewhere.prom"
    os.rename(target, elsewhere)
    target.symlink_to(elsewhere)
    _postrm(tmp_path, "purge")
    assert (True, True) == (target.is_symlink(), elsewhere.exists())
    real = tmp_path / "real"
    real.mkdir()
    os.rename(elsewhere, real / target.name)
    target.unlink()
    target.parent.rmdir()
    target.parent.symlink_to(real)
    _postrm(tmp_path, "purge")
    assert (real / target.name).exists()


def test_no_record_or_a_broken_one_is_no_error(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    _postrm(tmp_path, "purge")  # no record: nothing to do, exit 0
    (tmp_path / "state" / metricsfile.RECORD).write_text("relative/path.prom\n")
    _postrm(tmp_path, "purge")
