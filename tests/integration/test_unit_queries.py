"""Unit states cost one `systemctl is-active` per pass (`once`) or per drained batch (the
restarter), whatever the number of slots."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import units
from helpers.fake_systemctl import FakeSystemctl
from helpers.hal0_api_server import Hal0Api
from helpers.hosts import REPO

SLOT = 'name = "{name}"\ndevice = "gpu-vulkan"\n'


def test_active_states_asks_once_for_many_units(tmp_path: Path) -> None:
    systemctl = FakeSystemctl(tmp_path / "bin", {"hal0-slot@b.service": "active"})
    settings = settings_mod.load(None, {"systemctl": str(systemctl.path)})
    assert {"a": False, "b": True, "c": False} == units.active_states(settings, ["a", "b", "c"])
    assert [["is-active", *(units.unit_name(t) for t in "abc")]] == systemctl.calls()
    assert {} == units.active_states(settings, [])
    assert 1 == len(systemctl.calls())  # nothing to ask: no process


def test_a_systemctl_that_cannot_run_leaves_every_state_unknown(tmp_path: Path) -> None:
    settings = settings_mod.load(None, {"systemctl": str(tmp_path / "missing")})
    assert {"a": None, "b": None} == units.active_states(settings, ["a", "b"])


def test_the_restarter_asks_once_for_a_batch_of_due_requests(tmp_path: Path) -> None:
    states = {units.unit_name(t): "inactive" for t in ("a", "b", "c")}
    systemctl = FakeSystemctl(tmp_path / "bin", states)
    settings = settings_mod.load(None, {"systemctl": str(systemctl.path)})
    restarter = units.Restarter(settings)
    for token in ("a", "b", "c"):
        restarter.submit(units.RestartRequest(name=token, token=token))
    with restarter:
        deadline = time.monotonic() + 20
        while sum(restarter.results.values()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert {units.RestartResult.INACTIVE: 3} == dict(restarter.results)
    assert [["is-active", *(units.unit_name(t) for t in "abc")]] == systemctl.calls()
    assert {} == restarter.pending()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the credential-dropping probe need root")
def test_once_asks_for_every_relabelled_unit_in_one_call(
    host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    host_dirs["amdgpu_module_dir"].mkdir(parents=True)
    for node in (host_dirs["kfd_path"], host_dirs["dri_dir"] / "renderD128"):
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chmod(node, 0o666)
    for name in ("a", "b", "c", "d"):
        (host_dirs["slots_dir"] / f"{name}.toml").write_text(SLOT.format(name=name))
    systemctl = FakeSystemctl(tmp_path / "bin", {"hal0-slot@c.service": "active"})
    flags = [a for k, p in host_dirs.items() for a in (f"--{k.replace('_', '-')}", str(p))]
    with Hal0Api() as api:
        result = subprocess.run(
            [sys.executable, "-m", "hal0_reconciler", "once", *flags, "--user", "54321:54321",
             "--log-format", "json", "--set", f"systemctl={systemctl.path}",
             "--set", f"api_url={api.url}", "--set", f"api_env_file={tmp_path / 'none.env'}"],
            capture_output=True, text=True, timeout=50, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )  # fmt: skip
    assert 0 == result.returncode, result.stderr
    assert [["is-active", *(units.unit_name(t) for t in "abcd")]] == systemctl.calls()
    assert [("POST", "/api/slots/c/restart", None)] == api.requests
