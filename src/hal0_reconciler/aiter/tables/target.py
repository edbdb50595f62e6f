"""The build target(s) aiter compiles rows for: KFD topology, ``GPU_ARCHS``/``CU_NUM``, explicit."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.tables.rows import Target

_EXPLICIT = re.compile(r"^(gfx[0-9a-f]+):(\d+)$")


@dataclass(frozen=True)
class TargetChoice:
    """The targets for one environment, where they came from, or why there are none.

    aiter has two: the runtime looks rows up for the LIVE GPU's gfx and ``CU_NUM`` (or the live
    CU count), ignoring ``GPU_ARCHS``; the code generator compiles the rows of each ``GPU_ARCHS``
    arch with ``CU_NUM`` or a per-arch default, and follows the live GPU only without
    ``GPU_ARCHS``. A row looked up but never compiled is a miss no rebuild fixes.
    """

    lookup: frozenset[Target]
    source: str
    error: str | None = None
    build: frozenset[Target] = frozenset()  # empty: the same as ``lookup``
    why_apart: str | None = None  # which variables make build and lookup differ

    @property
    def compiled(self) -> frozenset[Target]:
        return self.build or self.lookup

    @property
    def targets(self) -> frozenset[Target]:
        """Every target whose rows matter (looked up or compiled)."""
        return self.lookup | self.compiled

    def __str__(self) -> str:
        looked = ",".join(str(t) for t in sorted(self.lookup)) or "unknown"
        if self.compiled == self.lookup:
            return looked
        built = ",".join(str(t) for t in sorted(self.compiled))
        return f"{looked} (compiled for {built})"


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
        try:  # sysfs: regular, small; never a FIFO or a link
            data = boundedread.read_bounded(node / "properties", max_bytes=1 << 16)
        except boundedread.ReadRefused:
            continue
        text = (data or b"").decode("ascii", errors="replace")
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
    setting: str,
    env: Mapping[str, str],
    *,
    kfd: tuple[frozenset[Target], str | None],
    build_cu: Mapping[str, int],
) -> TargetChoice:
    """Explicit ``gfx942:304`` setting (looked up and compiled), else aiter's own rules over the
    KFD reading: ``GPU_ARCHS`` (``;``-separated) and ``CU_NUM``, with ``build_cu`` the code
    generator's CUs per arch when ``CU_NUM`` is unset."""
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
    cu_env = env.get("CU_NUM", "").strip()
    if cu_env and not cu_env.isdigit():
        return TargetChoice(frozenset(), "CU_NUM", f"CU_NUM={cu_env!r} is not a number")
    cu_set = int(cu_env) if cu_env else 0  # aiter: CU_NUM=0 means "ask the GPU"
    lookup = frozenset(Target(t.gfx, cu_set or t.cu_num) for t in gpus)
    archs_env = env.get("GPU_ARCHS", "").strip()
    if not archs_env or archs_env.lower() == "native":
        if not lookup:
            return TargetChoice(frozenset(), "kfd", kfd_error)
        return TargetChoice(lookup, "kfd+CU_NUM" if cu_set else "kfd")
    archs = [a.strip().lower() for a in archs_env.split(";") if a.strip()]
    unknown = [a for a in archs if a not in build_cu]
    if not archs or unknown:
        return TargetChoice(
            frozenset(),
            "GPU_ARCHS",
            f"GPU_ARCHS={archs_env!r}: aiter's build refuses "
            f"{', '.join(unknown) or 'an empty list'} (it builds for "
            f"{', '.join(sorted(build_cu))}; arches are separated by ';')",
        )
    build = frozenset(Target(a, cu_set or build_cu[a]) for a in archs)
    if not lookup:  # no live GPU readable: assume the server runs what it was built for
        return TargetChoice(build, "GPU_ARCHS (no GPU readable: lookup assumed = build)")
    why = None
    if build != lookup:
        parts = [f"GPU_ARCHS={archs_env}"]
        parts.append(f"CU_NUM={cu_env}" if cu_env else "CU_NUM unset")
        why = (
            f"{' with '.join(parts)}: aiter compiles rows for {_list(build)} but the live GPU "
            f"looks up rows for {_list(lookup)}"
        )
    return TargetChoice(lookup, "kfd+GPU_ARCHS", build=build, why_apart=why)


def _list(targets: frozenset[Target]) -> str:
    return ",".join(str(t) for t in sorted(targets))
