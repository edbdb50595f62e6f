"""Prometheus text-format metrics, written atomically for node_exporter's textfile collector.

The temp file is hidden and does not end in ``.prom``, so the collector never reads half a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hal0_reconciler import fsio

_PREFIX = "hal0_reconciler"


@dataclass
class Metrics:
    """Counters since the daemon started, gauges as of the last pass."""

    passes: int = 0
    relabels: dict[str, int] = field(default_factory=dict)  # by target device
    restarts: dict[str, int] = field(default_factory=dict)  # by result
    unreadable_files: int = 0
    slots: int = 0
    hands_off: int = 0
    pass_duration: float = 0.0
    last_pass_timestamp: float = 0.0
    rocm_lane_usable: bool = False
    aiter_enabled: bool = False  # the aiter families are written only when trees are configured
    aiter_modules_uncovered: int = 0
    aiter_heals: int = 0  # modules quarantined since start
    aiter_check_failures: int = 0


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
    lines = _scalar(
        "passes_total", "counter", "Reconcile passes since the daemon started.", f"{m.passes}"
    )
    lines += _family("relabels_total", "counter", "Slot files relabelled, by new device.")
    lines += _labelled("relabels_total", "target", m.relabels)
    lines += _family("restarts_total", "counter", "Slot restart requests, by result.")
    lines += _labelled("restarts_total", "result", m.restarts)
    lines += _scalar(
        "unreadable_files",
        "gauge",
        "Slot files that could not be read or parsed.",
        f"{m.unreadable_files}",
    )
    lines += _scalar("slots", "gauge", "Slot files seen by the last full pass.", f"{m.slots}")
    lines += _scalar(
        "hands_off_slots", "gauge", "Slots left alone after a fight.", f"{m.hands_off}"
    )
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
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, m: Metrics) -> None:
    """Replace ``path`` atomically (mode 0644, readable by node_exporter)."""
    fsio.write_atomically(path, render(m).encode("utf-8"), mode=0o644)
