"""What the installed hal0 release believes about images, read from its own files (never
imported), and the rules it is judged by.

The release is placed first (:mod:`hal0_reconciler.host.hal0.release`: the code's structure
decides the era, ``VERSION`` or the dist-info names the release). Then, by era:

- 1.0-1.3 (allowlist): ``schema.py``'s ``DEFAULT_ROCMFPX_IMAGE``, ``VULKAN_CAPABLE_IMAGE_REFS``,
  ``STALE_ROCMFPX_IMAGE_REFS``; the literal runner table; ``[slots].default_images``;
  ``HAL0_TOOLBOX_IMAGE_*`` from ``api.env``; the manifest's ``toolbox_images`` refs;
- 1.4+ (pins): the runner keys and ``supported_backends`` of ``runners/__init__.py``; the
  manifest's ``runners`` pins (missing or invalid: every slot kept, degraded);
  ``[slots].default_images`` and ``HAL0_RUNNER_IMAGE_*`` as the runner-system conversion leaves
  them, unless the downgrade restore marker holds.

No hal0 installed: nothing to judge against, every slot kept, said once (not degraded). A hal0
of no known release's shape: every slot kept, loudly. Settings override a set outright.
:class:`Hal0Reader` re-reads only when a source file changed (by identity).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hal0_reconciler import errors, fsio
from hal0_reconciler.host.hal0 import (
    allowlist,
    manifest,
    operator_files,
    pins,
    pysource,
    release,
    restore,
    runners,
)
from hal0_reconciler.host.hal0.paths import Hal0Paths, hal0_paths
from hal0_reconciler.host.hal0.paths import layout_identity as hal0_layout_identity
from hal0_reconciler.host.hal0.sources import (
    MAX_SOURCE_BYTES,
    FactProblem,
    SourceError,
    read_text,
)
from hal0_reconciler.model import Hal0Facts, Hal0Rule
from hal0_reconciler.settings import Settings
from hal0_reconciler.slots import conversion

_CAPABLE = "VULKAN_CAPABLE_IMAGE_REFS"
_RELABEL = "relabel_stale_vulkan_slots"
__all__ = ["FactProblem", "Hal0Paths", "Hal0Read", "Hal0Reader", "describe", "hal0_paths"]


@dataclass(frozen=True)
class Hal0Read:
    """hal0's facts as read, and what was said about its sources."""

    facts: Hal0Facts
    problems: tuple[FactProblem, ...]


