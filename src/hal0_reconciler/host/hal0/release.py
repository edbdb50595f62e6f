"""Which published hal0 release is installed, and the rules it judges slots by.  [pure]

hal0 is published as ``hal0ai``; every release is one row of :data:`RELEASES`, with the facts
that change from release to release (docs/rule.md has the table). The code's *structure*
decides the era (what the installed files define); ``VERSION`` (else the dist-info) names the
release, a nightly being its base release:

- ``pins`` (1.4.0+): ``hal0/runners/pins.py`` exists and ``schema.py`` has no
  ``VULKAN_CAPABLE_IMAGE_REFS``;
- ``allowlist`` (1.0.0-1.3.0): ``schema.py`` defines ``VULKAN_CAPABLE_IMAGE_REFS``;
- ``pre-rule`` (0.9.8, 1.0.0a2): neither, and no ``relabel_stale_vulkan_slots``.

A named release whose structure is another era's, or a structure of no era, is
``not-placeable``: every slot is kept, loudly. A release newer than every known one whose
structure is the newest era's is judged by the newest release's rules, said once.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from hal0_reconciler.model import Hal0Rule


class Structure(enum.StrEnum):
    """The era the installed code's shape belongs to (before the release is named)."""

    PINS = "pins"
    ALLOWLIST = "allowlist"
    PRE_RULE = "pre-rule"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Release:
    """One published hal0 release and the facts of it the judgement depends on."""

    version: str
    rule: Hal0Rule
    vulkan_runner: str | None = None  # the runner key gpu-vulkan resolves to
    folds_aliases: bool = False  # [slots].default_images folds vulkanfpx into rocmfpx
    device_marker: bool = False  # the rendered Exec= carries --device Vulkan0|ROCm0|none
    restart_budget: float | None = None  # slot_lifecycle_timeout_s(1, 1), seconds

    @property
    def era_words(self) -> str:
        return _ERA_WORDS[self.rule]


_ERA_WORDS = {
    Hal0Rule.PRE_RULE: "before the Vulkan rule",
    Hal0Rule.ALLOWLIST: "schema allowlist",
    Hal0Rule.PINS: "manifest pins",
    Hal0Rule.NOT_PLACEABLE: "not placeable",
    Hal0Rule.NO_HAL0: "no hal0 installed",
}

_B_EARLY = 2415.0  # 1.0.0-1.2.0 (load hold 690 s)
_B_LATE = 3243.0  # 1.3.0+ (load hold 930 s)

RELEASES: tuple[Release, ...] = (
    Release("0.9.8", Hal0Rule.PRE_RULE),
    Release("1.0.0a2", Hal0Rule.PRE_RULE),
    Release("1.0.0", Hal0Rule.ALLOWLIST, "vulkanfpx", restart_budget=_B_EARLY),
    Release("1.1.0", Hal0Rule.ALLOWLIST, "rocmfpx", folds_aliases=True, restart_budget=_B_EARLY),
    Release("1.2.0", Hal0Rule.ALLOWLIST, "rocmfpx", folds_aliases=True, restart_budget=_B_EARLY),
    Release("1.3.0", Hal0Rule.ALLOWLIST, "rocmfpx", folds_aliases=True, restart_budget=_B_LATE),
    Release("1.4.0", Hal0Rule.PINS, "standard", restart_budget=_B_LATE),
    Release("1.5.0", Hal0Rule.PINS, "standard", device_marker=True, restart_budget=_B_LATE),
    Release("1.6.0", Hal0Rule.PINS, "standard", device_marker=True, restart_budget=_B_LATE),
    Release("1.6.5", Hal0Rule.PINS, "standard", device_marker=True, restart_budget=_B_LATE),
    Release("1.7.0", Hal0Rule.PINS, "standard", device_marker=True, restart_budget=_B_LATE),
)
"""Every published release, oldest first (a newer release is one more line)."""

BY_VERSION = {r.version: r for r in RELEASES}
NEWEST = RELEASES[-1]
_STRUCTURE_RULE = {
    Structure.PINS: Hal0Rule.PINS,
    Structure.ALLOWLIST: Hal0Rule.ALLOWLIST,
    Structure.PRE_RULE: Hal0Rule.PRE_RULE,
}
_VERSION = re.compile(r"v?(?P<base>\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?)(?P<rest>(?:[-+_]|\.(?!\d)).*)?")


