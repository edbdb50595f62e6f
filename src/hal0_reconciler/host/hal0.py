"""What the installed hal0 believes about images, read from its own files (never imported).

Sources (every path a setting; ``HAL0_HOME`` moves the hal0 roots):

- its version: ``/usr/lib/hal0/current/VERSION``;
- ``DEFAULT_ROCMFPX_IMAGE``, ``VULKAN_CAPABLE_IMAGE_REFS``, ``STALE_ROCMFPX_IMAGE_REFS`` from
  ``hal0/config/schema.py`` and the runner table from ``hal0/runners/__init__.py`` in hal0's
  venv (``/usr/lib/hal0/venv``), parsed by :mod:`hal0_reconciler.host.hal0_code`;
- ``[slots].default_images`` from ``/etc/hal0/hal0.toml``;
- ``HAL0_TOOLBOX_IMAGE_*`` from hal0's environment file (``/etc/hal0/api.env``);
- the manifest's digest refs (``/etc/hal0/manifest.json``, else ``current/manifest.json``).

A source that is missing, unreadable or not understood gives the newest known values for what it
would have said, and a :class:`FactProblem` that says which source and why. A setting overrides
a set outright. :class:`Hal0Reader` re-reads only when a source file changed (by identity).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hal0_reconciler import errors, fsio
from hal0_reconciler.host import envfile, hal0_code
from hal0_reconciler.model import Hal0Facts
from hal0_reconciler.settings import Settings
from hal0_reconciler.slots import image

_MAX_SOURCE_BYTES = 4 * 1024 * 1024  # hal0's schema.py is ~140 KB
_SCHEMA_NAMES = ("DEFAULT_ROCMFPX_IMAGE", "VULKAN_CAPABLE_IMAGE_REFS", "STALE_ROCMFPX_IMAGE_REFS")
_FACT_OF_NAME = {
    "DEFAULT_ROCMFPX_IMAGE": "default_image",
    "VULKAN_CAPABLE_IMAGE_REFS": "capable",
    "STALE_ROCMFPX_IMAGE_REFS": "stale",
}
_ENV_PREFIX = "HAL0_TOOLBOX_IMAGE_"
_PYTHON_DIR = re.compile(r"python(\d+)\.(\d+)")


@dataclass(frozen=True)
class FactProblem:
    """One hal0 source that could not give its facts, and what is used instead."""

    source: str  # "schema.py", "runners", "VERSION", "hal0.toml", "environment", "manifest"
    path: str
    why: str
    not_understood: bool = False  # hal0's code has a shape the parser does not know: loud

    def line(self) -> str:
        return f"{self.source} ({self.path}): {self.why}"


@dataclass(frozen=True)
class Hal0Read:
    """hal0's facts as read, and each source that fell back to known values."""

    facts: Hal0Facts
    problems: tuple[FactProblem, ...]


@dataclass(frozen=True)
class Hal0Paths:
    """Where the installed hal0 keeps what the reconciler reads."""

    version: Path
    schema: Path | None  # None: no hal0 package found in the venv
    runners: Path | None
    config: Path
    environment: Path
    manifests: tuple[Path, ...]
    package_search: Path  # where the hal0 package was looked for

    def watched(self) -> tuple[Path, ...]:
        """What a hal0 update changes: every source, and the release link itself."""
        return (*self.files(), self.version.parent)

    def files(self) -> tuple[Path, ...]:
        found = (self.schema, self.runners)
        return (
            self.version,
            *(p for p in found if p is not None),
            self.config,
            self.environment,
            *self.manifests,
        )


def hal0_paths(settings: Settings) -> Hal0Paths:
    """The source paths now (the venv's Python folder is found by listing it)."""
    package = _hal0_package(settings.hal0_venv)
    manifests = (
        (settings.manifest_file,)
        if settings.manifest_file is not None
        else (
            settings.hal0_config_file.parent / "manifest.json",
            settings.hal0_release_dir / "manifest.json",
        )
    )
    return Hal0Paths(
        version=settings.hal0_release_dir / "VERSION",
        schema=package / "config" / "schema.py" if package is not None else None,
        runners=package / "runners" / "__init__.py" if package is not None else None,
        config=settings.hal0_config_file,
        environment=settings.api_env_file,
        manifests=manifests,
        package_search=settings.hal0_venv / "lib" / "python3.*" / "site-packages" / "hal0",
    )


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
            except Exception as exc:  # no hal0 file, however odd, stops a pass: newest known
                why = f"could not be read ({errors.describe(exc)}): newest known values used"
                problem = FactProblem("hal0", str(paths.package_search), why, not_understood=True)
                self._last = Hal0Read(image.NEWEST_KNOWN, (problem,))
            self._identity = identity
        return self._last


