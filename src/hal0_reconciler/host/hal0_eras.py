"""Which hal0 is installed, decided from what its files contain; and hal0's own checks.  [pure]

Two axes, each with the evidence that decided it (hal0-contract.md, "Exactly as hal0's code
does it"; decisions-0.2.md, "Real hal0 eras"):

- ``rule``: ``allowlist`` when ``schema.py`` defines ``VULKAN_CAPABLE_IMAGE_REFS``;
  ``lane-retired`` when it does not but the installed hal0 relabels every llama.cpp
  ``gpu-vulkan`` slot (its updater's ``relabel_stale_vulkan_slots``, or its load-time GPU guard
  ``require_kfd_for_gpu_slot``); ``pre-rule`` when neither, and ``schema.py`` has its default
  image but no ``VULKAN_FIXED_IMAGE`` either (the lane is hal0's normal one there). Anything
  else is ``not-understood``: every slot is kept, loudly; newest values are never spliced in.
- ``runners``: ``catalog`` when ``RUNNER_IMAGES = _build_runners_from_catalog()``;
  ``literal-pre-collapse`` for a literal table with a ``vulkanfpx`` runner of its own;
  ``literal`` otherwise (``vulkanfpx`` is an alias of ``rocmfpx``).

The catalog-built table is hal0's lifecycle catalog (``hal0/lifecycle/data/catalog.json`` in
the installed package, JSON: ``runners[]`` with ``id`` and ``package``, ``packages[]`` with
``id``, ``repository`` and ``digest``): a runner's image is its ``_SUPPLEMENTS``
``image_override``, else ``<repository>@<digest>`` of its package.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from hal0_reconciler.host.hal0_code import CatalogSupplement
from hal0_reconciler.model import Hal0Rule

CAPABLE = "VULKAN_CAPABLE_IMAGE_REFS"
FIXED = "VULKAN_FIXED_IMAGE"
DEFAULT = "DEFAULT_ROCMFPX_IMAGE"
RELABEL_FUNCTION = "relabel_stale_vulkan_slots"  # hal0/updater/updater.py
GPU_GUARD = "require_kfd_for_gpu_slot"  # hal0/providers/_gpu.py


@dataclass(frozen=True)
class Placement:
    rule: Hal0Rule
    evidence: str


def place_rule(
    *,
    schema_problem: str | None,
    assigned: Collection[str],
    understood: Collection[str],
    retirement: str | None,
    retirement_problem: str | None = None,
) -> Placement:
    """The rule of the installed hal0.

    ``assigned``: the module-level names ``schema.py`` assigns; ``understood``: those whose
    value was read. ``retirement``: the evidence of the lane's retirement found (None: none);
    ``retirement_problem``: why a file that could hold it was not read.
    """
    if schema_problem is not None:
        return Placement(Hal0Rule.NOT_UNDERSTOOD, f"schema.py: {schema_problem}")
    if CAPABLE in assigned:
        if CAPABLE not in understood:
            return Placement(Hal0Rule.NOT_UNDERSTOOD, f"schema.py: {CAPABLE} not understood")
        return Placement(Hal0Rule.ALLOWLIST, f"schema.py defines {CAPABLE}")
    if retirement is not None:
        return Placement(Hal0Rule.LANE_RETIRED, f"schema.py defines no {CAPABLE}; {retirement}")
    if retirement_problem is not None:
        why = f"schema.py defines no {CAPABLE}, and {retirement_problem}"
        return Placement(Hal0Rule.NOT_UNDERSTOOD, why)
    if DEFAULT not in understood:
        why = f"schema.py defines neither {CAPABLE} nor a readable {DEFAULT}"
        return Placement(Hal0Rule.NOT_UNDERSTOOD, why)
    if FIXED in assigned:
        why = (
            f"schema.py defines {FIXED} but no {CAPABLE}, and hal0 shows no relabel of the "
            "Vulkan lane: a shape between the known eras"
        )
        return Placement(Hal0Rule.NOT_UNDERSTOOD, why)
    why = (
        f"schema.py defines no {CAPABLE} and no {FIXED}, and hal0 has neither "
        f"{RELABEL_FUNCTION} nor {GPU_GUARD}"
    )
    return Placement(Hal0Rule.PRE_RULE, why)


def validate_default_images(
    raw: object, runners: Collection[str], aliases: Mapping[str, str]
) -> tuple[dict[str, str], str | None]:
    """``[slots].default_images`` as hal0's ``SlotsConfig`` validator leaves it, or ``{}`` and
    the one entry that makes hal0 refuse its whole ``hal0.toml``.

    Keys are folded to their canonical runner (a canonical key beats its alias, whichever comes
    first); values are stripped; an unknown runner, a blank or a non-string value fails the
    whole map. (TOML has no null, so hal0's "null clears" never applies to a file.)
    """
    if not isinstance(raw, dict):
        return {}, f"[slots].default_images is {_kind(raw)}, not a table"
    cleaned: dict[str, str] = {}
    canonical_origin: set[str] = set()
    for key, ref in raw.items():
        canon = aliases.get(key, key)
        aliased = canon != key
        if canon in cleaned and (aliased or canon in canonical_origin):
            continue  # hal0 skips it before validating it
        if canon not in runners:
            valid = ", ".join(sorted(runners))
            return {}, f"[slots].default_images key {key!r} is not a runner (valid: {valid})"
        if not isinstance(ref, str) or not ref.strip():
            what = "blank" if isinstance(ref, str) else _kind(ref)
            return {}, f"[slots].default_images[{key!r}] is {what}, not an image ref"
        cleaned[canon] = ref.strip()
        if not aliased:
            canonical_origin.add(canon)
    return cleaned, None


@dataclass(frozen=True)
class CatalogTable:
    images: dict[str, str]
    manifest_keys: dict[str, str]
    unknown: frozenset[str]  # runner ids whose image only the unread catalog has


def catalog_table(
    catalog: object | None, supplements: Mapping[str, CatalogSupplement]
) -> tuple[CatalogTable, str | None]:
    """The runner table hal0 builds from its catalog and ``_SUPPLEMENTS``; with no catalog
    (None) or one of another shape, per fact: the supplements' runners and images, and the
    runners without an ``image_override`` as unknown. The second value says what fell back."""
    manifest_keys = {k: s.manifest_key for k, s in supplements.items() if s.manifest_key}
    fallback = CatalogTable(
        {k: s.image for k, s in supplements.items() if s.image is not None},
        manifest_keys,
        frozenset(k for k, s in supplements.items() if s.image is None),
    )
    if catalog is None:
        return fallback, "no catalog"
    try:
        runners, packages = _catalog_entries(catalog)
    except _CatalogShapeError as exc:
        return fallback, str(exc)
    images: dict[str, str] = {}
    unknown: set[str] = set()
    for runner_id, package_id in runners:
        supplement = supplements.get(runner_id)
        if supplement is not None and supplement.image:
            images[runner_id] = supplement.image
        elif package_id in packages:
            images[runner_id] = packages[package_id]
        else:
            unknown.add(runner_id)
    keys = {k: v for k, v in manifest_keys.items() if k in images or k in unknown}
    return CatalogTable(images, keys, frozenset(unknown)), None


class _CatalogShapeError(Exception):
    """The catalog is not in the shape hal0's loader reads (the message says where)."""


def _catalog_entries(catalog: object) -> tuple[list[tuple[str, str]], dict[str, str]]:
    if not isinstance(catalog, dict):
        raise _CatalogShapeError(f"the catalog is {_kind(catalog)}, not an object")
    runners, packages = catalog.get("runners"), catalog.get("packages")
    if not isinstance(runners, list) or not isinstance(packages, list):
        raise _CatalogShapeError("the catalog has no runners and packages lists")
    refs: dict[str, str] = {}
    for package in packages:
        if isinstance(package, dict):
            pid, repo, digest = package.get("id"), package.get("repository"), package.get("digest")
            if isinstance(pid, str) and isinstance(repo, str) and isinstance(digest, str):
                refs[pid] = f"{repo}@{digest}"
    pairs: list[tuple[str, str]] = []
    for runner in runners:
        rid = runner.get("id") if isinstance(runner, dict) else None
        package_id = runner.get("package") if isinstance(runner, dict) else None
        if not isinstance(rid, str) or not isinstance(package_id, str):
            raise _CatalogShapeError(f"a catalog runner has no id and package: {rid!r}")
        pairs.append((rid, package_id))
    return pairs, refs


def _kind(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        list: "an array",
        dict: "a table",
    }.get(type(value), f"a {type(value).__name__}")
