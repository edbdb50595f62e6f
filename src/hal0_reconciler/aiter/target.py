"""The build target(s) aiter compiles rows for: KFD topology, ``GPU_ARCHS``/``CU_NUM``, explicit."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler.aiter.tables import Target

_EXPLICIT = re.compile(r"^(gfx[0-9a-f]+):(\d+)$")


@dataclass(frozen=True)
class TargetChoice:
    """The targets for one environment, where they came from, or why there are none."""

    targets: frozenset[Target]
    source: str
    error: str | None = None

    def __str__(self) -> str:
        return ",".join(str(t) for t in sorted(self.targets)) or "unknown"


def gfx_name(version: int) -> str:
    """KFD ``gfx_target_version`` → gfx name: 90402 → gfx942, 90010 → gfx90a, 110501 → gfx1151."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def read_kfd(nodes_dir: Path) -> tuple[frozenset[Target], str | None]:
    """GPU targets from the KFD topology (CPU nodes have version 0), or why there are none."""
    found: set[Target] = set()
    try:
        nodes = sorted(nodes_dir.iterdir())
    except OSError as exc:
        return frozenset(), f"cannot list {nodes_dir}: {exc.strerror or exc}"
    for node in nodes:
        try:
            text = (node / "properties").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        props: dict[str, int] = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():  # KFD values are counts: a sign means a broken file
                props[key] = int(value)
        version = props.get("gfx_target_version", 0)
        simd, per_cu = props.get("simd_count", 0), props.get("simd_per_cu", 0)
        if version and simd and per_cu and simd >= per_cu:
            found.add(Target(gfx_name(version), simd // per_cu))
    if not found:
        return frozenset(), f"no GPU node in {nodes_dir}"
    return frozenset(found), None


def choose_target(
    setting: str, env: Mapping[str, str], *, kfd: tuple[frozenset[Target], str | None]
) -> TargetChoice:
    """Explicit ``gfx942:304`` setting, else ``GPU_ARCHS``/``CU_NUM`` from env over the KFD."""
    setting = setting.strip()
    if setting and setting != "auto":
        match = _EXPLICIT.match(setting)
        if match is None:
            return TargetChoice(
                frozenset(), "setting", f"target {setting!r} is not 'auto' or 'gfxNNN:CUs'"
            )
        if int(match[2]) == 0:
            return TargetChoice(frozenset(), "setting", f"target {setting!r} has no compute units")
        return TargetChoice(frozenset({Target(match[1], int(match[2]))}), "setting")
    gpus, kfd_error = kfd
    archs = [a.strip().lower() for a in re.split(r"[;,\s]+", env.get("GPU_ARCHS", "")) if a.strip()]
    archs = [a.split(":")[0] for a in archs if a != "native"]
    cu_env = env.get("CU_NUM", "").strip()
    if cu_env and not cu_env.isdigit():
        return TargetChoice(frozenset(), "CU_NUM", f"CU_NUM={cu_env!r} is not a number")
    if archs:
        if cu_env:
            return TargetChoice(
                frozenset(Target(a, int(cu_env)) for a in archs), "GPU_ARCHS+CU_NUM"
            )
        chosen = frozenset(t for t in gpus if t.gfx in archs)
        if not chosen:
            return TargetChoice(
                frozenset(), "GPU_ARCHS", "GPU_ARCHS names no GPU on this host and CU_NUM is unset"
            )
        return TargetChoice(chosen, "GPU_ARCHS+kfd")
    if not gpus:
        return TargetChoice(frozenset(), "kfd", kfd_error)
    if cu_env:
        return TargetChoice(frozenset(Target(t.gfx, int(cu_env)) for t in gpus), "kfd+CU_NUM")
    return TargetChoice(gpus, "kfd")
