"""A running slot whose container was started for another label than its file says: hal0's own
relabel and ours are applied once (idle, through hal0), anyone else's is reported "label not
applied", what cannot be told is said so. Real daemon, real rendered units in a temp tree, the
fake hal0 on loopback, the real Restarter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import reconcile
from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import labels, status
from helpers.daemon_host import Host, drop_slot, running, wait_until
from helpers.hal0_api_server import Hal0Api
from helpers.hal0_tree import (
    ERAS,
    RUNNERS_100_TEXT,
    install_texts,
    schema_text,
)
from helpers.hosts import REPO, ROCM_USABLE

pytestmark = pytest.mark.timeout(90)

VULKAN_IMAGE = "ghcr.io/hal0ai/hal0-vulkan:test"
ROCM_IMAGE = "ghcr.io/hal0ai/hal0-combined:0824"  # the 1.0.0-shaped tree's rocmfpx default
UNIT = "hal0-slot@agent.service"


def _catalog_era(host: Host) -> None:
    """A 1.0.0-shaped hal0 (vulkanfpx a runner of its own), whose two GPU lanes launch two
    images (the vulkanfpx runner's image set in hal0's environment)."""
    install_texts(
        host.hal0, schema=schema_text(ERAS["0824"]), runners=RUNNERS_100_TEXT, version="1.0.0"
    )
    _env(host, f"HAL0_TOOLBOX_IMAGE_VULKANFPX={VULKAN_IMAGE}\n")


def _env(host: Host, text: str) -> None:
    path = host.root / "etc/hal0/api.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _render(host: Host, token: str, *, image: str, gpu: bool) -> Path:
    """hal0's Quadlet unit for a slot, as its renderer writes it (GPU nodes or none)."""
    folder = host.root / "etc/containers/systemd"
    folder.mkdir(parents=True, exist_ok=True)
    devices = "AddDevice=/dev/kfd\nAddDevice=/dev/dri/renderD128\n" if gpu else ""
    path = folder / f"hal0-slot@{token}.container"
    path.write_text(
        f"[Unit]\nDescription=hal0 slot {token}\n\n[Container]\nImage={image}\n{devices}"
        f"ContainerName=hal0-slot-{token}\nPublishPort=127.0.0.1:8081:8081\n"
    )
    return path


def _settings(host: Host, api: Hal0Api, **extra: Any) -> settings_mod.Settings:
    return settings_mod.load(None, _overrides(host, api, **extra))


def _overrides(host: Host, api: Hal0Api, **extra: Any) -> dict[str, Any]:
    metrics = host.root / "metrics/hal0-reconciler.prom"
    values = host.overrides(api_url=api.url, resync_interval=0.5, metrics_textfile=metrics)
    return {**values, **extra}


def _status(settings: settings_mod.Settings) -> dict[str, Any]:
    path = status.status_path(settings)
    return json.loads(path.read_text()) if path.exists() else {}


def _shown(settings: settings_mod.Settings, name: str = "agent") -> dict[str, str] | None:
    return (_status(settings).get("labels_not_applied") or {}).get(name)


def _restarts(api: Hal0Api) -> list[tuple[str, str, object]]:
    return [r for r in api.requests if r[0] == "POST"]


def _resyncs(logs: list[dict[str, Any]]) -> int:
    return sum(e["event"] == "daemon.resync_started" for e in list(logs))


def _after_full_passes(logs: list[dict[str, Any]], count: int = 2) -> None:
    """Wait until ``count`` more full passes ran (each resync is one, checking the labels; the
    next one starting means the one before ended)."""
    start = _resyncs(logs)
    wait_until(lambda: _resyncs(logs) > start + count, timeout=20, what="full passes")


