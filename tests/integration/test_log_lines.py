"""Every event is one whole line on stderr, whichever thread and logging API wrote it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[2] / "src"

# A library thread (watchdog logs through stdlib logging) and the daemon's own events, at once,
# with the interpreter switching threads as often as it can.
WRITERS = """
import logging, sys, threading
from hal0_reconciler import _log
from hal0_reconciler.settings import LogFormat

sys.setswitchinterval(1e-6)
_log.configure(LogFormat.JSON, "info")
events = _log.get_logger()
events.info("daemon.starting")  # structlog is loaded and configured from here on

def library() -> None:
    for i in range(2000):
        logging.getLogger("watchdog.observers.inotify_buffer").warning("queue overflow %d", i)

thread = threading.Thread(target=library)
thread.start()
for i in range(2000):
    events.info("slot.relabeled", slot=f"s{i}", n=i)
thread.join()
"""


def test_a_library_warning_and_an_event_logged_at_once_stay_two_lines(tmp_path: Path) -> None:
    """Lines from stdlib logging and structlog never share a line (journald splits on newlines:
    a merged line is one journal entry at one priority, and a JSON reader drops both)."""
    for run in range(3):  # one run of the old code merged lines two times in three
        lines = _stderr_lines(tmp_path / f"stderr{run}")
        broken = [line for line in lines if not _is_json(line)]
        assert not broken, f"{len(broken)} of {len(lines)} lines are torn or merged: {broken[:2]}"
        assert 4001 == len(lines), f"{len(lines)} lines for 4001 events"


def _stderr_lines(err: Path) -> list[str]:
    with err.open("w") as sink:
        subprocess.run(
            [sys.executable, "-c", WRITERS],
            stderr=sink,
            check=True,
            timeout=15,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
    return err.read_text().splitlines()


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
