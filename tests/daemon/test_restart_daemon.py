"""The whole daemon applying relabels carefully: a busy slot is restarted only once its counters
drop, a booting hal0-api stops nothing, the operator's hands_off and hal0's Vulkan opt-in keep
the reconciler off a slot. Real daemon thread, real files, real HTTP on loopback."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import status
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until
from helpers.hal0_api_server import Hal0Api

pytestmark = pytest.mark.timeout(90)

UNIT = "hal0-slot@agent.service"


def _status(host: Host, settings: Any) -> dict[str, Any]:
    path = status.status_path(settings)
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_busy_slot_is_restarted_only_after_its_counters_drop(host: Host, notify_socket) -> None:
    """The relabel is written at once; the restart waits while hal0 counts requests (status
    says why), and happens once the slot is idle."""
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        api.slot("agent", processing=2)
        settings = host.settings(api_url=api.url)
        with running(settings):
            notify_socket.wait_for("READY=1")
            target = drop_slot(host.slots, "agent")
            wait_until(lambda: device_of(target) == "gpu-rocm", what="the relabel")
            waiting = wait_until(
                lambda: (_status(host, settings).get("restarts") or {}).get("waiting"),
                timeout=20,
                what="status naming the wait",
            )
            assert "busy (state ready, 2 processing, 0 deferred)" == waiting["agent"]
            threading.Event().wait(0.5)
            assert [] == api.requests, "restarted while busy"
            api.slot("agent", processing=0)
            wait_until(lambda: api.requests, what="the restart once idle")
        assert [("POST", "/api/slots/agent/restart", None)] == api.requests


def test_a_booting_hal0_api_stops_nothing_and_the_restart_follows(
    host: Host, notify_socket
) -> None:
    """hal0-api refuses connections for its boot (active for systemd): nothing is stopped even
    with the stop fallback, and the slot is restarted once hal0 answers."""
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api(boot_for=3) as api:
        settings = host.settings(api_url=api.url, restart_fallback="stop")
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            drop_slot(host.slots, "agent")
            wait_until(lambda: api.requests, timeout=30, what="the restart after the boot")
        assert [] == host.systemctl.actions()
        assert any(e["event"] == "unit.api_waiting" for e in logs)
        assert not [
            e for e in logs if e["event"] in {"unit.restart_failed", "unit.stopped_needs_reload"}
        ]


def test_hands_off_keeps_the_reconciler_off_a_slot(host: Host, notify_socket) -> None:
    """A slot named in hands_off: not relabelled, not restarted, shown as hands-off with the
    reason operator; a slot beside it is relabelled as usual."""
    host.systemctl.set_states({UNIT: "active", "hal0-slot@coder.service": "active"})
    with Hal0Api() as api:
        settings = settings_mod.load(
            None, {**host.overrides(api_url=api.url), "hands_off": ["agent"]}
        )
        with running(settings):
            notify_socket.wait_for("READY=1")
            kept = drop_slot(host.slots, "agent")
            other = drop_slot(host.slots, "coder", port=8082)
            wait_until(lambda: device_of(other) == "gpu-rocm", what="coder's relabel")
            wait_until(lambda: api.requests, what="coder's restart")
            entry = wait_until(
                lambda: (_status(host, settings).get("slots") or {}).get("agent.toml"),
                what="agent in status",
            )
        assert "gpu-vulkan" == device_of(kept)
        assert ("hands-off", True) == (entry["status"], entry["message"].startswith("operator"))
        assert ["/api/slots/coder/restart"] == [p for _, p, _ in api.requests]


def test_the_vulkan_opt_in_pauses_vulkan_relabels_loudly_once(host: Host, notify_socket) -> None:
    """HAL0_ALLOW_VULKAN_FALLBACK=true in api.env (as hal0 reads it): gpu-vulkan slots keep
    their label; one warning names the variable and says hal0's boot pass ignores it."""
    env = host.root / "etc/hal0/api.env"
    env.parent.mkdir(parents=True, exist_ok=True)
    env.write_text("HAL0_ALLOW_VULKAN_FALLBACK= true \n")
    with running(host.settings()), capture_logs() as logs:
        notify_socket.wait_for("READY=1")
        first = drop_slot(host.slots, "agent")
        second = drop_slot(host.slots, "coder", port=8082)
        wait_until(
            lambda: any(e["event"] == "slot.vulkan_relabels_paused" for e in logs), what="warning"
        )
        threading.Event().wait(0.5)
    assert ("gpu-vulkan", "gpu-vulkan") == (device_of(first), device_of(second))
    (warning,) = [e for e in logs if e["event"] == "slot.vulkan_relabels_paused"]
    assert ("warning", "HAL0_ALLOW_VULKAN_FALLBACK") == (warning["log_level"], warning["variable"])
    assert "boot pass ignores" in warning["detail"]


@pytest.mark.parametrize("value", ["TRUE", "on", "1 # no", "2"])
def test_only_hals_own_true_values_pause_relabels(host: Host, notify_socket, value: str) -> None:
    """hal0 accepts exactly 1, true, yes after strip: anything else relabels as usual."""
    env = host.root / "etc/hal0/api.env"
    env.parent.mkdir(parents=True, exist_ok=True)
    env.write_text(f"HAL0_ALLOW_VULKAN_FALLBACK='{value}'\n")
    with running(host.settings()):
        notify_socket.wait_for("READY=1")
        target = drop_slot(host.slots, "agent")
        wait_until(lambda: device_of(target) == "gpu-rocm", what="the relabel")
