"""The host's facts and hal0's, as lines for people and as data for ``--json``: what
``once``, ``plan`` and ``probe`` show about where they run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hal0_reconciler import console

if TYPE_CHECKING:  # each verb loads what it runs (see cli.plan)
    from hal0_reconciler.host.hal0 import reader as hal0
    from hal0_reconciler.model import HostFacts


def facts_line(facts: HostFacts) -> str:
    if not facts.amd:
        return "host: not AMD (nothing is touched)"
    why = facts.lane_reason if facts.probe is not None else "assumed, not probed"
    return f"host: AMD, ROCm lane {facts.lane.value} ({console.inert(why)})"


def hal0_lines(read: hal0.Hal0Read) -> list[str]:
    """hal0's facts for people: every value is hal0's file's, shown inert."""
    from hal0_reconciler.host.hal0 import reader

    f, inert = read.facts, console.inert
    lines = [inert(reader.summary(f))]
    if f.default_image:
        lines += [f"  default image: {inert(f.default_image)}"]
    lines += [f"  rule: {f.rule.value} ({inert(f.rule_evidence)})"]
    lines += [f"  hal0: {inert(p.line())}" for p in read.problems]
    return lines


def host_json(facts: HostFacts) -> dict[str, Any]:
    if not facts.amd:
        return {"amd": False, "rocm_lane": "not-amd", "reason": "not an AMD host"}
    why = facts.lane_reason if facts.probe is not None else "assumed, not probed"
    return {"amd": True, "rocm_lane": facts.lane.value, "reason": why}


def hal0_json(read: hal0.Hal0Read) -> dict[str, Any]:
    from hal0_reconciler.host.hal0 import reader as hal0

    return {**hal0.describe(read.facts), "problems": [p.line() for p in read.problems] or None}
