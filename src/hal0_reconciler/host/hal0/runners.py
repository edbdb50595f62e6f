"""hal0's runner table as the installed release defines it.

- 1.0.0-1.3.0: a literal ``RUNNER_IMAGES`` dict of ``Runner(key, image, ..., manifest_key)``,
  the images named from ``schema.py`` resolved to its values; 1.0.0 has a ``vulkanfpx`` runner
  of its own, 1.1.0+ an alias ``vulkanfpx`` -> ``rocmfpx`` (``RUNNER_ALIASES``);
- 1.4+: the runner keys and each runner's ``supported_backends`` (images come from the
  manifest's pins, :mod:`hal0_reconciler.host.hal0.pins`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hal0_reconciler.host.hal0 import pysource
from hal0_reconciler.host.hal0.sources import (
    MAX_SOURCE_BYTES,
    FactProblem,
    SourceError,
    read_text,
)

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Table:
    """1.0-1.3: bundled images, manifest keys and aliases per runner key."""

    images: dict[str, str]
    manifest_keys: dict[str, str]
    aliases: dict[str, str]


def allowlist_table(
    path: Path,
    schema_values: Mapping[str, str | frozenset[str]],
    default_image: str,
    problems: list[FactProblem],
) -> Table | None:
    """The 1.0-1.3 runner table (None: not read, said as a problem)."""
    where = str(path)
    try:
        text = read_text(path, cap=MAX_SOURCE_BYTES)
        names = pysource.imported_names(text, "hal0.config.schema")
        known = {**schema_values, "DEFAULT_ROCMFPX_IMAGE": default_image}
        imported = {n: v for n in names if isinstance(v := known.get(n), str)}
        table = pysource.runners(text, imported=imported)
    except SourceError as exc:
        problems.append(
            FactProblem("runners", where, f"{exc}: every slot is kept", not_understood=True)
        )
        return None
    except pysource.Hal0CodeError as exc:
        problems.append(
            FactProblem("runners", where, f"{exc}: every slot is kept", not_understood=True)
        )
        return None
    problems.extend(
        FactProblem("runners", where, f"{why}: left out", not_understood=True)
        for why in table.problems
    )
    return Table(dict(table.images), dict(table.manifest_keys), dict(table.aliases))


def pins_runners(path: Path, problems: list[FactProblem]) -> dict[str, tuple[str, ...]] | None:
    """1.4+: runner key -> supported_backends (None: not read, said as a loud problem)."""
    try:
        return pysource.runner_backends(read_text(path, cap=MAX_SOURCE_BYTES))
    except (SourceError, pysource.Hal0CodeError) as exc:
        problems.append(
            FactProblem("runners", str(path), f"{exc}: every slot is kept", not_understood=True)
        )
        return None
