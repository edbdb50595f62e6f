"""Environment + configs folder → the CSV files a boot loads, with the reason for each.   [pure]

aiter's two-branch rule: an unset ``AITER_CONFIG_<X>`` loads the shipped default
``<configs>/<stem>.csv`` plus every ``<configs>/model_configs/*<stem>*.csv`` whose name does not
contain ``untuned``; a set-but-empty one drops the default (aiter's module default is
``os.getenv(VAR, default)``, i.e. "") and loads only those overlays; a set value is split on
``:`` and taken verbatim (a whitespace-only value too: no aiter revision strips it). Which files
are overlays, the empty case and missing paths in a list differ between aiter versions: the
installed aiter's ``rules.RuleSet`` says which applies, and ``Resolution.fatal`` says when the boot
dies at its first lookup. The caller passes the
listing of ``model_configs/`` and an existence test, so this module does no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.rules import sets as aiter_rules


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
    fatal: str | None = None  # the boot dies at the first lookup of this table: why

    @property
    def loaded(self) -> tuple[ResolvedFile, ...]:
        """The files aiter will actually read (missing ones are skipped or fail the load)."""
        return tuple(f for f in self.files if f.exists)


def overlay_names_for(
    stem: str, names: Iterable[str], *, overlays: aiter_rules.Overlays, folder: str = ""
) -> list[str]:
    """The ``model_configs/`` entries an unset variable merges in, by the installed aiter's rule
    (``folder``: the folder's path, which the older rule also searches for "untuned")."""
    if overlays is aiter_rules.Overlays.NONE:
        return []
    if overlays is aiter_rules.Overlays.STEM_ANYWHERE:
        if "untuned" in folder:
            return []
        return sorted(n for n in names if stem in n and "untuned" not in n)
    return sorted(n for n in names if stem in n and n.endswith(".csv") and "untuned" not in n)


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
    folder = configs_dir / "model_configs"
    overlays = [
        folder / name
        for name in overlay_names_for(
            route.stem, overlay_names, overlays=rules.overlays, folder=str(folder)
        )
    ]
    overlay_files = [ResolvedFile(p, Origin.OVERLAY, exists(p)) for p in overlays]
    if raw is None:
        default = configs_dir / f"{route.stem}.csv"
        files = [ResolvedFile(default, Origin.DEFAULT, exists(default)), *overlay_files]
        problems: list[str] = []
        if not files[0].exists and route.compiled:
            problems.append(f"shipped default {default} is missing")
        return Resolution(route, None, tuple(files), tuple(problems), merged=bool(overlays))
    if raw == "":
        return _empty(route, raw, overlay_files, rules=rules, configs_dir=configs_dir)
    if not raw.strip():  # used verbatim: read_csv(" ") raises FileNotFoundError
        why = (
            f"{route.variable} is set to whitespace only ({raw!r}): aiter takes it verbatim as a "
            "path and the boot dies at the first lookup (FileNotFoundError); unset it to get "
            "the shipped tables"
        )
        return Resolution(route, raw, (), (why,), fatal=why)
    parts = raw.split(":")
    files = []
    problems = []
    fatal = None
    for n, part in enumerate(parts):
        path = PurePath(part)
        found = bool(part) and exists(path)
        files.append(ResolvedFile(path, Origin.PINNED, found))
        if found:
            continue
        if len(parts) == 1:
            fatal = (
                f"{route.variable} names {part!r}, which does not exist: aiter uses it anyway "
                "and the boot dies at the first lookup (FileNotFoundError)"
            )
            problems.append(fatal)
        elif n == 0 and rules.list_missing is aiter_rules.ListMissing.FIRST_FAILS:
            fatal = (
                f"{route.variable} names {part!r} first, which does not exist: this aiter reads "
                "the first path of a ':'-list unchecked and the boot dies at the first lookup"
            )
            problems.append(fatal)
        else:
            problems.append(f"{route.variable} names {part!r}, which does not exist (skipped)")
    if len(parts) > 1 and fatal is None and not any(f.exists for f in files):
        fatal = (
            f"{route.variable} names no file that exists: aiter raises 'No existing config "
            "files found' and the boot dies at the first lookup"
        )
        problems.append(fatal)
    return Resolution(route, raw, tuple(files), tuple(problems), merged=len(parts) > 1, fatal=fatal)


def _empty(
    route: routing.TableRoute,
    raw: str,
    overlay_files: list[ResolvedFile],
    *,
    rules: aiter_rules.RuleSet,
    configs_dir: PurePath,
) -> Resolution:
    """A set-but-empty value: ``os.getenv(VAR, default)`` is "", so the default is gone."""
    default = configs_dir / f"{route.stem}.csv"
    if rules.empty_value is aiter_rules.EmptyValue.FAILS:
        why = (
            f"{route.variable} is set but empty: this aiter reads the path '' "
            + ("first (before the overlays) " if overlay_files else "")
            + "and the boot dies at the first lookup (FileNotFoundError); unset it to get the "
            f"shipped default {default.name}"
        )
        return Resolution(route, raw, (), (why,), fatal=why)
    if overlay_files:
        why = (
            f"{route.variable} is set but empty: aiter drops the shipped default "
            f"{default.name} and loads only the {len(overlay_files)} model_configs overlay(s); "
            "unset it to get the default too"
        )
        return Resolution(route, raw, tuple(overlay_files), (why,), merged=True)
    why = (
        f"{route.variable} is set but empty and no model_configs overlay matches: aiter drops "
        f"the shipped default {default.name}, reads the path '' and the boot dies at the first "
        "lookup (FileNotFoundError); unset it to get the default"
    )
    return Resolution(route, raw, (), (why,), fatal=why)
