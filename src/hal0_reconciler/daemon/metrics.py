"""Prometheus text-format metrics, written atomically for node_exporter's textfile collector.

The temp file is hidden and does not end in ``.prom``, so the collector never reads half a file.
Every labelled counter is written with all its known labels from the start (at 0), so an
``increase()`` alert sees the first event. ``packaging/prometheus/hal0-reconciler.rules.yml``
alerts on these names; the test suite checks every name it uses is one the daemon writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hal0_reconciler import __version__, fsio

_PREFIX = "hal0_reconciler"
HEADER = "# hal0-reconciler metrics textfile (metrics_textfile), removed with the package"
"""The first line of every textfile the daemon writes: how it (and the package's postrm) tells
its own file from another one at that path."""

RELABEL_TARGETS = ("gpu-rocm", "cpu")  # the only labels the reconciler ever writes
LANE_STATES = ("usable", "unusable", "unknown", "not-amd")
HANDS_OFF = ("operator", "fight")  # why a slot is left alone: hands_off, or a fight


@dataclass
class Metrics:
    """Counters since the daemon started, gauges as of the last pass."""

    passes: int = 0
    relabels: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RELABEL_TARGETS, 0))
    restarts: dict[str, int] = field(default_factory=dict)  # by result (every result, from 0)
    demotions: int = 0  # relabels to cpu because the ROCm lane stayed unusable
    restores: int = 0  # own demotions put back on gpu-rocm
    fights: int = 0  # fights detected (another writer kept reverting a slot)
    demoted_slots: int = 0  # slots on cpu now because the daemon demoted them
    healthy: bool = False  # as status.json says (false: degraded or unhealthy)
    running: bool = True  # false in the file a clean stop leaves behind
    rocm_lane: str = "unknown"  # one of LANE_STATES
    unreadable_files: int = 0
    slots: int = 0
    hands_off: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HANDS_OFF, 0))
    pass_duration: float = 0.0
    last_pass_timestamp: float = 0.0
    rocm_lane_usable: bool = False
    aiter_enabled: bool = False  # the aiter families are written only when trees are configured
    aiter_modules_uncovered: int = 0
    aiter_heals: int = 0  # modules quarantined since start
    aiter_check_failures: int = 0
    aiter_not_converging: int = 0  # modules a heal did not help
    aiter_fatal_boots: int = 0  # environments whose boot dies at a first table lookup
    restarts_waiting: int = 0  # relabelled slots whose restart waits (busy, hal0 booting, ...)
    restarts_busy_past_bound: int = 0  # of those, busy longer than busy_bound
    labels_not_applied: dict[str, int] = field(default_factory=dict)  # running slots, by state


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {_PREFIX}_{name} {help_text}", f"# TYPE {_PREFIX}_{name} {kind}"]


def _labelled(name: str, label: str, values: Mapping[str, int]) -> list[str]:
    return [f'{_PREFIX}_{name}{{{label}="{_escape(key)}"}} {values[key]}' for key in sorted(values)]


def _scalar(name: str, kind: str, help_text: str, value: str) -> list[str]:
    return [*_family(name, kind, help_text), f"{_PREFIX}_{name} {value}"]


def render(m: Metrics) -> str:
    """The whole exposition, one family after another, ending with a newline."""
    lines = [HEADER, *_family("build_info", "gauge", "The running version (always 1).")]
    lines.append(f'{_PREFIX}_build_info{{version="{_escape(__version__)}"}} 1')
    lines += _scalar(
        "healthy", "gauge", "1 healthy; 0 degraded or unhealthy (see status).", f"{int(m.healthy)}"
    )
    lines += _scalar(
        "running",
        "gauge",
        "1 while the daemon runs; 0 in the file a clean stop leaves (alerts on staleness skip it).",
        f"{int(m.running)}",
    )
    lines += _family("rocm_lane", "gauge", "The ROCm lane for the service user: 1 for its state.")
    lines += _labelled("rocm_lane", "state", {s: int(s == m.rocm_lane) for s in LANE_STATES})
    lines += _scalar(
        "passes_total", "counter", "Reconcile passes since the daemon started.", f"{m.passes}"
    )
    lines += _family("relabels_total", "counter", "Slot files relabelled, by new device.")
    lines += _labelled("relabels_total", "target", m.relabels)
    lines += _family("restarts_total", "counter", "Slot restart requests, by result.")
    lines += _labelled("restarts_total", "result", m.restarts)
    lines += _scalar(
        "restarts_waiting",
        "gauge",
        "Relabelled slots whose restart waits (busy, hal0-api starting, an update running).",
        f"{m.restarts_waiting}",
    )
    lines += _scalar(
        "restarts_busy_past_bound",
        "gauge",
        "Slots whose restart has waited past busy_bound for them to be idle.",
        f"{m.restarts_busy_past_bound}",
    )
    lines += _family(
        "labels_not_applied",
        "gauge",
        "Running llama.cpp slots whose container was started for another label, by state "
        "(apply, tried, not-applied, cannot-tell).",
    )
    lines += _labelled("labels_not_applied", "state", m.labels_not_applied)
    lines += _scalar(
        "demotions_total",
        "counter",
        "Slots demoted to cpu because the ROCm lane stayed unusable.",
        f"{m.demotions}",
    )
    lines += _scalar(
        "restores_total", "counter", "Own demotions restored to gpu-rocm.", f"{m.restores}"
    )
    lines += _scalar(
        "fights_total", "counter", "Fights detected over a slot with another writer.", f"{m.fights}"
    )
    lines += _scalar(
        "demoted_slots",
        "gauge",
        "Slots on cpu now because the daemon demoted them.",
        f"{m.demoted_slots}",
    )
    lines += _scalar(
        "unreadable_files",
        "gauge",
        "Slot files that cannot be judged (not valid TOML, too large, a bad name, not a "
        "regular file): the daemon is degraded while there is one.",
        f"{m.unreadable_files}",
    )
    lines += _scalar("slots", "gauge", "Slot files seen by the last full pass.", f"{m.slots}")
    lines += _family(
        "hands_off_slots",
        "gauge",
        "Slots left alone, by reason: operator (hands_off) or fight (another writer).",
    )
    lines += _labelled("hands_off_slots", "reason", m.hands_off)
    lines += _scalar(
        "pass_duration_seconds", "gauge", "Duration of the last pass.", f"{m.pass_duration:.6f}"
    )
    lines += _scalar(
        "last_pass_timestamp_seconds",
        "gauge",
        "Unix time the last pass finished.",
        f"{m.last_pass_timestamp:.3f}",
    )
    lines += _scalar(
        "rocm_lane_usable",
        "gauge",
        "1 when the service user can use the ROCm lane.",
        f"{int(m.rocm_lane_usable)}",
    )
    if m.aiter_enabled:
        lines += _scalar(
            "aiter_modules_uncovered",
            "gauge",
            "aiter modules missing kernels their tables name.",
            f"{m.aiter_modules_uncovered}",
        )
        lines += _scalar(
            "aiter_heals_total",
            "counter",
            "aiter modules quarantined (healed).",
            f"{m.aiter_heals}",
        )
        lines += _scalar(
            "aiter_check_failures_total",
            "counter",
            "aiter checks that raised.",
            f"{m.aiter_check_failures}",
        )
        lines += _scalar(
            "aiter_modules_not_converging",
            "gauge",
            "aiter modules a heal did not help (the heal is not repeated).",
            f"{m.aiter_not_converging}",
        )
        lines += _scalar(
            "aiter_fatal_boots",
            "gauge",
            "aiter environments whose boot dies at its first table lookup (see status).",
            f"{m.aiter_fatal_boots}",
        )
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, m: Metrics) -> None:
    """Replace ``path`` atomically (mode 0644, readable by node_exporter)."""
    fsio.write_atomically(path, render(m).encode("utf-8"), mode=0o644)
