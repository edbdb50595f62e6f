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
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hal0_reconciler import errors, fsio
from hal0_reconciler.host import envfile
from hal0_reconciler.host.hal0 import api_start, defaults, pins, pysource, release, runners
from hal0_reconciler.host.hal0.paths import Hal0Paths, hal0_paths
from hal0_reconciler.host.hal0.sources import (
    MAX_CONFIG_BYTES,
    MAX_SOURCE_BYTES,
    FactProblem,
    SourceError,
    read_text,
)
from hal0_reconciler.model import Hal0Facts, Hal0Rule
from hal0_reconciler.settings import Settings
from hal0_reconciler.slots import conversion

_SCHEMA_NAMES = ("DEFAULT_ROCMFPX_IMAGE", "VULKAN_CAPABLE_IMAGE_REFS", "STALE_ROCMFPX_IMAGE_REFS")
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

    def read(self) -> Hal0Read:
        paths = hal0_paths(self._settings, _peek_version(self._settings))
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
        restart_budget=rel.restart_budget,
    )
    if rel.rule is Hal0Rule.PINS:
        facts = _pins_facts(settings, paths, base, problems)
    elif rel.rule is Hal0Rule.ALLOWLIST:
        facts = _allowlist_facts(settings, paths, base, rel, problems)
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
        values, errs = pysource.module_values(text, wanted=_SCHEMA_NAMES)
    except (SourceError, pysource.Hal0CodeError) as exc:
        problems.append(FactProblem("schema.py", str(paths.schema), str(exc), not_understood=True))
        return release.Structure.UNKNOWN, f"schema.py: {exc}", {}
    problems.extend(
        FactProblem("schema.py", str(paths.schema), errs[n], not_understood=True)
        for n in _SCHEMA_NAMES
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
    marker = _restore_marker(paths.restore_marker, base.version, problems)
    converts = not marker
    pin_table, problem = _pins(paths, problems, sources, settings.hal0_venv)
    capable = pins.capable(pin_table, vulkan) if pin_table is not None else frozenset()
    refs = {k: ref for k, p in (pin_table or {}).items() if (ref := p.ref) is not None}
    raw_images = _raw_default_images(paths.config, problems)
    if converts:
        raw_images = conversion.default_images_after(raw_images, keys)
    images = _validated_images(paths.config, raw_images, keys, {}, problems)
    environment = _environment(paths.environment, problems)
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
    )


_ASSUMED_RUNNERS: dict[str, tuple[str, ...]] = {
    "standard": ("rocm", "vulkan"),
    "cpu": ("cpu",),
    "cuda": ("cuda",),
}
"""What-if judging with no 1.4+ code installed: the llama.cpp runners every 1.4-1.7 has."""


def _note_newer_than_api(path: Path, venv: Path | None, problems: list[FactProblem]) -> None:
    """Say so when the manifest changed after the running hal0-api read its own copy."""
    if venv is None:
        return
    try:
        changed = path.stat().st_mtime
    except OSError:
        return
    started = api_start.started_at(venv)
    if started is not None and changed > started:
        why = (
            "changed after hal0-api started: judged by the file; hal0-api judges by the "
            "manifest it read until it restarts"
        )
        problems.append(FactProblem("manifest", str(path), why))


def _pins(
    paths: Hal0Paths,
    problems: list[FactProblem],
    sources: dict[str, str],
    venv: Path | None = None,
) -> tuple[dict[str, pins.Pin] | None, str | None]:
    """The first manifest of 1.4+'s search order, parsed; or why there are no pins (loud)."""
    candidates = paths.manifests(pins_era=True)
    for path in candidates:
        try:
            text = read_text(path, missing_ok=True, cap=MAX_CONFIG_BYTES)
        except SourceError as exc:
            why = f"{path}: {exc}"
            break
        if not text and not path.exists():
            continue
        sources["manifest"] = str(path)
        try:
            table = pins.parse(json.loads(text))
        except (ValueError, RecursionError) as exc:
            why = f"{path}: not valid JSON ({exc})"
        except pins.PinsError as exc:
            why = f"{path}: {exc}"
        else:
            _note_newer_than_api(path, venv, problems)
            return table, None
        break
    else:
        why = f"no manifest.json (looked at {', '.join(str(p) for p in candidates)})"
    line = (
        f"{why}: hal0 calls every gpu-vulkan slot not capable here; every slot is kept until "
        "the manifest is valid"
    )
    problems.append(FactProblem("manifest", str(candidates[0]), line, not_understood=True))
    return None, line


