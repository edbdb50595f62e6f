"""A hal0 update changes verdicts on slot files that did not change: the daemon follows it live."""

from __future__ import annotations

import shutil

import pytest
from structlog.testing import capture_logs

from hal0_reconciler.daemon import runner
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until
from helpers.hal0_tree import C0826, STRIX


@pytest.mark.timeout(60)
def test_verdicts_follow_a_hal0_update_without_a_restart(host: Host, notify_socket) -> None:
    """Under the 0826 era an unpinned gpu-vulkan slot is right; a rollback to the broken
    ade07ba default (as an update lays out its files) makes the daemon relabel it, by itself,
    long before any resync; the change of hal0's facts is logged once, with old and new."""
    host.hal0.install("0826")
    drop_slot(host.slots, "agent")
    with capture_logs() as logs, running(host.settings(resync_interval=3600)):
        notify_socket.wait_for("READY=1")
        assert "gpu-vulkan" == device_of(host.slots / "agent.toml")
        host.hal0.install("ade07ba")
        wait_until(
            lambda: device_of(host.slots / "agent.toml") == "gpu-rocm",
            what="relabel after the hal0 update",
        )
    changed = [e for e in logs if e["event"] == "hal0.facts_changed"]
    assert 1 == len(changed), changed
    assert C0826 == changed[0]["old_default_image"]
    assert "ghcr.io/hal0ai/hal0-rocmfpx:ade07ba" == changed[0]["default_image"]
    assert STRIX in changed[0]["old_vulkan_capable"]


@pytest.mark.timeout(60)
def test_an_operator_override_in_hal0_toml_is_followed(host: Host, notify_socket) -> None:
    """[slots].default_images in hal0.toml (beside the slots folder) is a hal0 fact too: an
    override to an image that is not capable relabels the unpinned slot."""
    host.hal0.install("0826")
    drop_slot(host.slots, "agent")
    with running(host.settings(resync_interval=3600)):
        notify_socket.wait_for("READY=1")
        assert "gpu-vulkan" == device_of(host.slots / "agent.toml")
        host.hal0.config.write_text('[slots.default_images]\nrocmfpx = "example.org/vk:1"\n')
        wait_until(
            lambda: device_of(host.slots / "agent.toml") == "gpu-rocm",
            what="relabel after the hal0.toml override",
        )


@pytest.mark.timeout(60)
def test_a_hal0_installed_after_start_is_seen_at_once(host: Host, notify_socket) -> None:
    """No hal0 at start (its folders do not exist: the newest known facts keep the unpinned
    gpu-vulkan slot); hal0 installed afterwards, folder by folder as an installer lays it out,
    is seen within seconds, with no resync: its broken default relabels the slot. (Sooner than
    the main loop's own tick, which would also notice the new folders, only later.)"""
    shutil.rmtree(host.root / "usr")
    drop_slot(host.slots, "agent")
    with capture_logs() as logs, running(host.settings(resync_interval=3600)):
        notify_socket.wait_for("READY=1")
        assert "gpu-vulkan" == device_of(host.slots / "agent.toml")
        host.hal0.install("ade07ba")
        wait_until(
            lambda: device_of(host.slots / "agent.toml") == "gpu-rocm",
            timeout=runner._LOOP_TICK - 0.5,
            what="relabel after hal0 was installed",
        )
    changed = [e for e in logs if e["event"] == "hal0.facts_changed"]
    assert "ghcr.io/hal0ai/hal0-rocmfpx:ade07ba" == changed[-1]["default_image"]
    assert [] == [e["reason"] for e in logs if e["event"] == "daemon.resync_started"]
