"""hal0 1.0-1.3 (schema allowlist): ``schema.py``'s image sets, the literal runner table,
``[slots].default_images`` (1.1-1.3 fold ``vulkanfpx``), ``HAL0_TOOLBOX_IMAGE_*`` and the
manifest's ``toolbox_images`` refs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from hal0_reconciler.host.hal0 import manifest, operator_files, pysource, runners
from hal0_reconciler.host.hal0.sources import (
    MAX_SOURCE_BYTES,
    FactProblem,
    SourceError,
    read_text,
)
from hal0_reconciler.model import Hal0Facts, Hal0Rule

if TYPE_CHECKING:
    from hal0_reconciler.host.hal0 import release
    from hal0_reconciler.host.hal0.paths import Hal0Paths
    from hal0_reconciler.settings import Settings

SCHEMA_NAMES = ("DEFAULT_ROCMFPX_IMAGE", "VULKAN_CAPABLE_IMAGE_REFS", "STALE_ROCMFPX_IMAGE_REFS")


def facts(
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
            values = pysource.module_values(text, wanted=SCHEMA_NAMES)[0]
        except (SourceError, pysource.Hal0CodeError):
            values = {}
    default_image = _pick(values, "DEFAULT_ROCMFPX_IMAGE", str, "")
    capable = _pick(values, "VULKAN_CAPABLE_IMAGE_REFS", frozenset, frozenset())
    stale = _pick(values, "STALE_ROCMFPX_IMAGE_REFS", frozenset, frozenset())
    for name, fact in zip(SCHEMA_NAMES, ("default_image", "capable", "stale"), strict=True):
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
    raw_images = operator_files.raw_default_images(paths.config, problems)
    images = operator_files.validated_images(
        paths.config, raw_images, set(bundled), aliases, problems, schema=paths.schema
    )
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
        for k, v in operator_files.environment(paths.environment, problems).items()
        if k.startswith("HAL0_TOOLBOX_IMAGE_")
    }
    refs = manifest.toolbox_refs(paths.manifests(pins_era=False), problems, sources)
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
        manifest=MappingProxyType(refs),
        sources=MappingProxyType(sources),
    )


def _pick(values: Mapping[str, object], name: str, kind: type, fallback: Any) -> Any:
    value = values.get(name)
    return value if isinstance(value, kind) else fallback
