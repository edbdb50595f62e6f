"""What the metrics textfile says after a pass, read from the file node_exporter reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hal0_reconciler.model import HostFacts, LaneState
from helpers.pass_bench import Bench


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
