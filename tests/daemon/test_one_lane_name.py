"""One name for each lane state: what status.json (and so `status --json`) says is what the
metrics say, `not-amd` off an AMD host."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hal0_reconciler.daemon import status
from helpers.daemon_host import Host, running, wait_until


def lane_of(settings: Any) -> dict[str, Any] | None:
    try:
        snap = json.loads(status.status_path(settings).read_text())
    except (OSError, ValueError):
        return None
    lane = snap.get("lane")
    return lane if isinstance(lane, dict) and snap.get("ready") else None


def metric_lane(path: Path) -> set[str]:
    text = path.read_text() if path.exists() else ""
    return set(re.findall(r'^hal0_reconciler_rocm_lane\{state="([^"]+)"\} 1$', text, re.MULTILINE))


def test_off_an_amd_host_status_and_metrics_both_say_not_amd(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """No amdgpu module: status.json's lane state is "not-amd", exactly the metric's state, and
    its reason says why; the status file's schema is 2."""
    metrics_file = tmp_path / "m.prom"
    settings = host.settings(
        amdgpu_module_dir=str(tmp_path / "no-amdgpu"), metrics_textfile=str(metrics_file)
    )
    with running(settings):
        notify_socket.wait_for("READY=1")
        lane = wait_until(lambda: lane_of(settings), what="a lane in status.json")
        wait_until(lambda: metric_lane(metrics_file), what="the lane metric")
        snap = json.loads(status.status_path(settings).read_text())
    assert ("not-amd", False, "not an AMD host") == (lane["state"], lane["amd"], lane["reason"])
    assert {"not-amd"} == metric_lane(metrics_file)
    assert 3 == snap["schema"]


def test_on_an_amd_host_the_lane_state_is_the_metrics_one(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """A usable lane: "usable" in both."""
    metrics_file = tmp_path / "m.prom"
    settings = host.settings(metrics_textfile=str(metrics_file))
    with running(settings):
        notify_socket.wait_for("READY=1")
        lane = wait_until(lambda: lane_of(settings), what="a lane in status.json")
        wait_until(lambda: metric_lane(metrics_file), what="the lane metric")
    assert {lane["state"]} == metric_lane(metrics_file) == {"usable"}
