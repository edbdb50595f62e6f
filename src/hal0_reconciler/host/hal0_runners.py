"""hal0's runner table as the installed release builds it: a literal ``RUNNER_IMAGES`` dict, or
one built from its lifecycle catalog (``_build_runners_from_catalog``, with a ``vulkanfpx``
runner of its own), with the images named from ``schema.py`` resolved to its values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from hal0_reconciler.host import hal0_code, hal0_eras
from hal0_reconciler.host.hal0_sources import (
    MAX_SOURCE_BYTES,
    FactProblem,
    Hal0Paths,
    SourceError,
    read_text,
)
from hal0_reconciler.model import RunnerShape
from hal0_reconciler.slots import image


@dataclass(frozen=True)
class Table:
    images: dict[str, str]
    manifest_keys: dict[str, str]
    aliases: dict[str, str]
    shape: RunnerShape
    evidence: str
    vulkan_runner: str
    unknown: frozenset[str] = frozenset()


def runner_table(
    paths: Hal0Paths,
    schema_values: Mapping[str, str | frozenset[str]],
    default_image: str,
    problems: list[FactProblem],
) -> Table | None:
    """The runner table, literal or catalog-built; images named from schema.py resolve to its
    values. None: not read (said as a problem; for a missing package, said for schema.py)."""
    if paths.runners is None:
        return None
    where = str(paths.runners)
    try:
        text = read_text(paths.runners, cap=MAX_SOURCE_BYTES)
        names = hal0_code.imported_names(text, "hal0.config.schema")
        known = {**schema_values, "DEFAULT_ROCMFPX_IMAGE": default_image}
        imported = {n: v for n in names if isinstance(v := known.get(n), str)}
        shape = hal0_code.runner_table_shape(text)
        separate = hal0_code.separate_vulkan_runner(text)
        if shape == "catalog":
            table = _catalog_table(paths, text, imported, separate, problems)
        else:
            said = problems if schema_values else []  # an unread schema.py was said already
            table = _literal_table(text, imported, separate, where, said)
    except SourceError as exc:
        problems.append(FactProblem("runners", where, f"{exc}: the era cannot be placed"))
        return None
    except hal0_code.Hal0CodeError as exc:
        why = f"{exc}: the era cannot be placed"
        problems.append(FactProblem("runners", where, why, not_understood=True))
        return None
    return table


def _literal_table(
    text: str, imported: dict[str, str], separate: bool, where: str, problems: list[FactProblem]
) -> Table:
    table = hal0_code.runners(text, imported=imported)
    problems.extend(
        FactProblem("runners", where, f"{why}: left out", not_understood=True)
        for why in table.problems
    )
    if separate or ("vulkanfpx" in table.images and "vulkanfpx" not in table.aliases):
        evidence = "RUNNER_IMAGES is a literal dict with a vulkanfpx runner of its own"
        return Table(
            dict(table.images),
            dict(table.manifest_keys),
            dict(table.aliases),
            RunnerShape.LITERAL_PRE_COLLAPSE,
            evidence,
            "vulkanfpx",
        )
    aliases = table.aliases or dict(image.NEWEST_KNOWN.aliases)
    evidence = "RUNNER_IMAGES is a literal dict; vulkanfpx is an alias of rocmfpx"
    return Table(
        dict(table.images),
        dict(table.manifest_keys),
        aliases,
        RunnerShape.LITERAL,
        evidence,
        "rocmfpx",
    )


def _catalog_table(
    paths: Hal0Paths,
    text: str,
    imported: dict[str, str],
    separate: bool,
    problems: list[FactProblem],
) -> Table:
    supplements = hal0_code.catalog_supplements(text, imported=imported)
    catalog: object | None = None
    path = paths.catalog
    why: str | None = None
    if path is not None:
        try:
            data = read_text(path, cap=MAX_SOURCE_BYTES)
            catalog = json.loads(data)
        except SourceError as exc:
            why = str(exc)
        except (ValueError, RecursionError) as exc:
            why = f"not valid JSON ({exc})"
    built, fallback = hal0_eras.catalog_table(catalog, supplements)
    if why is not None or (fallback is not None and catalog is not None):
        unknown = ", ".join(sorted(built.unknown)) or "none"
        line = (
            f"{why or fallback}: runners and images from _SUPPLEMENTS only "
            f"(image unknown, judged not capable: {unknown})"
        )
        problems.append(FactProblem("catalog", str(path), line))
    evidence = f"RUNNER_IMAGES = {hal0_code.CATALOG_BUILDER}() from {path}"
    return Table(
        built.images,
        built.manifest_keys,
        {},
        RunnerShape.CATALOG,
        evidence,
        "vulkanfpx" if separate else "rocmfpx",
        built.unknown,
    )
