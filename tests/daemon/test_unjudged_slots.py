"""A slot file that cannot be judged (refused by path: not valid TOML, too large, not a regular
file) makes the daemon degraded: `status` exits 1 naming the file and why, ``STATUS=`` says so,
the unreadable_files gauge counts it, the watchdog goes on; fixed, it is healthy again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler.daemon import status
from helpers.daemon_host import Host, drop_slot, running, wait_until


def _status_lines(notify_socket: Any) -> list[str]:
    return [m for m in notify_socket.messages() if m.startswith("STATUS=")]


def _gauge(path: Path) -> str | None:
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        if line.startswith("hal0_reconciler_unreadable_files "):
            return line.split()[1]
    return None


@pytest.mark.parametrize("kind", ["not-toml", "too-large", "fifo"])
def test_a_slot_file_that_cannot_be_judged_makes_the_daemon_degraded(
    host: Host, notify_socket: Any, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")  # pinged every second while not unhealthy
    drop_slot(host.slots, "good")
    bad = host.slots / "broken.toml"
    if kind == "not-toml":
        bad.write_text('name = "broken"\ndevice = \n')
    elif kind == "too-large":
        bad.write_text('name = "big"\n' + "# padding\n" * 200_000)
    else:
        os.mkfifo(bad)
    prom = tmp_path / "m.prom"
    settings = host.settings(metrics_textfile=str(prom))
    with running(settings):
        notify_socket.wait_for("READY=1", timeout=30)
        text, _code = wait_until(
            lambda: (r := status.report(settings)) and r[1] == status.EXIT_UNHEALTHY and r,
            timeout=20,
            what="status exit 1",
        )
        wait_until(lambda: _gauge(prom) == "1", timeout=20, what="the gauge")
        said = wait_until(
            lambda: [s for s in _status_lines(notify_socket) if "DEGRADED" in s],
            what="STATUS= degraded",
        )
        assert f"DEGRADED: slot file {bad} cannot be judged: " in said[-1]
        assert f"problem: slot file {bad} cannot be judged: " in text
        assert "degraded" in text.splitlines()[0]
        pings = notify_socket.messages().count("WATCHDOG=1")
        notify_socket.wait_for("WATCHDOG=1", count=pings + 1, timeout=10)  # degraded: goes on
        bad.unlink()
        drop_slot(host.slots, "broken")  # fixed: a slot it can judge
        wait_until(
            lambda: status.report(settings)[1] == status.EXIT_OK, timeout=20, what="healthy again"
        )
        wait_until(lambda: _gauge(prom) == "0", timeout=20, what="the gauge back to 0")


def test_many_such_files_name_five_and_count_the_rest(host: Host, notify_socket: Any) -> None:
    for n in range(8):
        (host.slots / f"bad{n}.toml").write_text("= = =\n")
    settings = host.settings()
    with running(settings):
        notify_socket.wait_for("READY=1", timeout=30)
        text, _ = wait_until(
            lambda: (r := status.report(settings)) and "more slot files" in r[0] and r,
            timeout=20,
            what="the problems",
        )
    named = [line for line in text.splitlines() if "cannot be judged:" in line]
    assert [f"  problem: slot file {host.slots}/bad{n}.toml" for n in range(5)] == [
        line.split(" cannot be judged")[0] for line in named
    ]
    assert "  problem: 3 more slot files cannot be judged" in text.splitlines()