def _restore_marker(path: Path, version: str | None, problems: list[FactProblem]) -> bool:
    """Whether hal0's downgrade restore marker holds (written under the running release)."""
    try:
        text = read_text(path, missing_ok=True)
    except SourceError as exc:
        problems.append(FactProblem("restore marker", str(path), f"{exc}: judged as absent"))
        return False
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "version":
            active = version is not None and value.strip() == version.strip()
            if active:
                why = "holds: hal0 does not convert this install, raw values are judged"
                problems.append(FactProblem("restore marker", str(path), why))
            return active
    return False


# -- 1.0-1.3: the schema allowlist ---------------------------------------------------------------
def _allowlist_facts(
    settings: Settings,
    paths: Hal0Paths,
    base: Hal0Facts,
    rel: release.Release,
    problems: list[FactProblem],
) -> Hal0Facts:
    sources: dict[str, str] = {"version": str(paths.version)}
    values: Mapping[str, str | frozenset[str]] = {}
    if paths.schema is not None:
        try:
            text = read_text(paths.schema, cap=MAX_SOURCE_BYTES)
            values = pysource.module_values(text, wanted=_SCHEMA_NAMES)[0]
        except (SourceError, pysource.Hal0CodeError):
            values = {}
    default_image = _pick(values, "DEFAULT_ROCMFPX_IMAGE", str, "")
    capable = _pick(values, "VULKAN_CAPABLE_IMAGE_REFS", frozenset, frozenset())
    stale = _pick(values, "STALE_ROCMFPX_IMAGE_REFS", frozenset, frozenset())
    for name, fact in zip(_SCHEMA_NAMES, ("default_image", "capable", "stale"), strict=True):
        if name in values:
            sources[fact] = f"{paths.schema} ({name})"
    table = (
        runners.allowlist_table(paths.runners, values, default_image, problems)
        if paths.runners is not None
        else None
    )
    if table is None:
        why = f"hal0 {rel.version}: its runner table could not be read: every slot is kept"
        problems.append(FactProblem("hal0", str(paths.runners), why, not_understood=True))
        return dataclasses.replace(base, rule=Hal0Rule.NOT_PLACEABLE, rule_evidence=why)
    sources["bundled"] = str(paths.runners)
    bundled, aliases = table.images, table.aliases if rel.folds_aliases else {}
    if settings.vulkan_validated_images is not None:
        capable = frozenset(settings.vulkan_validated_images)
        sources["capable"] = "setting vulkan_validated_images"
    if settings.stale_images is not None:
        stale = frozenset(settings.stale_images)
        sources["stale"] = "setting stale_images"
    if settings.default_runner_image is not None:
        default_image = settings.default_runner_image
        bundled = {**bundled, "rocmfpx": default_image}
        sources["default_image"] = sources["bundled"] = "setting default_runner_image"
    said = len(problems)
    raw_images = _raw_default_images(paths.config, problems)
    images = _validated_images(paths.config, raw_images, set(bundled), aliases, problems)
    stops = (
        f"; hal0 {rel.version}'s own boot pass stops at this file (its config migration fails "
        "before its relabel), the reconciler still judges every slot"
    )
    problems[said:] = [
        dataclasses.replace(p, why=p.why + stops)
        if p.source == "hal0.toml" and ("refuses" in p.why or "not valid TOML" in p.why)
        else p
        for p in problems[said:]
    ]
    environment = {
        k: v
        for k, v in _environment(paths.environment, problems).items()
        if k.startswith("HAL0_TOOLBOX_IMAGE_")
    }
    manifest = _toolbox_manifest(paths.manifests(pins_era=False), problems, sources)
    return dataclasses.replace(
        base,
        default_image=default_image.strip(),
        capable=frozenset(capable),
        stale=frozenset(stale),
        bundled=MappingProxyType(dict(bundled)),
        manifest_keys=MappingProxyType(dict(table.manifest_keys)),
        aliases=MappingProxyType(dict(aliases)),
        default_images=MappingProxyType(images),
        environment=MappingProxyType(environment),
        manifest=MappingProxyType(manifest),
        sources=MappingProxyType(sources),
    )


