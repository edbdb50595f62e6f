"""Where the installed hal0 keeps what the reconciler reads, laid out as hal0 lays it out.

FHS: the venv ``/usr/lib/hal0/venv``, the release tree ``/usr/lib/hal0/current`` (its
``VERSION``), ``/etc/hal0`` (``hal0.toml``, ``api.env``, ``manifest.json``), ``/var/lib/hal0``
(the restore marker). Under ``HAL0_HOME``: ``$HAL0_HOME/usr-lib/hal0/{venv,current}``,
``$HAL0_HOME/etc/hal0``, ``$HAL0_HOME/var-lib/hal0`` (settings say each path).

The package is ``<venv>/lib/pythonX.Y/site-packages/hal0``; with several Python folders, the one
whose ``hal0ai-<v>.dist-info`` names ``VERSION``'s release, else the newest Python.

The manifest is searched in the installed release's own order: 1.0-1.3 ``/etc/hal0`` first,
then the release tree, then ``<venv>/lib/pythonX.Y/manifest.json`` (not under ``HAL0_HOME``);
1.4+ the reverse (the copy beside the code first, also under ``HAL0_HOME``). A ``manifest_file``
setting replaces the search.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hal0_reconciler import fsio

if TYPE_CHECKING:
    from hal0_reconciler.settings import Settings

_PYTHON_DIR = re.compile(r"python(\d+)\.(\d+)")
_DIST_INFO = re.compile(r"hal0ai-(?P<version>[^-]+)\.dist-info")


@dataclass(frozen=True)
class Hal0Paths:
    """Where the installed hal0 keeps what the reconciler reads."""

    version: Path
    package: Path | None  # None: no hal0 package found in the venv
    dist_version: str | None  # the version its hal0ai-<v>.dist-info names
    config: Path
    environment: Path
    restore_marker: Path
    manifest_setting: Path | None
    etc_manifest: Path
    release_manifest: Path
    package_search: Path  # where the hal0 package was looked for
    home_set: bool  # HAL0_HOME set (1.0-1.3 then skip the copy beside the code)

    @property
    def schema(self) -> Path | None:
        return self.package / "config" / "schema.py" if self.package is not None else None

    @property
    def runners(self) -> Path | None:
        return self.package / "runners" / "__init__.py" if self.package is not None else None

    @property
    def pins(self) -> Path | None:
        return self.package / "runners" / "pins.py" if self.package is not None else None

    @property
    def updater(self) -> Path | None:
        return self.package / "updater" / "updater.py" if self.package is not None else None

    @property
    def beside_code(self) -> Path | None:
        """``<venv>/lib/pythonX.Y/manifest.json`` (hal0's ``Path(__file__).parents[3]``)."""
        return self.package.parents[1] / "manifest.json" if self.package is not None else None

    def manifests(self, *, pins_era: bool) -> tuple[Path, ...]:
        """The manifest candidates in the installed release's order, first found wins."""
        if self.manifest_setting is not None:
            return (self.manifest_setting,)
        beside = (self.beside_code,) if self.beside_code is not None else ()
        if pins_era:
            return (*beside, self.release_manifest, self.etc_manifest)
        return (self.etc_manifest, self.release_manifest, *(() if self.home_set else beside))

    def files(self) -> tuple[Path, ...]:
        """Every file whose change can change a verdict."""
        code = (self.schema, self.runners, self.pins, self.updater, self.beside_code)
        return (
            self.version,
            *(p for p in code if p is not None),
            self.config,
            self.environment,
            self.restore_marker,
            *((self.manifest_setting,) if self.manifest_setting is not None else ()),
            self.etc_manifest,
            self.release_manifest,
        )

    def watched(self) -> tuple[Path, ...]:
        """What a hal0 update changes: every source, and the release link itself; with no
        hal0 package yet, where its ``schema.py`` would appear."""
        waiting: tuple[Path, ...] = ()
        if self.package is None:
            lib = self.package_search.parents[2]  # <venv>/lib
            found = tuple(p / "site-packages" / "hal0" for p in _python_dirs(lib))
            waiting = tuple(p / "config" / "schema.py" for p in (self.package_search, *found))
        return (*self.files(), self.version.parent, *waiting)


def hal0_paths(settings: Settings, version_text: str | None = None) -> Hal0Paths:
    """The source paths now (the venv's Python folders are listed). ``version_text``: what
    ``VERSION`` says, to pick among several Python folders."""
    package, dist = hal0_package(settings.hal0_venv, version_text)
    etc = settings.hal0_config_file.parent
    return Hal0Paths(
        version=settings.hal0_release_dir / "VERSION",
        package=package,
        dist_version=dist,
        config=settings.hal0_config_file,
        environment=settings.api_env_file,
        restore_marker=settings.restore_marker,
        manifest_setting=settings.manifest_file,
        etc_manifest=etc / "manifest.json",
        release_manifest=settings.hal0_release_dir / "manifest.json",
        package_search=settings.hal0_venv / "lib" / "python3.*" / "site-packages" / "hal0",
        home_set=bool(os.environ.get("HAL0_HOME", "").strip()),
    )


def layout_identity(settings: Settings) -> tuple[object, ...]:
    """What :func:`hal0_paths` rests on besides the settings, by ``stat`` alone: ``VERSION``,
    the venv's ``lib`` folder and each Python folder's ``site-packages`` (a release installed,
    a dist-info renamed or a Python folder added changes one of them)."""
    lib = settings.hal0_venv / "lib"
    folders = _python_dirs(lib)
    return (
        _stat_identity(settings.hal0_release_dir / "VERSION"),
        _stat_identity(lib),
        *((folder, _stat_identity(folder / "site-packages")) for folder in folders),
    )


def _stat_identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return fsio.identity_of(path.stat())
    except OSError:
        return None


def hal0_package(venv: Path, version_text: str | None = None) -> tuple[Path | None, str | None]:
    """``<venv>/lib/pythonX.Y/site-packages/hal0`` and the version its dist-info names: the
    folder whose dist-info matches ``version_text``, else the newest Python."""
    found: list[tuple[tuple[int, int], Path, str | None]] = []
    for version, folder in _python_versions(venv / "lib"):
        site = folder / "site-packages"
        if (site / "hal0").is_dir():
            found.append((version, site / "hal0", _dist_version(site)))
    if not found:
        return None, None
    wanted = (version_text or "").strip().removeprefix("v")
    matching = [f for f in found if f[2] is not None and wanted.startswith(f[2])]
    _, package, dist = max(matching or found)
    return package, dist


def _dist_version(site: Path) -> str | None:
    try:
        names = [e.name for e in os.scandir(site)]
    except OSError:
        return None
    versions = [m.group("version") for n in names if (m := _DIST_INFO.fullmatch(n))]
    return versions[0] if len(versions) == 1 else None


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
