"""The probe looks through the eyes of the slot services: root unless a hal0-slot@ unit says
otherwise (hal0-contract.md, "The host facts")."""

from __future__ import annotations

from pathlib import Path

import pytest

from hal0_reconciler.host import facts, identity
from hal0_reconciler.model import LaneState
from hal0_reconciler.settings import Settings
from helpers import devnodes


def settings_for(tmp: Path, *, service_user: str = "auto", dev: Path | None = None) -> Settings:
    module = tmp / "sys-module-amdgpu"
    module.mkdir(exist_ok=True)
    dev = dev or tmp
    return Settings(
        service_user=service_user,
        kfd_path=dev / "kfd",
        dri_dir=dev / "dri",
        amdgpu_module_dir=module,
        probe_timeout=10.0,
        slot_unit_dirs=(tmp / "containers/systemd", tmp / "system/hal0-slot@.service.d"),
    )


def test_no_user_in_the_slot_units_means_root(tmp_path: Path) -> None:
    """hal0's Quadlet units set no User=: rootful Podman, so the identity is root, and says why."""
    quadlets = tmp_path / "containers/systemd"
    quadlets.mkdir(parents=True)
    (quadlets / "hal0-slot@chat.container").write_text(
        "[Container]\nImage=ghcr.io/hal0ai/hal0-combined:0826\nUser=1000\n[Service]\nRestart=always\n"
    )
    who = identity.slot_runner(settings_for(tmp_path))
    assert "root" == who.spec
    assert "rootful" in who.why


def test_a_user_in_a_slot_unit_or_drop_in_is_used(tmp_path: Path) -> None:
    """A [Service] User= (the last one wins, as in systemd) in a slot unit or its drop-in."""
    dropins = tmp_path / "system/hal0-slot@.service.d"
    dropins.mkdir(parents=True)
    (dropins / "10-user.conf").write_text("[Service]\nUser=nobody\n# later\nUser=daemon\n")
    who = identity.slot_runner(settings_for(tmp_path))
    assert "daemon" == who.spec
    assert str(dropins / "10-user.conf") in who.why


def test_an_explicit_setting_is_taken_as_it_is(tmp_path: Path) -> None:
    who = identity.slot_runner(settings_for(tmp_path, service_user="hal0"))
    assert ("hal0", "the service_user setting") == (who.spec, who.why)


@devnodes.requires_root
@pytest.mark.timeout(30)
def test_a_root_only_kfd_is_usable_by_the_rootful_slot_services(tmp_path: Path) -> None:
    """/dev/kfd root:root 0600 (hal0 #1953): the containers, run by root, use it fine; the
    default probe agrees (a real open as root), while the hal0 API user's view would refuse."""
    with devnodes.dev_tree() as dev:
        devnodes.char_node(dev.kfd, mode=0o600)
        devnodes.char_node(dev.render(128), mode=0o600)
        rootful = facts.gather(settings_for(tmp_path, dev=dev.root))
        as_user = facts.gather(
            settings_for(tmp_path, dev=dev.root, service_user=f"{devnodes.SERVICE_UID}:1")
        )
    assert LaneState.USABLE == rootful.lane
    assert rootful.probe is not None
    assert rootful.probe.credentials is not None
    assert (0, "root") == (rootful.probe.credentials.uid, rootful.probe.credentials.user)
    assert "rootful" in rootful.probe.credentials.why
    assert LaneState.UNUSABLE == as_user.lane


@devnodes.requires_root
@pytest.mark.timeout(30)
def test_root_still_sees_a_missing_node(tmp_path: Path) -> None:
    """Probing as root still catches a node that is missing (a driver that did not come up)."""
    with devnodes.dev_tree() as dev:
        devnodes.char_node(dev.render(128), mode=0o600)
        result = facts.gather(settings_for(tmp_path, dev=dev.root))
    assert LaneState.UNUSABLE == result.lane
    assert "missing" in result.lane_reason