def test_hal0s_relabel_is_applied_once_even_across_a_daemon_restart(
    host: Host, notify_socket
) -> None:
    """Running gpu-vulkan, labelled gpu-rocm by hal0's boot pass: restarted through hal0 when
    idle; the restart fails and the unit stays as it was: not restarted again by later passes,
    nor by the next daemon."""
    _catalog_era(host)
    _render(host, "agent", image=VULKAN_IMAGE, gpu=True)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        api.slot("agent", outcome="error")
        settings = _settings(host, api)
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            wait_until(lambda: _restarts(api), what="the restart")
            shown = wait_until(
                lambda: (_shown(settings) or {}).get("state") == "tried" and _shown(settings),
                what="status saying the restart was tried",
            )
            _after_full_passes(logs)
        assert "gpu-vulkan" == shown["running"]
        assert "gpu-rocm" == shown["label"]
        with running(settings), capture_logs() as logs:
            _after_full_passes(logs)
            assert "tried" == (_shown(settings) or {}).get("state")
        assert [("POST", "/api/slots/agent/restart", None)] == _restarts(api)


def test_a_label_hal0_rendered_anew_is_applied_and_no_longer_shown(
    host: Host, notify_socket
) -> None:
    """Once hal0 re-rendered the unit for the new label, the slot is in sync: nothing shown,
    no further restart; the gauge is back to 0."""
    _catalog_era(host)
    unit = _render(host, "agent", image=VULKAN_IMAGE, gpu=True)
    drop_slot(host.slots, "agent", device="cpu")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api)
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            wait_until(lambda: _restarts(api), what="the restart")
            _render(host, "agent", image="ghcr.io/hal0ai/hal0-toolbox-cpu:v1", gpu=False)
            wait_until(lambda: _shown(settings) is None, what="the slot in sync")
            _after_full_passes(logs)
            gauge = _gauge(settings, "not-applied") + _gauge(settings, "tried")
        assert unit.exists()
        assert 0 == gauge
        assert 1 == len(_restarts(api))


def _gauge(settings: settings_mod.Settings, state: str, family: str = "labels_not_applied") -> int:
    assert settings.metrics_textfile is not None
    label = "reason" if family == "hands_off_slots" else "state"
    line = f'hal0_reconciler_{family}{{{label}="{state}"}} '
    for row in settings.metrics_textfile.read_text().splitlines():
        if row.startswith(line):
            return int(row.removeprefix(line))
    raise AssertionError(f"no {line!r} in the metrics")


def test_an_operators_edit_is_reported_not_applied_and_not_restarted(
    host: Host, notify_socket
) -> None:
    """Running cpu, labelled gpu-rocm by someone else: "label not applied" in status (JSON and
    text) and the gauge; no restart."""
    _render(host, "agent", image="ghcr.io/hal0ai/hal0-toolbox-cpu:v1", gpu=False)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api)
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            shown = wait_until(lambda: _shown(settings), what="label not applied")
            _after_full_passes(logs)
            gauge = _gauge(settings, "not-applied")
            text, _ = status.report(settings)
        assert "not-applied" == shown["state"]
        assert "cpu" == shown["running"]
        assert 1 == gauge
        assert "label not applied: agent: gpu-rocm, running cpu (not-applied" in text
        assert [] == _restarts(api)


def test_apply_others_labels_applies_an_operators_edit(host: Host, notify_socket) -> None:
    """With ``apply_others_labels = true`` the same edit is restarted through hal0."""
    _render(host, "agent", image="ghcr.io/hal0ai/hal0-toolbox-cpu:v1", gpu=False)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api, apply_others_labels="true")
        with running(settings), capture_logs():
            notify_socket.wait_for("READY=1")
            wait_until(lambda: _restarts(api), what="the restart")
        assert [("POST", "/api/slots/agent/restart", None)] == _restarts(api)


