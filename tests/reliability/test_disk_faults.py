"""Disk faults: a full file system (a tiny tmpfs) and a read-only slots folder, each mounted in
a private mount namespace (``unshare -m``) that takes the mount with it when it ends.

Old files stay intact, ``once`` says so in one line and exits 1, the daemon is unhealthy while
the fault lasts (and healthy again, with the slots relabelled, once it is gone)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.daemon_host import Host
from reliability import support

CHILD = Path(__file__).with_name("namespace_child.py")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a private mount namespace",
)


def _in_namespace(host: Host, fault: str, tmp_path: Path) -> dict[str, object]:
    seed = tmp_path / "seed"
    seed.mkdir()
    support.write_vulkan_slots(seed, 20)
    argv = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        sys.executable,
        str(CHILD),
        fault,
        str(host.slots),
        str(seed),
        str(host.root / "run/hal0-reconciler"),
        json.dumps(support.cli_argv(host, "once")),
        json.dumps(support.cli_argv(host, "run")),
    ]
    done = subprocess.run(
        argv, env=support.cli_env(), capture_output=True, text=True, timeout=150, check=False
    )
    assert 0 == done.returncode, done.stderr
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    once = report["once"]
    assert isinstance(once, dict)
    support.FIGURES["crashes"] += support.tracebacks(str(once["stderr"]))
    return report


@pytest.mark.timeout(200)
def test_a_full_file_system(host: Host, tmp_path: Path) -> None:
    report = _in_namespace(host, "enospc", tmp_path)
    once = report["once"]
    assert isinstance(once, dict)
    assert 1 == once["code"]
    assert "No space left on device" in str(once["stderr"])
    assert 0 == support.tracebacks(str(once["stderr"]))
    assert (True, []) == (report["once_intact"], report["once_temps"])
    assert report["daemon_intact"]
    assert any("slot writes fail" in p for p in report["daemon_unhealthy"] or [])
    assert (True, 20) == (report["daemon_healthy_again"], report["relabelled_after"])
    assert ([], 0) == (report["daemon_temps"], report["daemon_code"])


@pytest.mark.timeout(200)
def test_a_read_only_slots_folder(host: Host, tmp_path: Path) -> None:
    report = _in_namespace(host, "readonly", tmp_path)
    once = report["once"]
    assert isinstance(once, dict)
    assert 1 == once["code"]
    assert "Read-only file system" in str(once["stderr"])
    assert 0 == support.tracebacks(str(once["stderr"]))
    assert (True, True) == (report["once_intact"], report["daemon_intact"])
    assert any("slot writes fail" in p for p in report["daemon_unhealthy"] or [])
    assert ([], 0) == (report["daemon_temps"], report["daemon_code"])
