"""What the metrics textfile says after a pass, read from the file node_exporter reads."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hal0_reconciler.aiter import monitor
from hal0_reconciler.daemon import selfheal
from hal0_reconciler.model import HostFacts, LaneState
from hal0_reconciler.settings import AiterSettings, AiterTree
from helpers.daemon_host import device_of
from helpers.pass_bench import Bench, fight_until_hands_off


def _gauge_states(text: str, family: str) -> dict[str, int]:
    pattern = rf'^hal0_reconciler_{family}{{state="([^"]+)"}} (\d+)$'
    return {m[1]: int(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


@pytest.mark.parametrize(
    ("facts", "grace", "expected"),
    [
        (HostFacts(amd=False, lane=LaneState.UNUSABLE), 0, "not-amd"),
        (HostFacts(amd=False, lane=LaneState.USABLE), 0, "not-amd"),
        (HostFacts(amd=True, lane=LaneState.USABLE), 0, "usable"),
        (HostFacts(amd=True, lane=LaneState.UNUSABLE), 0, "unusable"),
        (HostFacts(amd=True, lane=LaneState.UNUSABLE), 3600, "unusable"),  # within the grace
        (HostFacts(amd=True, lane=LaneState.UNKNOWN), 0, "unknown"),
    ],
    ids=["not-amd", "not-amd-usable", "usable", "unusable", "unsettled", "probe-cannot-run"],
)
def test_the_lane_gauge_names_the_lanes_state(
    tmp_path: Path, facts: HostFacts, grace: int, expected: str
) -> None:
    """hal0_reconciler_rocm_lane{state=...} is 1 for exactly the lane's state: not-amd without
    amdgpu (whatever the probe says), usable, unusable (also while the demotion grace runs) or
    unknown when the probe cannot run (an alert tells "down" from "cannot look")."""
    prom = tmp_path / "textfiles" / "hal0.prom"
    bench = Bench(tmp_path, metrics_textfile=str(prom), demote_grace=grace)
    bench.slot("agent")
    bench.facts = facts
    bench.full()
    states = _gauge_states(prom.read_text(), "rocm_lane")
    shown = sorted(s for s, v in states.items() if v == 1)
    assert [expected] == shown, f"the lane gauge shows {shown} for {facts}, not {expected!r}"
    assert {"usable", "unusable", "unknown", "not-amd"} == set(states), (
        f"the lane gauge does not list every state: {sorted(states)}"
    )


def _sample(text: str, name: str) -> int:
    found = re.search(rf"^hal0_reconciler_{name} (\d+)$", text, re.MULTILINE)
    assert found is not None, f"hal0_reconciler_{name} is not in the textfile"
    return int(found[1])


def test_a_fight_is_counted_said_once_and_shown_hands_off(tmp_path: Path) -> None:
    """Another writer reverting a slot past fight_limit: fights_total 1 and hands_off 1 in the
    textfile, and one ERROR naming the slot, its path, the reverts and the value fought over."""
    from structlog.testing import capture_logs

    prom = tmp_path / "textfiles" / "hal0.prom"
    bench = Bench(tmp_path, metrics_textfile=str(prom), fight_limit=1)
    slot = bench.slot("agent")
    with capture_logs() as logs:
        fight_until_hands_off(bench, slot, "agent")
        bench.slot("agent")  # reverted once more: hands off, no fight said again
        bench.changed(slot)
    text = prom.read_text()
    assert (1, 1) == (
        _sample(text, "fights_total"),
        _sample(text, 'hands_off_slots{reason="fight"}'),
    ), "the fight is not counted in the textfile"
    said = [e for e in logs if e["event"] == "slot.fight_detected"]
    assert 1 == len(said), f"the fight was said {len(said)} times"
    assert ("error", "agent", str(slot.absolute()), 2, "gpu-rocm") == (
        said[0]["log_level"],
        said[0]["slot"],
        said[0]["path"],
        said[0]["reverts"],
        said[0]["value"],
    ), f"the fight's log line: {said[0]}"


def test_demotions_and_restores_are_counted_apart_from_other_relabels(tmp_path: Path) -> None:
    """A relabel to cpu because the lane is down counts as a demotion, putting our demotion
    back as a restore; an ordinary relabel (gpu-vulkan to gpu-rocm) as neither."""
    prom = tmp_path / "textfiles" / "hal0.prom"
    bench = Bench(tmp_path, metrics_textfile=str(prom))

    def counts() -> tuple[int, int]:
        text = prom.read_text()
        return _sample(text, "demotions_total"), _sample(text, "restores_total")

    bench.slot("other")
    bench.full()  # other: gpu-vulkan -> gpu-rocm, neither
    seen = [counts()]
    bench.facts = HostFacts(amd=True, lane=LaneState.UNUSABLE)
    agent = bench.slot("agent")
    bench.full()  # agent: gpu-vulkan -> cpu, a demotion
    seen.append(counts())
    bench.facts = HostFacts(amd=True, lane=LaneState.USABLE)
    bench.probe()  # agent: back to gpu-rocm, a restore
    seen.append(counts())
    assert "gpu-rocm" == device_of(agent), "setup: the demotion was not restored"
    assert [(0, 0), (1, 0), (1, 1)] == seen, f"(demotions, restores) after each pass: {seen}"
    relabels = {
        m[1]: int(m[2])
        for m in re.finditer(
            r'^hal0_reconciler_relabels_total{target="([^"]+)"} (\d+)$',
            prom.read_text(),
            re.MULTILINE,
        )
    }
    assert {"gpu-rocm": 2, "cpu": 1} == relabels, f"relabels by target: {relabels}"


class _QuietMonitor:
    """An aiter check that finds a quiet tree."""

    def watch_paths(self) -> list[Path]:
        return []

    def check(self, *, heal: bool) -> monitor.MonitorReport:
        del heal
        return monitor.MonitorReport(())


def test_the_aiter_families_are_written_only_with_aiter_trees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without aiter trees the textfile has no aiter family (no alert on a host without
    aiter); with one, the not-converging gauge counts the modules the status lists."""
    prom = tmp_path / "textfiles" / "hal0.prom"
    bench = Bench(tmp_path, metrics_textfile=str(prom))
    bench.full()
    assert "aiter" not in prom.read_text(), "aiter families written without aiter trees"
    tree = AiterTree(package_dir=tmp_path / "aiter", target="gfx950:256")
    settings = dataclasses.replace(bench.settings, aiter=AiterSettings(trees=(tree,)))
    bench.selfheal = selfheal.SelfHeal(
        settings, factory=lambda _s: _QuietMonitor(), clock=bench.clock
    )
    bench.passes._aiter = bench.selfheal
    bench.passes.update_settings(settings)
    real_status = bench.selfheal.status

    def status() -> dict[str, object] | None:
        return {**(real_status() or {}), "not_converging": ["base:m1", "base:m2"]}

    monkeypatch.setattr(bench.selfheal, "status", status)
    bench.full()
    text = prom.read_text()
    assert 2 == _sample(text, "aiter_modules_not_converging"), "not-converging modules"


def test_the_healthy_gauge_is_written_when_the_health_changes(tmp_path: Path) -> None:
    """The main loop's verdict goes to hal0_reconciler_healthy as soon as it changes (not at
    the next pass); the same verdict again does not rewrite the file."""
    prom = tmp_path / "textfiles" / "hal0.prom"
    bench = Bench(tmp_path, metrics_textfile=str(prom))
    bench.full()
    assert 0 == _sample(prom.read_text(), "healthy"), "healthy before the main loop said so"
    bench.passes.note_health(healthy=True, settings=bench.settings)
    assert 1 == _sample(prom.read_text(), "healthy"), "a healthy verdict was not written"
    written = prom.stat().st_ino  # written by rename: a rewrite is a new inode
    bench.passes.note_health(healthy=True, settings=bench.settings)
    assert written == prom.stat().st_ino, "the same verdict rewrote the textfile"
    bench.passes.note_health(healthy=False, settings=bench.settings)
    assert 0 == _sample(prom.read_text(), "healthy"), "an unhealthy verdict was not written"