def first_of(rule: Hal0Rule) -> Release:
    """The first release of an era (docs/rule.md's table)."""
    return next(r for r in RELEASES if r.rule is rule)


def base_release(version: str) -> str | None:
    """The release a version string names: ``v1.7.0-nightly.20261002`` -> ``1.7.0``; None
    when it is not a version at all."""
    match = _VERSION.fullmatch(version.strip())
    if match is None:
        return None
    return match.group("base")


def version_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """A sort key: ``1.0.0a2`` < ``1.0.0`` < ``1.0.1``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?", version)
    if match is None:
        return ((), 0, 0)
    numbers = tuple(int(n) for n in match.group(1).split("."))
    numbers += (0,) * (3 - len(numbers))
    pre = {"a": 0, "b": 1, "rc": 2}.get(match.group(2) or "", 3)
    return numbers, pre, int(match.group(3) or 0)


@dataclass(frozen=True)
class Placement:
    """The rules the installed hal0 is judged by, why, and what to say once about it."""

    rule: Hal0Rule
    release: Release | None  # the known release whose rules apply (None: none do)
    evidence: str
    note: str | None = None  # said once (a newer release, an unnamed one)
    loud: bool = False  # not placeable: every slot kept, degraded


def place(named: str | None, structure: Structure, structure_evidence: str) -> Placement:
    """The rules for a hal0 whose release is ``named`` (VERSION or dist-info; None: neither
    says) and whose code has ``structure``."""
    if structure is Structure.UNKNOWN:
        why = f"its code has the shape of no known release ({structure_evidence})"
        return Placement(Hal0Rule.NOT_PLACEABLE, None, why, loud=True)
    rule = _STRUCTURE_RULE[structure]
    base = base_release(named) if named is not None else None
    if base is None:
        release = _newest_of(rule)
        said = f"release not named (no readable VERSION or dist-info){_said(named)}"
        note = f"{said}: judged by {release.version}'s rules, the newest of its era"
        return Placement(rule, release, f"{structure_evidence}; {said}", note=note)
    known = BY_VERSION.get(base)
    if known is not None:
        if known.rule is not rule:
            why = (
                f"VERSION names {base}, a {known.era_words} release, but its code is "
                f"{_ERA_WORDS[rule]} ({structure_evidence})"
            )
            return Placement(Hal0Rule.NOT_PLACEABLE, None, why, loud=True)
        return Placement(rule, known, f"{base}: {structure_evidence}")
    if version_key(base) > version_key(NEWEST.version):
        if rule is not NEWEST.rule:
            why = (
                f"{base} is newer than every known release, but its code is "
                f"{_ERA_WORDS[rule]}, not {NEWEST.era_words} ({structure_evidence})"
            )
            return Placement(Hal0Rule.NOT_PLACEABLE, None, why, loud=True)
        note = (
            f"hal0 {base} is newer than every release known to hal0-reconciler "
            f"(newest {NEWEST.version}); its code matches {NEWEST.version}'s: judged by its rules"
        )
        return Placement(rule, NEWEST, f"{base}: {structure_evidence}", note=note)
    older = [r for r in RELEASES if r.rule is rule and version_key(r.version) <= version_key(base)]
    if not older:
        why = f"{base} is no published release, and its code is {_ERA_WORDS[rule]}"
        return Placement(Hal0Rule.NOT_PLACEABLE, None, why, loud=True)
    release = older[-1]
    note = f"hal0 {base} is no published release: judged by {release.version}'s rules"
    return Placement(rule, release, f"{base}: {structure_evidence}", note=note)


def assumed(version: str) -> Placement:
    """What-if judging (``--assume-hal0``): a known release's rules, whatever is installed."""
    release = BY_VERSION.get(version)
    if release is None:
        known = ", ".join(r.version for r in RELEASES)
        why = f"--assume-hal0 {version}: no such release (known: {known})"
        return Placement(Hal0Rule.NOT_PLACEABLE, None, why, loud=True)
    return Placement(release.rule, release, f"assumed: hal0 {version} (--assume-hal0)")


def _newest_of(rule: Hal0Rule) -> Release:
    return [r for r in RELEASES if r.rule is rule][-1]


def _said(named: str | None) -> str:
    return f"; VERSION says {named!r}" if named else ""
