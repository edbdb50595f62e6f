"""The daemon's first look at the host starts before the daemon has loaded (``EarlyGather``):
its result is used only when nothing it rests on changed before the watches were set up."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler.host import facts
from hal0_reconciler.model import HostFacts, LaneState, ProbeResult
from hal0_reconciler.settings import Settings

USABLE = HostFacts(amd=True, lane=LaneState.USABLE)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[HostFacts]:
    """Every real look at the host (``gather``), each giving the next of ``results``."""
    done: list[HostFacts] = []

    def gather(_settings: Settings) -> HostFacts:
        result = HostFacts(amd=True, lane=LaneState.USABLE, probe=None)
        done.append(result)
        return result

    monkeypatch.setattr(facts, "gather", gather)
    return done


@pytest.fixture
def host(host_dirs: dict[str, Path], make_settings: Any) -> Settings:
    host_dirs["amdgpu_module_dir"].mkdir(parents=True)
    (host_dirs["dri_dir"] / "renderD128").write_text("")
    host_dirs["kfd_path"].write_text("")
    old = time.time() - 10  # not changed within the last second
    for path in (host_dirs["kfd_path"], host_dirs["dri_dir"] / "renderD128"):
        os.utime(path, (old, old))
    settings: Settings = make_settings()
    return settings


def _age_ctimes(monkeypatch: pytest.MonkeyPatch) -> None:
    """ctime cannot be set back: the look is taken as if it happened later."""
    real = time.time_ns
    monkeypatch.setattr(facts.time, "time_ns", lambda: real() + 5 * facts.SETTLED_NS)


def test_the_early_look_is_taken_when_nothing_changed(
    host: Settings, looks: list[HostFacts], monkeypatch: pytest.MonkeyPatch
) -> None:
    _age_ctimes(monkeypatch)
    early = facts.EarlyGather(host)
    first = early(host)
    assert [first] == looks, "the first call looked at the host again"
    second = early(host)
    assert [first, second] == looks, "a later call did not look at the host"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.kfd_path.chmod(0o600), id="kfd-mode"),
        pytest.param(lambda s: os.chown(s.kfd_path, 54321, -1), id="kfd-owner"),
        pytest.param(lambda s: (s.dri_dir / "renderD128").chmod(0o600), id="render-node-mode"),
        pytest.param(lambda s: (s.dri_dir / "renderD129").write_text(""), id="new-render-node"),
        pytest.param(lambda s: (s.dri_dir / "renderD128").unlink(), id="render-node-gone"),
        pytest.param(lambda s: s.amdgpu_module_dir.rmdir(), id="amdgpu-unloaded"),
    ],
)
def test_a_change_before_the_watches_means_a_new_look(
    host: Settings, looks: list[HostFacts], monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    _age_ctimes(monkeypatch)
    early = facts.EarlyGather(host)
    early._thread.join()  # the early look is done, then the node changes
    change(host)
    early(host)
    assert 2 == len(looks), "a change since the early look was not looked at"


def test_a_node_changed_just_before_the_early_look_is_not_trusted(
    host: Settings, looks: list[HostFacts]
) -> None:
    """Changed within the same clock tick as the look, a later change could leave every stat
    field equal: the first call looks again."""
    host.kfd_path.chmod(0o666)  # its ctime is now
    early = facts.EarlyGather(host)
    early(host)
    assert 2 == len(looks)


def test_other_settings_mean_a_new_look(
    host: Settings, looks: list[HostFacts], make_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _age_ctimes(monkeypatch)
    early = facts.EarlyGather(host)
    early(make_settings(probe_timeout=7))
    assert 2 == len(looks)


def test_a_failed_early_probe_is_not_taken(host: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    _age_ctimes(monkeypatch)
    failed = ProbeResult(
        usable=False, credentials=None, kfd_ok=False, render_node=None, error="timed out"
    )
    results = [
        HostFacts(amd=True, lane=LaneState.UNKNOWN, probe=failed),
        USABLE,
    ]
    monkeypatch.setattr(facts, "gather", lambda _s: results.pop(0))
    early = facts.EarlyGather(host)
    assert USABLE == early(host)
    assert [] == results


def test_an_early_look_that_raised_is_looked_again(
    host: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _age_ctimes(monkeypatch)
    calls: list[int] = []

    def gather(_s: Settings) -> HostFacts:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("boom")
        return USABLE

    monkeypatch.setattr(facts, "gather", gather)
    assert USABLE == facts.EarlyGather(host)(host)
    assert 2 == len(calls)
