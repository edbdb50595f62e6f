"""Environment + configs folder → the CSV files a boot loads, with the reason for each.   [pure]

aiter's two-branch rule: an unset or empty ``AITER_CONFIG_<X>`` loads the shipped default
``<configs>/<stem>.csv`` plus every ``<configs>/model_configs/*<stem>*.csv`` whose name does not
contain ``untuned``; a set value is split on ``:`` and taken verbatim. The caller passes the
listing of ``model_configs/`` and an existence test, so this module does no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

from hal0_reconciler.aiter import routing


class Origin(enum.StrEnum):
    """Why a file is in the set a boot loads."""

    DEFAULT = "shipped-default"
    OVERLAY = "overlay"  # model_configs/*<stem>*.csv merged in although nobody asked
    PINNED = "pinned"  # named by the AITER_CONFIG_* value


@dataclass(frozen=True)
class ResolvedFile:
    path: PurePath
    origin: Origin
    exists: bool


@dataclass(frozen=True)
class Resolution:
    """The files one table variable resolves to in one environment, and operator errors."""

    route: routing.TableRoute
    value: str | None  # the variable's value; None when unset
    files: tuple[ResolvedFile, ...]
    problems: tuple[str, ...] = ()

    @property
    def loaded(self) -> tuple[ResolvedFile, ...]:
        """The files aiter will actually read (missing ones are skipped or fail the load)."""
        return tuple(f for f in self.files if f.exists)


def resolve(
    route: routing.TableRoute,
    env: Mapping[str, str],
    *,
    configs_dir: PurePath,
    overlay_names: Iterable[str],
    exists: Callable[[PurePath], bool],
) -> Resolution:
    """The CSV files ``route``'s variable names in ``env``, each with its origin."""
    value = env.get(route.variable)
    if value is None or value == "":
        default = configs_dir / f"{route.stem}.csv"
        files = [ResolvedFile(default, Origin.DEFAULT, exists(default))]
        problems: list[str] = []
        if not files[0].exists and route.compiled:
            problems.append(f"shipped default {default} is missing")
        for name in sorted(overlay_names):
            if route.stem in name and "untuned" not in name and name.endswith(".csv"):
                path = configs_dir / "model_configs" / name
                files.append(ResolvedFile(path, Origin.OVERLAY, exists(path)))
        return Resolution(route, None, tuple(files), tuple(problems))
    if not value.strip():
        return Resolution(
            route,
            value,
            (),
            (
                (
                    f"{route.variable} is set to whitespace only: aiter treats it as set and loads "
                    "no real file (unset it to get the shipped tables)"
                ),
            ),
        )
    parts = value.split(":")
    files = []
    problems = []
    for part in parts:
        path = PurePath(part)
        found = bool(part.strip()) and exists(path)
        files.append(ResolvedFile(path, Origin.PINNED, found))
        if not found:
            consequence = "aiter uses it anyway and fails" if len(parts) == 1 else "skipped"
            problems.append(
                f"{route.variable} names {part!r}, which does not exist ({consequence})"
            )
    return Resolution(route, value, tuple(files), tuple(problems))