def test_one_image_for_both_gpu_lanes_cannot_be_told(host: Host, notify_socket) -> None:
    """A hal0 whose gpu-vulkan and gpu-rocm launch the same image: a GPU unit under a gpu-rocm
    label may run either lane; said so, nothing restarted."""
    _render(host, "agent", image="ghcr.io/hal0ai/hal0-rocmfpx:ade07ba", gpu=True)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api)
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            shown = wait_until(lambda: _shown(settings), what="cannot tell")
            _after_full_passes(logs)
        assert "cannot-tell" == shown["state"]
        assert [] == _restarts(api)


def test_the_vulkan_opt_in_keeps_hal0s_relabel_from_being_applied(
    host: Host, notify_socket
) -> None:
    """HAL0_ALLOW_VULKAN_FALLBACK set: a slot still running gpu-vulkan is not restarted."""
    _catalog_era(host)
    _env(
        host,
        f"HAL0_TOOLBOX_IMAGE_VULKANFPX={VULKAN_IMAGE}\nHAL0_ALLOW_VULKAN_FALLBACK= yes \n",
    )
    _render(host, "agent", image=VULKAN_IMAGE, gpu=True)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api)
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            shown = wait_until(lambda: _shown(settings), what="label not applied")
            _after_full_passes(logs)
        assert "HAL0_ALLOW_VULKAN_FALLBACK" in shown["reason"]
        assert [] == _restarts(api)


def test_hands_off_and_inactive_slots_are_not_looked_at(host: Host, notify_socket) -> None:
    """A hands_off slot is left alone (counted with reason operator), and a slot whose unit is
    not active runs nothing: neither is restarted nor shown."""
    _catalog_era(host)
    for name in ("agent", "coder"):
        _render(host, name, image=VULKAN_IMAGE, gpu=True)
        drop_slot(host.slots, name, device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-slot@coder.service": "inactive"})
    with Hal0Api() as api:
        settings = _settings(host, api, hands_off=["agent"])
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            _after_full_passes(logs, 3)
            shown = _status(settings).get("labels_not_applied")
            hands_off = _gauge(settings, "operator", "hands_off_slots")
        assert {} == shown
        assert 1 == hands_off
        assert [] == _restarts(api)


def test_our_own_relabel_is_ours_and_restarted_once_not_twice(host: Host, notify_socket) -> None:
    """The daemon demotes a running gpu-vulkan slot to cpu (ROCm lane unusable; which GPU lane
    runs cannot be told on this hal0): one restart, from the relabel itself; the checks of the
    rendered unit know the label is ours and that the restart was made (not "not applied", no
    second request)."""
    host.lane(usable=False)
    _render(host, "agent", image="ghcr.io/hal0ai/hal0-rocmfpx:ade07ba", gpu=True)
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        api.slot("agent", outcome="error")
        settings = _settings(host, api)
        with running(settings), capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            drop_slot(host.slots, "agent", device="gpu-vulkan")
            wait_until(lambda: _restarts(api), what="the restart")
            wait_until(lambda: _shown(settings), what="the slot shown")
            _after_full_passes(logs)
            shown = _shown(settings)
        assert "cpu" == (shown or {}).get("label")
        assert "tried" == (shown or {}).get("state"), shown
        assert [] == [e for e in logs if e["event"] == "slot.label_restart_requested"]
        assert 1 == len(_restarts(api))


def test_plan_shows_the_label_not_applied(host: Host) -> None:
    """``plan --json`` lists the running slot whose label is not applied, with the reason."""
    _render(host, "agent", image="ghcr.io/hal0ai/hal0-toolbox-cpu:v1", gpu=False)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active"})
    sets = [f"--set={k}={v}" for k, v in host.overrides().items()]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-m", "hal0_reconciler", "plan", *sets, "--json", "--assume-amd"]
    done = subprocess.run(
        [*argv, "--assume-rocm=usable"], capture_output=True, env=env, timeout=60, check=False
    )
    assert b"" != done.stdout, done.stderr
    doc = json.loads(done.stdout)
    assert "not-applied" == doc["labels_not_applied"]["agent"]["state"], done.stderr


def test_the_look_runs_again_only_when_one_of_its_inputs_changed(host: Host, notify_socket) -> None:
    """Full passes that find nothing new do not look again; a unit hal0 re-rendered, and the
    Vulkan opt-in set in hal0's environment, each make the next full pass look."""
    _catalog_era(host)
    _render(host, "agent", image="ghcr.io/hal0ai/hal0-toolbox-cpu:v1", gpu=False)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api)
        with running(settings) as daemon, capture_logs() as logs:
            notify_socket.wait_for("READY=1")
            labels = daemon._passes.labels
            wait_until(lambda: _shown(settings), what="label not applied")
            _after_full_passes(logs)
            looks = labels.looks
            _after_full_passes(logs, 3)
            assert looks == labels.looks  # nothing changed: not looked at again
            _render(host, "agent", image=VULKAN_IMAGE, gpu=True)  # hal0 rendered it anew
            wait_until(
                lambda: (_shown(settings) or {}).get("running") == "gpu-vulkan",
                what="the new rendering seen",
            )
            looks = labels.looks
            _env(
                host,
                f"HAL0_TOOLBOX_IMAGE_VULKANFPX={VULKAN_IMAGE}\nHAL0_ALLOW_VULKAN_FALLBACK=1\n",
            )
            wait_until(
                lambda: "HAL0_ALLOW_VULKAN_FALLBACK" in (_shown(settings) or {}).get("reason", ""),
                what="the opt-in seen",
            )
            assert labels.looks > looks


