"""Where the installed hal0 keeps its facts, and the one way its files are read.

Every file is read through :mod:`hal0_reconciler.boundedread` (regular files only, never
blocking, capped: Python sources and the runner catalog 4 MiB, ``hal0.toml`` and the manifests
1 MiB, ``VERSION`` 64 KiB); a refusal is a :class:`SourceError` whose message says why in words.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import boundedread
from hal0_reconciler.settings import Settings

MAX_SOURCE_BYTES = 4 * 1024 * 1024  # Python sources and the catalog: hal0's are ~160 KB
MAX_CONFIG_BYTES = 1024 * 1024  # hal0.toml, the manifests
MAX_VERSION_BYTES = 64 * 1024
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
class Hal0Paths:
    """Where the installed hal0 keeps what the reconciler reads."""

    version: Path
    schema: Path | None  # None: no hal0 package found in the venv
    runners: Path | None
    config: Path
    environment: Path
    manifests: tuple[Path, ...]
    package_search: Path  # where the hal0 package was looked for
    catalog: Path | None = None  # hal0/lifecycle/data/catalog.json (catalog-built runners)
    updater: Path | None = None  # hal0/updater/updater.py (lane-retired evidence)
    gpu_guard: Path | None = None  # hal0/providers/_gpu.py (lane-retired evidence)

    def watched(self) -> tuple[Path, ...]:
        """What a hal0 update changes: every source, and the release link itself; with no
        hal0 package yet, where its ``schema.py`` would appear (a ``python3.*`` pattern, and
        each Python folder the venv has already)."""
        waiting: tuple[Path, ...] = ()
        if self.schema is None:
            lib = self.package_search.parents[2]  # <venv>/lib
            found = tuple(p / "site-packages" / "hal0" for p in _python_dirs(lib))
            waiting = tuple(p / "config" / "schema.py" for p in (self.package_search, *found))
        return (*self.files(), self.version.parent, *waiting)

    def files(self) -> tuple[Path, ...]:
        found = (self.schema, self.runners, self.catalog, self.updater, self.gpu_guard)
        return (
            self.version,
            *(p for p in found if p is not None),
            self.config,
            self.environment,
            *self.manifests,
        )


def hal0_paths(settings: Settings) -> Hal0Paths:
    """The source paths now (the venv's Python folder is found by listing it)."""
    package = hal0_package(settings.hal0_venv)
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
        catalog=package / "lifecycle" / "data" / "catalog.json" if package is not None else None,
        updater=package / "updater" / "updater.py" if package is not None else None,
        gpu_guard=package / "providers" / "_gpu.py" if package is not None else None,
    )


class SourceError(Exception):
    """A source file that could not be read (the message is for people)."""


def read_text(path: Path, *, cap: int = MAX_VERSION_BYTES, missing_ok: bool = False) -> str:
    """A regular file's text (through :mod:`boundedread`: never blocking, at most ``cap``
    bytes); "" for a missing one when allowed."""
    try:
        text = boundedread.read_bounded_text(path, max_bytes=cap, missing_ok=missing_ok)
    except boundedread.ReadRefused as exc:
        raise SourceError(exc.reason) from None
    return text or ""


def hal0_package(venv: Path) -> Path | None:
    """``<venv>/lib/pythonX.Y/site-packages/hal0``, the newest Python when there are several."""
    found = [
        (version, package)
        for version, folder in _python_versions(venv / "lib")
        if (package := folder / "site-packages" / "hal0").is_dir()
    ]
    return max(found)[1] if found else None


def _python_versions(lib: Path) -> list[tuple[tuple[int, int], Path]]:
    try:
        entries = list(os.scandir(lib))
    except OSError:
        return []
    return [
        ((int(m.group(1)), int(m.group(2))), Path(entry.path))
        for entry in entries
        if (m := _PYTHON_DIR.fullmatch(entry.name)) is not None
    ]


def _python_dirs(lib: Path) -> list[Path]:
    return [folder for _, folder in sorted(_python_versions(lib))]
