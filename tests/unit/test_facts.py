"""Host facts: an AMD host is probed as the service user; any other host is left alone."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from hal0_reconciler.host import facts
from hal0_reconciler.model import Credentials, HostFacts, LaneState, ProbeResult
from hal0_reconciler.settings import Settings
from helpers import devnodes

if TYPE_CHECKING:
    from pathlib import Path

CREDS = Credentials("hal0", 54321, 54321, (54321,))
USABLE = ProbeResult(usable=True, credentials=CREDS, kfd_ok=True, render_node="/dev/dri/renderD128")
REFUSED = ProbeResult(usable=False, credentials=CREDS, kfd_ok=False, render_node=None)
BROKEN = ProbeResult(
    usable=False, credentials=CREDS, kfd_ok=False, render_node=None, error="timed out"
)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(USABLE, LaneState.USABLE, id="usable"),
        pytest.param(REFUSED, LaneState.UNUSABLE, id="refused"),
        pytest.param(BROKEN, LaneState.UNKNOWN, id="probe-failed"),
    ],
)
def test_lane_state(result, expected):
    """Only a probe that ran and opened both nodes makes the lane usable; a probe that
    could not run leaves the lane unknown."""
    assert expected == facts.lane_state(result)


def test_host_facts_of_a_non_amd_host_carry_no_probe():
    """A non-AMD host has an unusable lane and no probe, whatever was passed."""
    assert HostFacts(amd=False, lane=LaneState.UNUSABLE, probe=None) == facts.host_facts(
        amd=False, result=USABLE
    )


def settings_for(
    tmp: Path, *, amd: bool, service_user: str = "hal0-no-such-user", dev: Path | None = None
) -> Settings:
    module = tmp / "sys-module-amdgpu"
    if amd:
        module.mkdir()
    dev = dev or tmp
    return Settings(
        service_user=service_user,
        kfd_path=dev / "kfd",
        dri_dir=dev / "dri",
        amdgpu_module_dir=module,
        probe_timeout=10.0,
    )


def test_is_amd_host_follows_the_amdgpu_module_dir(tmp_path):
    """The host is AMD exactly when the amdgpu module directory exists."""
    assert (False, True) == (
        facts.is_amd_host(settings_for(tmp_path / "a", amd=False)),
        facts.is_amd_host(settings_for(_mkdir(tmp_path / "b"), amd=True)),
    )


def test_a_non_amd_host_is_not_probed(tmp_path):
    """Without amdgpu nothing is probed: not even the (unresolvable) service user is looked up."""
    assert HostFacts(amd=False, lane=LaneState.UNUSABLE, probe=None) == facts.gather(
        settings_for(tmp_path, amd=False)
    )


@pytest.mark.timeout(30)
def test_an_unresolvable_service_user_makes_the_lane_unknown_with_the_reason(tmp_path):
    """On an AMD host, a service user that does not exist is an unknown lane that says why."""
    result = facts.gather(settings_for(tmp_path, amd=True))

    assert (True, LaneState.UNKNOWN) == (result.amd, result.lane)
    assert (
        "probe failed: service user 'hal0-no-such-user' does not exist"
        " (the service_user setting)" == result.lane_reason
    )


@devnodes.requires_root
@pytest.mark.timeout(30)
def test_an_amd_host_with_nodes_the_service_user_can_open_has_a_usable_lane(tmp_path):
    """On an AMD host the lane follows what the service user can really open."""
    with devnodes.dev_tree() as dev:
        devnodes.char_node(dev.kfd, mode=0o660, gid=devnodes.RENDER_GID)
        devnodes.char_node(dev.render(128), mode=0o666)
        settings = settings_for(
            tmp_path, amd=True, service_user=f"54321:54321:{devnodes.RENDER_GID}", dev=dev.root
        )

        usable = facts.gather(settings)
        refused = facts.gather(settings, credentials=Credentials("x", 54321, 54321, (54321,)))

    assert (LaneState.USABLE, str(dev.render(128))) == (
        usable.lane,
        usable.probe and usable.probe.render_node,
    )
    assert (LaneState.UNUSABLE, f"{dev.kfd}: permission (Permission denied)") == (
        refused.lane,
        refused.lane_reason,
    )
    assert [] == [p for p in (usable.probe, refused.probe) if p is None or p.error is not None]
    assert os.geteuid() == 0


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path
