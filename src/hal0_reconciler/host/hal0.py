"""What the installed hal0 believes about images, read from its own files (never imported).

Sources (every path a setting; ``HAL0_HOME`` moves the hal0 roots):

- its version: ``/usr/lib/hal0/current/VERSION``;
- ``DEFAULT_ROCMFPX_IMAGE``, ``VULKAN_CAPABLE_IMAGE_REFS``, ``STALE_ROCMFPX_IMAGE_REFS`` from
  ``hal0/config/schema.py`` and the runner table from ``hal0/runners/__init__.py`` in hal0's
  venv (``/usr/lib/hal0/venv``), parsed by :mod:`hal0_reconciler.host.hal0_code`;
- ``[slots].default_images`` from ``/etc/hal0/hal0.toml``;
- ``HAL0_TOOLBOX_IMAGE_*`` from hal0's environment file (``/etc/hal0/api.env``);
- the manifest's digest refs (``/etc/hal0/manifest.json``, else ``current/manifest.json``).

The era of the installed hal0 is placed from what these files contain
(:mod:`hal0_reconciler.host.hal0_eras`): its Vulkan-lane rule and its runner table's shape, each
with its evidence. No hal0 at all: the newest known values, and a :class:`FactProblem` for each
missing source. A hal0 whose era cannot be placed keeps every slot, loudly: newest values are
never spliced into it. A setting overrides a set outright. :class:`Hal0Reader` re-reads only
when a source file changed (by identity).
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
from hal0_reconciler.host import envfile, hal0_code, hal0_eras, hal0_runners
from hal0_reconciler.host.hal0_sources import (
    MAX_CONFIG_BYTES,
    MAX_SOURCE_BYTES,
    FactProblem,
    Hal0Paths,
    SourceError,
    hal0_paths,
    read_text,
)
from hal0_reconciler.model import Hal0Facts, Hal0Rule, RunnerShape
from hal0_reconciler.settings import Settings
from hal0_reconciler.slots import image

_SCHEMA_NAMES = ("DEFAULT_ROCMFPX_IMAGE", "VULKAN_CAPABLE_IMAGE_REFS", "STALE_ROCMFPX_IMAGE_REFS")
_WANTED = (*_SCHEMA_NAMES, "VULKAN_FIXED_IMAGE")
_FACT_OF_NAME = {
    "DEFAULT_ROCMFPX_IMAGE": "default_image",
    "VULKAN_CAPABLE_IMAGE_REFS": "capable",
    "STALE_ROCMFPX_IMAGE_REFS": "stale",
}
_ENV_PREFIX = "HAL0_TOOLBOX_IMAGE_"
__all__ = ["FactProblem", "Hal0Paths", "Hal0Read", "Hal0Reader", "describe", "hal0_paths"]


@dataclass(frozen=True)
class Hal0Read:
    """hal0's facts as read, and each source that fell back to known values."""

    facts: Hal0Facts
    problems: tuple[FactProblem, ...]