def _toolbox_manifest(
    candidates: tuple[Path, ...], problems: list[FactProblem], sources: dict[str, str]
) -> dict[str, str]:
    """1.0-1.3's ``manifest_image_ref`` for every ``toolbox_images`` key (``<repo>@<digest>``,
    else the tag); a missing or bad manifest gives none (hal0 then uses the bundled image)."""
    for path in candidates:
        try:
            text = read_text(path, missing_ok=True, cap=MAX_CONFIG_BYTES)
        except SourceError as exc:
            problems.append(FactProblem("manifest", str(path), f"{exc}: not used"))
            continue
        if not text:
            continue
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            problems.append(FactProblem("manifest", str(path), f"not valid JSON ({exc}): not used"))
            return {}
        sources["manifest"] = str(path)
        images = data.get("toolbox_images") if isinstance(data, dict) else None
        if not isinstance(images, dict):
            return {}
        return {key: ref for key, entry in images.items() if (ref := _manifest_ref(entry))}
    return {}


def _manifest_ref(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return None
    tag, digest = entry.get("tag"), entry.get("digest")
    tag = str(tag) if tag else None
    if isinstance(digest, str) and digest.startswith("sha256:") and tag and "@" not in tag:
        repo = tag.rsplit(":", 1)[0] if ":" in tag.split("/")[-1] else tag
        return f"{repo}@{digest}"
    return tag


# -- shared sources ---------------------------------------------------------------------------
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


def _raw_default_images(path: Path, problems: list[FactProblem]) -> object:
    """``[slots].default_images`` as written (None: none; hal0.toml unreadable: said)."""
    try:
        data = tomllib.loads(read_text(path, missing_ok=True, cap=MAX_CONFIG_BYTES))
    except SourceError as exc:
        problems.append(FactProblem("hal0.toml", str(path), f"{exc}: no default_images used"))
        return None
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        why = f"not valid TOML ({exc}): no default_images used"
        problems.append(FactProblem("hal0.toml", str(path), why))
        return None
    table = data.get("slots", {})
    if not isinstance(table, dict):
        return None
    return table.get("default_images")


def _validated_images(
    path: Path,
    raw: object,
    runner_keys: set[str] | frozenset[str],
    aliases: Mapping[str, str],
    problems: list[FactProblem],
) -> dict[str, str]:
    if raw is None:
        return {}
    images, refused = defaults.validate(raw, runner_keys, aliases)
    if refused is not None:
        why = f"{refused}: hal0 refuses this hal0.toml, so no default_images are used"
        problems.append(FactProblem("hal0.toml", str(path), why))
    return images


def _environment(path: Path, problems: list[FactProblem]) -> dict[str, str]:
    try:
        values = envfile.read_env_file(path)
    except OSError as exc:
        why = f"cannot be read ({_why(exc)}): no image overrides used"
        problems.append(FactProblem("environment", str(path), why))
        return {}
    return {
        k: v for k, v in values.items() if k.startswith(("HAL0_TOOLBOX_IMAGE_", pins.ENV_PREFIX))
    }


def _pick(values: Mapping[str, object], name: str, kind: type, fallback: Any) -> Any:
    value = values.get(name)
    return value if isinstance(value, kind) else fallback


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return fsio.identity_of(path.stat())
    except OSError:
        return None


def _why(exc: OSError) -> str:
    """An OS error for people: its text, without Python's ``[Errno N]`` decoration."""
    return (exc.strerror or type(exc).__name__).lower()
