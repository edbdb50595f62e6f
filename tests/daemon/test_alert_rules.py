"""Metrics a fleet can alert on, and the shipped alerting rules checked against the metrics a
running daemon really writes (and by promtool, unpacked from Debian's prometheus package)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler import __version__, reconcile
from hal0_reconciler.daemon import metrics, progress
from hal0_reconciler.host.restarts import units
from hal0_reconciler.model import HostFacts, LaneState
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers import promtool as promtool_path
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until
from helpers.hosts import REPO

RULES = REPO / "packaging/prometheus/hal0-reconciler.rules.yml"
RULES_TEST = REPO / "tests/data/prometheus/rules-test.yml"
_SAMPLE = re.compile(r'^(hal0_reconciler_[a-z_]+)(?:\{([a-z_]+)="([^"]*)"\})? (\S+)$')


def _samples(text: str) -> dict[tuple[str, str, str], float]:
    """(name, label, label value) -> value, for every sample line."""
    found: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, line
        name, label, value, number = match.groups()
        found[(name, label or "", value or "")] = float(number)
    return found


def _written_by_a_daemon(host: Host, notify_socket: Any, tmp_path: Path) -> str:
    """The textfile of a real daemon (with an aiter tree, so the aiter families are there)
    after it relabelled one slot."""
    metrics_file = tmp_path / "textfile/hal0_reconciler.prom"
    (tmp_path / "aiter").mkdir()
    settings = dataclasses.replace(
        host.settings(metrics_textfile=str(metrics_file)),
        aiter=AiterSettings(
            trees=(AiterTree(package_dir=tmp_path / "aiter", target="gfx950:256"),)
        ),
    )
    with running(settings):
        notify_socket.wait_for("READY=1")
        slot = drop_slot(host.slots, "agent")
        wait_until(lambda: device_of(slot) == "gpu-rocm", what="relabel")
        wait_until(
            lambda: (
                metrics_file.exists()
                and 'hal0_reconciler_relabels_total{target="gpu-rocm"} 1'
                in metrics_file.read_text()
                and "hal0_reconciler_healthy 1" in metrics_file.read_text()
            ),
            what="the relabel and health in the textfile",
        )
        return metrics_file.read_text()


def test_a_fresh_textfile_has_every_counter_at_zero() -> None:
    """Before any event every labelled counter exists at 0: an increase() sees the first one."""
    samples = _samples(metrics.render(metrics.Metrics()))
    for target in metrics.RELABEL_TARGETS:
        assert 0 == samples[("hal0_reconciler_relabels_total", "target", target)]
    for name in ("demotions_total", "restores_total", "fights_total"):
        assert 0 == samples[(f"hal0_reconciler_{name}", "", "")]
    assert 1 == samples[("hal0_reconciler_build_info", "version", __version__)]
    assert 0 == samples[("hal0_reconciler_healthy", "", "")]
    lane = {v: n for (name, _, v), n in samples.items() if name == "hal0_reconciler_rocm_lane"}
    assert {"usable": 0, "unusable": 0, "unknown": 1, "not-amd": 0} == lane


def test_the_daemon_writes_health_lane_state_and_every_restart_outcome(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """A running daemon's file: healthy 1, lane usable (one series per state), a relabel,
    and restarts_total for every outcome from 0."""
    samples = _samples(_written_by_a_daemon(host, notify_socket, tmp_path))
    assert 1 == samples[("hal0_reconciler_healthy", "", "")]
    lane = {v: n for (name, _, v), n in samples.items() if name == "hal0_reconciler_rocm_lane"}
    assert {"usable": 1, "unusable": 0, "unknown": 0, "not-amd": 0} == lane
    restarts = {v for (name, _, v) in samples if name == "hal0_reconciler_restarts_total"}
    assert {r.value for r in units.RestartResult} == restarts
    assert 0 == samples[("hal0_reconciler_demotions_total", "", "")]


def test_a_demotion_and_a_restore_are_counted(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """Lane lost: demotions_total 1 and demoted_slots 1; lane back: restores_total 1, 0 demoted."""
    metrics_file = tmp_path / "m.prom"
    slot = drop_slot(host.slots, "agent")
    host.lane(usable=False)
    with running(host.settings(metrics_textfile=str(metrics_file))):
        notify_socket.wait_for("READY=1")
        wait_until(lambda: device_of(slot) == "cpu", what="demotion")
        wait_until(
            lambda: "hal0_reconciler_demoted_slots 1" in metrics_file.read_text(), what="gauge"
        )
        demoted = _samples(metrics_file.read_text())
        host.lane(usable=True)
        wait_until(lambda: device_of(slot) == "gpu-rocm", timeout=20, what="restore")
        wait_until(
            lambda: "hal0_reconciler_restores_total 1" in metrics_file.read_text(), what="restore"
        )
        restored = _samples(metrics_file.read_text())
    assert (1, 1) == (
        demoted[("hal0_reconciler_demotions_total", "", "")],
        demoted[("hal0_reconciler_demoted_slots", "", "")],
    )
    assert 1 == demoted[("hal0_reconciler_rocm_lane", "state", "unusable")]
    assert 0 == restored[("hal0_reconciler_demoted_slots", "", "")]


def _rule_exprs() -> list[str]:
    yaml = pytest.importorskip("yaml", reason="PyYAML (a test dependency) is not installed")
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for group in doc["groups"] for r in group["rules"]]
    assert rules
    assert all({"alert", "expr", "annotations"} <= set(r) for r in rules)
    return [r["expr"] for r in rules]


def test_every_metric_the_rules_name_is_one_the_daemon_writes(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """Parse the rules; each hal0_reconciler_* name (and each label matcher) must be in the
    textfile a running daemon wrote. A renamed metric would silently never alert."""
    exprs = _rule_exprs()
    samples = _samples(_written_by_a_daemon(host, notify_socket, tmp_path))
    written = {name for name, _, _ in samples}
    named = {n for e in exprs for n in re.findall(r"\bhal0_reconciler_[a-z_]+\b", e)}
    assert named
    assert set() == named - written
    for expr in exprs:
        for name, label, value in re.findall(r'(hal0_reconciler_[a-z_]+)\{(\w+)="([^"]*)"\}', expr):
            assert (name, label, value) in samples, expr


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    """`promtool check rules` and the alert unit tests (each alert fires, and not too soon)."""
    promtool = promtool_path.find()
    if promtool is None:
        pytest.skip(promtool_path.SKIP_REASON)
    for argv in (
        [promtool, "check", "rules", str(RULES)],
        [promtool, "test", "rules", str(RULES_TEST)],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert 0 == result.returncode, result.stdout + result.stderr


def test_a_fight_is_counted(host: Host, notify_socket: Any, tmp_path: Path) -> None:
    """Another writer reverting a slot past fight_limit: fights_total 1, hands_off_slots 1."""
    metrics_file = tmp_path / "m.prom"
    slot = drop_slot(host.slots, "agent")
    settings = host.settings(fight_limit=2, metrics_textfile=str(metrics_file))
    with running(settings) as daemon:
        notify_socket.wait_for("READY=1")
        for n in range(1, 5):
            wait_until(lambda n=n: daemon.stats().relabels == n, what=f"relabel {n}")
            drop_slot(host.slots, "agent")  # the other writer puts vulkan back
        wait_until(
            lambda: "hal0_reconciler_fights_total 1" in metrics_file.read_text(), what="counted"
        )
        wait_until(
            lambda: 'hal0_reconciler_hands_off_slots{reason="fight"} 1' in metrics_file.read_text(),
            what="hands off",
        )
    assert "gpu-vulkan" == device_of(slot)


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        (HostFacts(amd=True, lane=LaneState.USABLE), "usable"),
        (HostFacts(amd=True, lane=LaneState.UNUSABLE), "unusable"),
        (HostFacts(amd=True, lane=LaneState.UNSETTLED), "unusable"),  # within the grace
        (HostFacts(amd=True, lane=LaneState.UNKNOWN), "unknown"),  # the probe cannot run
        (HostFacts(amd=False, lane=LaneState.UNUSABLE), "not-amd"),
    ],
)
def test_the_lane_state_series(facts: HostFacts, state: str) -> None:
    """Four states, one series each; an unusable lane within the grace is unusable."""
    assert state == progress.lane_metric_state(facts)
    assert state in metrics.LANE_STATES


class _Wedged(reconcile.Reconciler):
    """The real engine, held at every pass after the first until ``gate`` opens."""

    def __init__(self, settings: Settings, gate: threading.Event) -> None:
        super().__init__(settings)
        self.gate = gate
        self.calls = 0

    def reconcile(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls > 1:
            assert self.gate.wait(20), "the test never released the wedged pass"
        return super().reconcile(*args, **kwargs)


def test_a_stuck_daemon_writes_healthy_0_without_a_pass(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """A wedged pass never finishes, so no pass writes metrics: the main loop writes
    `healthy 0` itself, or the unhealthy alert would never fire."""
    metrics_file = tmp_path / "m.prom"
    gate = threading.Event()
    settings = host.settings(stuck_after=0.5, metrics_textfile=str(metrics_file))
    with running(settings, reconciler_factory=lambda s: _Wedged(s, gate)):
        try:
            notify_socket.wait_for("READY=1")
            wait_until(lambda: "hal0_reconciler_healthy 1" in metrics_file.read_text())
            drop_slot(host.slots, "agent")  # the second pass wedges
            wait_until(
                lambda: "hal0_reconciler_healthy 0" in metrics_file.read_text(),
                what="healthy 0 while the pass is stuck",
            )
        finally:
            gate.set()