def read_facts(settings: Settings, paths: Hal0Paths | None = None) -> Hal0Read:
    """Read every source now; fall back per fact, with a problem for each source that failed."""
    paths = paths if paths is not None else hal0_paths(settings)
    problems: list[FactProblem] = []
    newest = image.NEWEST_KNOWN
    sources: dict[str, str] = dict(newest.sources)

    version = _version(paths.version, problems)
    sources["version"] = str(paths.version) if version is not None else "unknown"

    schema_values = _schema(paths, problems)
    default_image = _pick(schema_values, "DEFAULT_ROCMFPX_IMAGE", str, newest.default_image)
    capable = _pick(schema_values, "VULKAN_CAPABLE_IMAGE_REFS", frozenset, newest.capable)
    stale = _pick(schema_values, "STALE_ROCMFPX_IMAGE_REFS", frozenset, newest.stale)
    for name, fact in _FACT_OF_NAME.items():
        if name in schema_values and paths.schema is not None:
            sources[fact] = f"{paths.schema} ({name})"

    bundled, manifest_keys, aliases = _runner_table(paths, schema_values, default_image, problems)
    if bundled is not None:
        sources["bundled"] = str(paths.runners)
    else:
        bundled = {**newest.bundled, "rocmfpx": default_image}
        manifest_keys, aliases = dict(newest.manifest_keys), dict(newest.aliases)

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

    facts = Hal0Facts(
        version=version,
        default_image=default_image.strip(),
        capable=frozenset(i.strip() for i in capable),
        stale=frozenset(i.strip() for i in stale),
        bundled=MappingProxyType(dict(bundled)),
        manifest_keys=MappingProxyType(dict(manifest_keys)),
        aliases=MappingProxyType(dict(aliases)),
        default_images=MappingProxyType(_default_images(paths.config, problems)),
        environment=MappingProxyType(_environment(paths.environment, problems)),
        manifest=MappingProxyType(_manifest(paths.manifests, problems, sources)),
        sources=MappingProxyType(sources),
    )
    return Hal0Read(facts, tuple(problems))


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
    }


# -- one source each ---------------------------------------------------------------------------
def _version(path: Path, problems: list[FactProblem]) -> str | None:
    try:
        text = _read_text(path).strip()
    except _SourceError as exc:
        problems.append(FactProblem("VERSION", str(path), str(exc)))
        return None
    return text.splitlines()[0].strip() if text else None


def _schema(paths: Hal0Paths, problems: list[FactProblem]) -> dict[str, str | frozenset[str]]:
    fallback = "the newest known image sets are used"
    if paths.schema is None:
        why = f"no hal0 package at {paths.package_search}: {fallback}"
        problems.append(FactProblem("schema.py", str(paths.package_search), why))
        return {}
    try:
        text = _read_text(paths.schema)
        values, errors = hal0_code.module_values(text, wanted=_SCHEMA_NAMES)
    except _SourceError as exc:
        problems.append(FactProblem("schema.py", str(paths.schema), f"{exc}: {fallback}"))
        return {}
    except hal0_code.Hal0CodeError as exc:
        problems.append(
            FactProblem("schema.py", str(paths.schema), f"{exc}: {fallback}", not_understood=True)
        )
        return {}
    for name in _SCHEMA_NAMES:
        if name in errors:
            why = f"{errors[name]}: the newest known value is used"
            problems.append(FactProblem("schema.py", str(paths.schema), why, not_understood=True))
        elif name not in values:
            why = f"defines no {name}: the newest known value is used"
            problems.append(FactProblem("schema.py", str(paths.schema), why))
    return values


