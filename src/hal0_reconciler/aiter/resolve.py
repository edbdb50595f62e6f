"""Environment + configs folder → the CSV files a boot loads, with the reason for each.   [pure]

aiter's two-branch rule: an unset ``AITER_CONFIG_<X>`` loads the shipped default
``<configs>/<stem>.csv`` plus every ``<configs>/model_configs/*<stem>*.csv`` whose name does not
contain ``untuned``; a set-but-empty one drops the default (aiter's module default is
``os.getenv(VAR, default)``, i.e. "") and loads only those overlays; a set value is split on
``:`` and taken verbatim. Whitespace-only values and the empty case differ between aiter
versions: the installed aiter's ``rules.RuleSet`` says which applies. The caller passes the
listing of ``model_configs/`` and an existence test, so this module does no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

from hal0_reconciler.aiter import routing
from hal0_reconciler.aiter import rules as aiter_rules


class Origin(enum.StrEnum):
    """Why a file is in the set a boot loads."""

    DEFAULT = "shipped-default"
    OVERLAY = "overlay"  # model_configs/*<stem>*.csv merged in although nobody asked
    PINNED = "pinned"  # named by the AITER_CONFIG_* value
    FIXED = "fixed"  # hard-coded by aiter's code generator (opus), whatever the variables say


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
    merged: bool = False  # several paths: aiter merges them (and resolves duplicate shapes)

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
    rules: aiter_rules.RuleSet,
) -> Resolution:
    """The CSV files ``route``'s variable names in ``env`` under the installed aiter's ``rules``."""
    raw = env.get(route.variable)
    overlays = [
        configs_dir / "model_configs" / name
        for name in sorted(overlay_names)
        if route.stem in name and "untuned" not in name and name.endswith(".csv")
    ]
    overlay_files = [ResolvedFile(p, Origin.OVERLAY, exists(p)) for p in overlays]
    if raw is None:
        default = configs_dir / f"{route.stem}.csv"
        files = [ResolvedFile(default, Origin.DEFAULT, exists(default)), *overlay_files]
        problems: list[str] = []
        if not files[0].exists and route.compiled:
            problems.append(f"shipped default {default} is missing")
        return Resolution(route, None, tuple(files), tuple(problems), merged=bool(overlays))
    stripped = rules.whitespace is aiter_rules.Whitespace.STRIPPED
    value = raw.strip() if stripped else raw
    problems = []
    if raw and not raw.strip():
        problems.append(
            f"{route.variable} is set to whitespace only: "
            + (
                "this aiter strips it to empty (see the next line); unset it to get the "
                "shipped tables"
                if stripped
                else "this aiter takes it verbatim as a path naming no file and loads no "
                "table (unset it to get the shipped tables)"
            )
        )
    if value == "":
        return _empty(route, raw, overlay_files, problems, rules=rules, configs_dir=configs_dir)
    if not value.strip():  # verbatim whitespace: one path, never a file
        return Resolution(route, raw, (), tuple(problems))
    parts = value.split(":")
    files = []
    for part in parts:
        path = PurePath(part)
        found = bool(part.strip()) and exists(path)
        files.append(ResolvedFile(path, Origin.PINNED, found))
        if not found:
            consequence = "aiter uses it anyway and fails" if len(parts) == 1 else "skipped"
            problems.append(
                f"{route.variable} names {part!r}, which does not exist ({consequence})"
            )
    return Resolution(route, raw, tuple(files), tuple(problems), merged=len(parts) > 1)


def _empty(
    route: routing.TableRoute,
    raw: str,
    overlay_files: list[ResolvedFile],
    problems: list[str],
    *,
    rules: aiter_rules.RuleSet,
    configs_dir: PurePath,
) -> Resolution:
    """A set-but-empty value: ``os.getenv(VAR, default)`` is "", so the default is gone."""
    default = configs_dir / f"{route.stem}.csv"
    if rules.empty_value is aiter_rules.EmptyValue.FAILS and overlay_files:
        problems.append(
            f"{route.variable} is set but empty: this aiter merges '' with the overlays, reads "
            f"the path '' first and the load fails; unset it to get the shipped default "
            f"{default.name}"
        )
        return Resolution(route, raw, (), tuple(problems))
    if overlay_files:
        problems.append(
            f"{route.variable} is set but empty: aiter drops the shipped default "
            f"{default.name} and loads only the {len(overlay_files)} model_configs overlay(s); "
            "unset it to get the default too"
        )
    else:
        problems.append(
            f"{route.variable} is set but empty: aiter drops the shipped default "
            f"{default.name} and loads no table (its path is ''); unset it to get the default"
        )
    return Resolution(route, raw, tuple(overlay_files), tuple(problems), merged=bool(overlay_files))