class Hal0Reader:
    """Reads hal0's facts; cheap when nothing changed (``stat`` calls only)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._identity: tuple[object, ...] | None = None
        self._last: Hal0Read | None = None
        self._layout: tuple[object, ...] | None = None  # what ``_paths`` was found from
        self._paths: Hal0Paths | None = None

    def read(self) -> Hal0Read:
        layout = hal0_layout_identity(self._settings)
        if self._paths is None or layout != self._layout:  # VERSION and the venv's folders
            self._paths = hal0_paths(self._settings, _peek_version(self._settings))
            self._layout = layout
        paths = self._paths
        identity = (paths, *(_identity(p) for p in paths.files()))
        if self._last is None or identity != self._identity:
            try:
                self._last = read_facts(self._settings, paths)
            except Exception as exc:  # no hal0 file, however odd, stops a pass: nothing moves
                why = f"could not be read ({errors.describe(exc)}): every slot is kept"
                problem = FactProblem("hal0", str(paths.package_search), why, not_understood=True)
                facts = _empty(Hal0Rule.NOT_PLACEABLE, why, None)
                self._last = Hal0Read(facts, (problem,))
            self._identity = identity
        return self._last


def read_facts(settings: Settings, paths: Hal0Paths | None = None) -> Hal0Read:
    """Read every source now; each module is parsed once (its tree dropped when done)."""
    try:
        return _read_facts(settings, paths)
    finally:
        pysource.forget()


def _read_facts(settings: Settings, paths: Hal0Paths | None) -> Hal0Read:
    problems: list[FactProblem] = []
    version_text = _version(settings.hal0_release_dir / "VERSION", problems)
    paths = paths if paths is not None else hal0_paths(settings, version_text)
    named = version_text or paths.dist_version
    if settings.assume_hal0 is not None:
        placement = release.assumed(settings.assume_hal0)
    elif paths.package is None and version_text is None:
        why = f"no hal0 installed (no {paths.version}, no package at {paths.package_search})"
        problems.append(FactProblem("hal0", str(paths.package_search), f"{why}: every slot kept"))
        return Hal0Read(_empty(Hal0Rule.NO_HAL0, why, None), tuple(problems))
    else:
        structure, evidence, schema = _structure(paths, problems)
        placement = release.place(named, structure, evidence)
        del schema
    if placement.note is not None:
        problems.append(FactProblem("hal0", str(paths.version), placement.note))
    if placement.release is None:
        why = f"hal0 {named or '(release unknown)'}: {placement.evidence}: every slot is kept"
        problems.append(FactProblem("hal0", str(paths.package_search), why, not_understood=True))
        return Hal0Read(_empty(Hal0Rule.NOT_PLACEABLE, why, named), tuple(problems))
    rel = placement.release
    base = _empty(rel.rule, placement.evidence, named)
    base = dataclasses.replace(
        base,
        release=rel.version,
        vulkan_runner=rel.vulkan_runner or "rocmfpx",
        device_marker=rel.device_marker,
    )
    if rel.rule is Hal0Rule.PINS:
        facts = _pins_facts(settings, paths, base, problems)
    elif rel.rule is Hal0Rule.ALLOWLIST:
        facts = allowlist.facts(settings, paths, base, rel, problems)
    else:
        facts = base
    return Hal0Read(facts, tuple(problems))


def _empty(rule: Hal0Rule, evidence: str, version: str | None) -> Hal0Facts:
    return Hal0Facts(
        version=version,
        default_image="",
        capable=frozenset(),
        stale=frozenset(),
        bundled=MappingProxyType({}),
        manifest_keys=MappingProxyType({}),
        aliases=MappingProxyType({}),
        rule=rule,
        rule_evidence=evidence,
    )


# -- placing ------------------------------------------------------------------------------------
def _structure(
    paths: Hal0Paths, problems: list[FactProblem]
) -> tuple[release.Structure, str, dict[str, str | frozenset[str]]]:
    """The era the installed code's shape belongs to, its evidence, and schema.py's values."""
    if paths.package is None or paths.schema is None:
        return release.Structure.UNKNOWN, f"no hal0 package at {paths.package_search}", {}
    try:
        text = read_text(paths.schema, cap=MAX_SOURCE_BYTES)
        values, errs = pysource.module_values(text, wanted=allowlist.SCHEMA_NAMES)
    except (SourceError, pysource.Hal0CodeError) as exc:
        problems.append(FactProblem("schema.py", str(paths.schema), str(exc), not_understood=True))
        return release.Structure.UNKNOWN, f"schema.py: {exc}", {}
    problems.extend(
        FactProblem("schema.py", str(paths.schema), errs[n], not_understood=True)
        for n in allowlist.SCHEMA_NAMES
        if n in errs
    )
    has_capable = _CAPABLE in values or _CAPABLE in errs
    has_pins = paths.pins is not None and paths.pins.is_file()
    if has_pins and not has_capable:
        return release.Structure.PINS, "runners/pins.py, no VULKAN_CAPABLE_IMAGE_REFS", values
    if has_capable and not has_pins:
        if _CAPABLE in errs:
            return release.Structure.UNKNOWN, errs[_CAPABLE], values
        return release.Structure.ALLOWLIST, f"schema.py defines {_CAPABLE}", values
    if has_capable:
        return release.Structure.UNKNOWN, f"both runners/pins.py and {_CAPABLE}", values
    try:
        updater = read_text(
            paths.package / "updater" / "updater.py", cap=MAX_SOURCE_BYTES, missing_ok=True
        )
        relabels = _RELABEL in pysource.top_level_functions(updater) if updater else False
    except (SourceError, pysource.Hal0CodeError) as exc:
        return release.Structure.UNKNOWN, f"updater.py: {exc}", values
    if relabels:
        why = f"{_RELABEL} but neither {_CAPABLE} nor runners/pins.py"
        return release.Structure.UNKNOWN, why, values
    return release.Structure.PRE_RULE, f"no {_CAPABLE}, no pins, no {_RELABEL}", values


# -- 1.4+: manifest pins ------------------------------------------------------------------------
def _pins_facts(
    settings: Settings, paths: Hal0Paths, base: Hal0Facts, problems: list[FactProblem]
) -> Hal0Facts:
    sources: dict[str, str] = {"version": str(paths.version)}
    installed = paths.pins is not None and paths.pins.is_file() and paths.runners is not None
    table: dict[str, tuple[str, ...]] | None
    if settings.assume_hal0 is not None and not installed:
        table = _ASSUMED_RUNNERS  # what-if with no 1.4+ code installed
    else:
        table = runners.pins_runners(paths.runners, problems) if paths.runners else None
        if table is None:
            why = f"hal0 {base.release}: its runner table could not be read: every slot is kept"
            problems.append(FactProblem("hal0", str(paths.runners), why, not_understood=True))
            return dataclasses.replace(base, rule=Hal0Rule.NOT_PLACEABLE, rule_evidence=why)
        sources["runners"] = str(paths.runners)
    keys = frozenset(table)
    vulkan = sorted(k for k, backends in table.items() if "vulkan" in backends)
    marker = restore.active(paths.restore_marker, base.version, problems)
    converts = not marker
    profile_marker = paths.restore_marker.with_name(restore.PROFILE_CENTRIC_MARKER)
    backend_stood_down = restore.active(profile_marker, base.version, problems)
    pin_table, problem = manifest.pin_table(paths, problems, sources, settings.hal0_venv)
    capable = pins.capable(pin_table, vulkan) if pin_table is not None else frozenset()
    refs = {k: ref for k, p in (pin_table or {}).items() if (ref := p.ref) is not None}
    raw_images = operator_files.raw_default_images(paths.config, problems)
    if converts:
        raw_images = conversion.default_images_after(raw_images, keys)
    images = operator_files.validated_images(
        paths.config, raw_images, keys, {}, problems, schema=paths.schema
    )
    environment = operator_files.environment(paths.environment, problems)
    if converts:
        environment = conversion.environment_after(environment, keys)
    else:
        environment = {k: v for k, v in environment.items() if k.startswith(pins.ENV_PREFIX)}
    if settings.vulkan_validated_images is not None:
        capable = frozenset(settings.vulkan_validated_images)
        sources["capable"] = "setting vulkan_validated_images"
    for name in ("stale_images", "default_runner_image"):
        if getattr(settings, name) is not None:
            why = f"setting {name} means nothing to hal0 {base.release} (manifest pins): ignored"
            problems.append(FactProblem("settings", name, why))
    return dataclasses.replace(
        base,
        default_image=refs.get("standard", ""),
        capable=frozenset(capable),
        default_images=MappingProxyType(images),
        environment=MappingProxyType(environment),
        manifest=MappingProxyType(refs),
        sources=MappingProxyType(sources),
        runner_keys=keys,
        pins_problem=problem,
        converts=converts,
        backend_stood_down=backend_stood_down,
    )


_ASSUMED_RUNNERS: dict[str, tuple[str, ...]] = {
    "standard": ("rocm", "vulkan"),
    "cpu": ("cpu",),
    "cuda": ("cuda",),
}
"""What-if judging with no 1.4+ code installed: the llama.cpp runners every 1.4-1.7 has."""


def describe(facts: Hal0Facts) -> dict[str, Any]:
    """The facts as plain data, for `plan --json`, `probe` and the status file."""
    return {
        "version": facts.version,
        "release": facts.release,
        "summary": summary(facts),
        "default_image": facts.default_image or None,
        "vulkan_capable": sorted(facts.capable),
        "stale_defaults": sorted(facts.stale),
        "default_images": dict(facts.default_images) or None,
        "environment": dict(facts.environment) or None,
        "manifest": dict(facts.manifest) or None,
        "sources": dict(facts.sources),
        "rule": {"value": facts.rule.value, "evidence": facts.rule_evidence},
    }


def summary(facts: Hal0Facts) -> str:
    """One line: ``hal0 1.7.0: manifest pins, capable: ...``."""
    capable = ", ".join(sorted(facts.capable)) or "none"
    if facts.rule is Hal0Rule.NO_HAL0:
        return "no hal0 installed: nothing to judge against, every slot kept"
    if facts.rule is Hal0Rule.NOT_PLACEABLE or facts.release is None:
        return f"hal0 {facts.version or '(release unknown)'}: not placeable, every slot kept"
    name = release.BY_VERSION[facts.release].era_words
    head = f"hal0 {facts.release}"
    if facts.version and release.base_release(facts.version) != facts.release:
        head += f" (installed {facts.version})"
    if facts.rule is Hal0Rule.PRE_RULE:
        return f"{head}: {name}, gpu-vulkan is a normal lane: every slot kept"
    if facts.rule is Hal0Rule.PINS and facts.pins_problem is not None:
        return f"{head}: {name}, no valid pins: every slot kept"
    return f"{head}: {name}, capable: {capable}"


def _version(path: Path, problems: list[FactProblem]) -> str | None:
    try:
        text = read_text(path, missing_ok=True).strip()
    except SourceError as exc:
        problems.append(FactProblem("VERSION", str(path), str(exc)))
        return None
    return text or None


def _peek_version(settings: Settings) -> str | None:
    try:
        return read_text(settings.hal0_release_dir / "VERSION", missing_ok=True).strip() or None
    except SourceError:
        return None


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return fsio.identity_of(path.stat())
    except OSError:
        return None