class Hal0Reader:
    """Reads hal0's facts; cheap when nothing changed (``stat`` calls only)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._identity: tuple[object, ...] | None = None
        self._last: Hal0Read | None = None

    def read(self) -> Hal0Read:
        paths = hal0_paths(self._settings)
        identity = (paths, *(_identity(p) for p in paths.files()))
        if self._last is None or identity != self._identity:
            try:
                self._last = read_facts(self._settings, paths)
            except Exception as exc:  # no hal0 file, however odd, stops a pass: nothing moves
                why = f"could not be read ({errors.describe(exc)}): every slot is kept"
                problem = FactProblem("hal0", str(paths.package_search), why, not_understood=True)
                facts = dataclasses.replace(
                    image.NEWEST_KNOWN, rule=Hal0Rule.NOT_UNDERSTOOD, rule_evidence=why
                )
                self._last = Hal0Read(facts, (problem,))
            self._identity = identity
        return self._last


def read_facts(settings: Settings, paths: Hal0Paths | None = None) -> Hal0Read:
    """Read every source now; each module is parsed once (its tree dropped when done)."""
    try:
        return _read_facts(settings, paths)
    finally:
        hal0_code.forget()


def _read_facts(settings: Settings, paths: Hal0Paths | None) -> Hal0Read:
    """Read every source now; place the installed hal0's era; a problem for each source that
    failed. No hal0 at all: the newest known facts. A hal0 that cannot be placed: its rule is
    ``not-understood`` (every slot is kept), never newest values spliced into it."""
    paths = paths if paths is not None else hal0_paths(settings)
    problems: list[FactProblem] = []
    newest = image.NEWEST_KNOWN
    sources: dict[str, str] = dict(newest.sources)

    version = _version(paths.version, problems)
    sources["version"] = str(paths.version) if version is not None else "unknown"
    installed = version is not None or paths.schema is not None

    schema = _schema(paths, problems)
    values = schema.values
    default_image = _pick(values, "DEFAULT_ROCMFPX_IMAGE", str, newest.default_image)
    capable = _pick(values, "VULKAN_CAPABLE_IMAGE_REFS", frozenset, frozenset())
    stale = _pick(values, "STALE_ROCMFPX_IMAGE_REFS", frozenset, frozenset())
    if not installed:
        capable, stale = newest.capable, newest.stale
    for name, fact in _FACT_OF_NAME.items():
        if name in values and paths.schema is not None:
            sources[fact] = f"{paths.schema} ({name})"

    table = hal0_runners.runner_table(paths, values, default_image, problems)
    if table is not None:
        sources["bundled"] = str(paths.runners)
        bundled, manifest_keys, aliases = table.images, table.manifest_keys, table.aliases
    else:
        bundled = {**newest.bundled, "rocmfpx": default_image}
        manifest_keys, aliases = dict(newest.manifest_keys), dict(newest.aliases)

    placement = _placement(installed, paths, schema, table, problems)
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

    manifest, manifest_tags = _manifest(paths.manifests, problems, sources)
    facts = Hal0Facts(
        version=version,
        default_image=default_image.strip(),
        capable=frozenset(capable),  # as hal0 holds them: its tests strip the image, not these
        stale=frozenset(stale),
        bundled=MappingProxyType(dict(bundled)),
        manifest_keys=MappingProxyType(dict(manifest_keys)),
        aliases=MappingProxyType(dict(aliases)),
        default_images=MappingProxyType(
            _default_images(paths.config, set(bundled) | _unknown(table), aliases, problems)
        ),
        environment=MappingProxyType(_environment(paths.environment, problems)),
        manifest=MappingProxyType(manifest),
        sources=MappingProxyType(sources),
        rule=placement.rule,
        rule_evidence=placement.evidence,
        runners_shape=table.shape if table is not None else RunnerShape.LITERAL,
        runners_evidence=table.evidence if table is not None else _NO_TABLE,
        vulkan_runner=table.vulkan_runner if table is not None else "rocmfpx",
        unknown_runners=_unknown(table),
        manifest_tags=MappingProxyType(manifest_tags),
    )
    return Hal0Read(facts, tuple(problems))


_NO_TABLE = "no runner table read: the newest known one (rocmfpx/vulkanfpx collapsed)"


def _unknown(table: hal0_runners.Table | None) -> frozenset[str]:
    return table.unknown if table is not None else frozenset()


def _placement(
    installed: bool,
    paths: Hal0Paths,
    schema: _Schema,
    table: hal0_runners.Table | None,
    problems: list[FactProblem],
) -> hal0_eras.Placement:
    """The rule of the installed hal0 (loud when it cannot be placed)."""
    if not installed:
        why = "no hal0 installed (no VERSION, no hal0 package): the newest known rule"
        return hal0_eras.Placement(Hal0Rule.ALLOWLIST, why)
    schema_problem = schema.problem
    if schema_problem is None and table is None:
        schema_problem = "its runner table could not be read"
    retirement: str | None = None
    retirement_problem: str | None = None
    if schema_problem is None and hal0_eras.CAPABLE not in schema.assigned:
        retirement, retirement_problem = _retirement(paths)
    placement = hal0_eras.place_rule(
        schema_problem=schema_problem,
        assigned=schema.assigned,
        understood=frozenset(schema.values),
        retirement=retirement,
        retirement_problem=retirement_problem,
    )
    if placement.rule is Hal0Rule.NOT_UNDERSTOOD:
        why = f"its era could not be placed ({placement.evidence}): every slot is kept"
        where = str(paths.schema or paths.package_search)
        problems.append(FactProblem("hal0", where, why, not_understood=True))
    return placement


def _retirement(paths: Hal0Paths) -> tuple[str | None, str | None]:
    """The evidence that this hal0 retired the Vulkan lane, or why it could not be looked for."""
    checks = (
        (paths.updater, hal0_eras.RELABEL_FUNCTION),
        (paths.gpu_guard, hal0_eras.GPU_GUARD),
    )
    unread: list[str] = []
    for path, function in checks:
        if path is None:
            continue
        try:
            text = read_text(path, missing_ok=True)
            found = hal0_code.top_level_functions(text, mentioning="gpu-vulkan") if text else ()
            if function in found:
                return f"{path.name} defines {function}, which moves gpu-vulkan slots", None
        except (SourceError, hal0_code.Hal0CodeError) as exc:
            unread.append(f"{path} was not read ({exc})")
    return None, "; ".join(unread) or None


def describe(facts: Hal0Facts) -> dict[str, Any]:
    """The facts as plain data, for `plan --json`, `probe` and the status file."""
    return {
        "version": facts.version,
        "default_image": facts.default_image,
        "vulkan_capable": sorted(facts.capable),
        "stale_defaults": sorted(facts.stale),
        "default_images": dict(facts.default_images) or None,
        "environment": dict(facts.environment) or None,
        "manifest": dict(facts.manifest) or None,
        "sources": dict(facts.sources),
        "rule": {"value": facts.rule.value, "evidence": facts.rule_evidence},
        "runners": {"value": facts.runners_shape.value, "evidence": facts.runners_evidence},
    }


# -- one source each ---------------------------------------------------------------------------
def _version(path: Path, problems: list[FactProblem]) -> str | None:
    try:
        text = read_text(path).strip()
    except SourceError as exc:
        problems.append(FactProblem("VERSION", str(path), str(exc)))
        return None
    return text.splitlines()[0].strip() if text else None


@dataclass(frozen=True)
class _Schema:
    values: dict[str, str | frozenset[str]]
    assigned: frozenset[str]  # the names of interest schema.py assigns (understood or not)
    problem: str | None  # schema.py missing, unreadable or not Python: the era is unknown


def _schema(paths: Hal0Paths, problems: list[FactProblem]) -> _Schema:
    fallback = "the era cannot be placed"
    if paths.schema is None:
        why = f"no hal0 package at {paths.package_search}"
        problems.append(FactProblem("schema.py", str(paths.package_search), why))
        return _Schema({}, frozenset(), why)
    try:
        text = read_text(paths.schema, cap=MAX_SOURCE_BYTES)
        values, errors = hal0_code.module_values(text, wanted=_WANTED)
    except SourceError as exc:
        problems.append(FactProblem("schema.py", str(paths.schema), f"{exc}: {fallback}"))
        return _Schema({}, frozenset(), str(exc))
    except hal0_code.Hal0CodeError as exc:
        problems.append(
            FactProblem("schema.py", str(paths.schema), f"{exc}: {fallback}", not_understood=True)
        )
        return _Schema({}, frozenset(), str(exc))
    where = str(paths.schema)
    problems.extend(
        FactProblem("schema.py", where, errors[n], not_understood=True)
        for n in _SCHEMA_NAMES
        if n in errors
    )
    assigned = frozenset(n for n in _WANTED if n in values or n in errors)
    return _Schema(values, assigned, None)


def _default_images(
    path: Path, runners: set[str], aliases: Mapping[str, str], problems: list[FactProblem]
) -> dict[str, str]:
    """``[slots].default_images`` as hal0 loads it: all of it, or none when hal0 would refuse
    its ``hal0.toml`` (not TOML, or one entry its validator rejects)."""
    try:
        data = tomllib.loads(read_text(path, missing_ok=True, cap=MAX_CONFIG_BYTES))
    except SourceError as exc:
        problems.append(FactProblem("hal0.toml", str(path), f"{exc}: no default_images used"))
        return {}
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        why = f"not valid TOML ({exc}): no default_images used"
        problems.append(FactProblem("hal0.toml", str(path), why))
        return {}
    table = data.get("slots", {})
    if not isinstance(table, dict) or "default_images" not in table:
        return {}
    images, refused = hal0_eras.validate_default_images(table["default_images"], runners, aliases)
    if refused is not None:
        why = f"{refused}: hal0 refuses this hal0.toml, so no default_images are used"
        problems.append(FactProblem("hal0.toml", str(path), why))
    return images


def _environment(path: Path, problems: list[FactProblem]) -> dict[str, str]:
    try:
        values = envfile.read_env_file(path)
    except UnicodeDecodeError:
        why = "not UTF-8: no HAL0_TOOLBOX_IMAGE_* used"
        problems.append(FactProblem("environment", str(path), why))
        return {}
    except OSError as exc:
        why = f"cannot be read ({_why(exc)}): no HAL0_TOOLBOX_IMAGE_* used"
        problems.append(FactProblem("environment", str(path), why))
        return {}
    return {k: v for k, v in values.items() if k.startswith(_ENV_PREFIX)}


def _manifest(
    candidates: tuple[Path, ...], problems: list[FactProblem], sources: dict[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """hal0's ``manifest_image_ref`` for every key (``<repo>@<digest>``, else the tag), and the
    tag of each digest ref (hal0 compares the digest ref as it is: ``plan`` says so)."""
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
            return {}, {}
        sources["manifest"] = str(path)
        images = data.get("toolbox_images") if isinstance(data, dict) else None
        if not isinstance(images, dict):
            return {}, {}
        refs = {key: ref for key, entry in images.items() if (ref := _manifest_ref(entry))}
        tags = {
            key: str(images[key]["tag"])
            for key, ref in refs.items()
            if "@" in ref and images[key].get("tag") and "@" not in str(images[key]["tag"])
        }
        return refs, tags
    return {}, {}


def _manifest_ref(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return None
    tag, digest = entry.get("tag"), entry.get("digest")
    tag = str(tag) if tag else None
    if isinstance(digest, str) and digest.startswith("sha256:") and tag and "@" not in tag:
        repo = tag.rsplit(":", 1)[0] if ":" in tag.split("/")[-1] else tag
        return f"{repo}@{digest}"
    return tag


def _pick(values: Mapping[str, object], name: str, kind: type, fallback: Any) -> Any:
    value = values.get(name)
    return value if isinstance(value, kind) else fallback


# -- files -------------------------------------------------------------------------------------
def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return fsio.identity_of(path.stat())
    except OSError:
        return None


def _why(exc: OSError) -> str:
    """An OS error for people: its text, without Python's ``[Errno N]`` decoration."""
    return (exc.strerror or type(exc).__name__).lower()