@pytest.mark.parametrize("paused", [True, False], ids=["read-set", "read-unset"])
def test_the_label_check_takes_the_vulkan_opt_in_the_pass_read(host: Host, paused: bool) -> None:
    """The label check judges by hal0's api.env as the pass read it: an api.env changed after
    the pass (the opt-in set or unset) waits for the next pass, and is not read a second time."""
    _catalog_era(host)
    opt_in = "HAL0_ALLOW_VULKAN_FALLBACK=yes\n"
    _env(host, f"HAL0_TOOLBOX_IMAGE_VULKANFPX={VULKAN_IMAGE}\n{opt_in if paused else ''}")
    _render(host, "agent", image=VULKAN_IMAGE, gpu=True)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "active", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api)
        engine = reconcile.Reconciler(settings)
        report = engine.reconcile(ROCM_USABLE, apply=False)
        assert paused is report.vulkan_paused
        _env(host, f"HAL0_TOOLBOX_IMAGE_VULKANFPX={VULKAN_IMAGE}\n{'' if paused else opt_in}")
        shown = labels.plan_entries(settings, report, engine.hal0_facts)
    said = "HAL0_ALLOW_VULKAN_FALLBACK" in shown["agent"]["reason"]
    assert paused is said, shown


def test_a_finished_restart_a_noted_label_and_a_reload_each_make_the_next_full_look(
    host: Host,
) -> None:
    """The same pass again is not looked at; a restart finished since, a label this daemon
    noted in its memory, and new settings each make the next full pass look again."""
    _catalog_era(host)
    _render(host, "agent", image=VULKAN_IMAGE, gpu=True)
    drop_slot(host.slots, "agent", device="gpu-rocm")
    host.systemctl.set_states({UNIT: "inactive", "hal0-api.service": "active"})
    with Hal0Api() as api:
        settings = _settings(host, api)
        engine = reconcile.Reconciler(settings)
        report = engine.reconcile(ROCM_USABLE, apply=False)
        watch = labels.LabelWatch(settings, lambda _request: None)
        looks = []
        for step in ("first", "same", "restart", "noted", "reload"):
            restarts = 1 if step in ("restart", "noted", "reload") else 0
            if step == "noted":
                watch.note_relabeled([("agent", "gpu-rocm")])
            if step == "reload":
                watch.update_settings(settings)
            watch.check(report, engine.hal0_facts, full=True, restarts=restarts)
            looks.append(watch.looks)
    assert [1, 1, 2, 3, 4] == looks