def _runner_table(
    paths: Hal0Paths,
    schema_values: Mapping[str, str | frozenset[str]],
    default_image: str,
    problems: list[FactProblem],
) -> tuple[dict[str, str] | None, dict[str, str], dict[str, str]]:
    """The runner table; images named from schema.py resolve to its values (to the fallbacks
    when schema.py could not be read: that was said already, so no second problem)."""
    fallback = "the newest known runner table is used"
    if paths.runners is None:
        return None, {}, {}  # said once already, for schema.py
    newest = image.NEWEST_KNOWN
    try:
        text = _read_text(paths.runners)
        names = hal0_code.imported_names(text, "hal0.config.schema")
        known = {**schema_values, "DEFAULT_ROCMFPX_IMAGE": default_image}
        imported = {n: v for n in names if isinstance(v := known.get(n), str)}
        table = hal0_code.runners(text, imported=imported)
    except _SourceError as exc:
        problems.append(FactProblem("runners", str(paths.runners), f"{exc}: {fallback}"))
        return None, {}, {}
    except hal0_code.Hal0CodeError as exc:
        problems.append(
            FactProblem("runners", str(paths.runners), f"{exc}: {fallback}", not_understood=True)
        )
        return None, {}, {}
    images = dict(table.images)
    if schema_values:
        problems.extend(
            FactProblem("runners", str(paths.runners), f"{why}: left out", not_understood=True)
            for why in table.problems
        )
    else:
        images = {**newest.bundled, **images}
    return images, table.manifest_keys, table.aliases or dict(newest.aliases)


def _default_images(path: Path, problems: list[FactProblem]) -> dict[str, str]:
    try:
        data = tomllib.loads(_read_text(path, missing_ok=True))
    except _SourceError as exc:
        problems.append(FactProblem("hal0.toml", str(path), f"{exc}: no default_images used"))
        return {}
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        why = f"not valid TOML ({exc}): no default_images used"
        problems.append(FactProblem("hal0.toml", str(path), why))
        return {}
    table = data.get("slots", {})
    images = table.get("default_images", {}) if isinstance(table, dict) else {}
    if not isinstance(images, dict):
        why = "[slots].default_images is not a table: not used"
        problems.append(FactProblem("hal0.toml", str(path), why))
        return {}
    return {k: v for k, v in images.items() if isinstance(v, str)}


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
) -> dict[str, str]:
    """hal0's ``manifest_image_ref`` for every key: ``<repo>@<digest>``, else the tag."""
    for path in candidates:
        try:
            text = _read_text(path, missing_ok=True)
        except _SourceError as exc:
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


def _pick(values: Mapping[str, object], name: str, kind: type, fallback: Any) -> Any:
    value = values.get(name)
    return value if isinstance(value, kind) else fallback


# -- files -------------------------------------------------------------------------------------
class _SourceError(Exception):
    """A source file that could not be read (the message is for people)."""


def _read_text(path: Path, *, missing_ok: bool = False) -> str:
    """A regular file's text, at most ``_MAX_SOURCE_BYTES``; "" for a missing one when allowed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        if missing_ok:
            return ""
        raise _SourceError("missing") from None
    except OSError as exc:
        raise _SourceError(f"cannot be opened ({_why(exc)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _SourceError("not a regular file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(_MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise _SourceError(f"cannot be read ({_why(exc)})") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_SOURCE_BYTES:
        raise _SourceError(f"larger than {_MAX_SOURCE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _SourceError("not UTF-8") from None


def _hal0_package(venv: Path) -> Path | None:
    """``<venv>/lib/pythonX.Y/site-packages/hal0``, the newest Python when there are several."""
    found: list[tuple[tuple[int, int], Path]] = []
    try:
        entries = list(os.scandir(venv / "lib"))
    except OSError:
        return None
    for entry in entries:
        match = _PYTHON_DIR.fullmatch(entry.name)
        package = Path(entry.path) / "site-packages" / "hal0"
        if match is not None and package.is_dir():
            found.append(((int(match.group(1)), int(match.group(2))), package))
    return max(found)[1] if found else None


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return fsio.identity_of(path.stat())
    except OSError:
        return None


def _why(exc: OSError) -> str:
    """An OS error for people: its text, without Python's ``[Errno N]`` decoration."""
    return (exc.strerror or type(exc).__name__).lower()
