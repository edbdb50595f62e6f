"""The operator's files hal0 reads for images: ``[slots].default_images`` in ``hal0.toml``
(validated as the release's ``SlotsConfig``) and the image overrides in ``api.env``."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hal0_reconciler.host import envfile
from hal0_reconciler.host.hal0 import defaults, pins, pysource, slotsconfig
from hal0_reconciler.host.hal0.sources import (
    MAX_CONFIG_BYTES,
    MAX_SOURCE_BYTES,
    FactProblem,
    SourceError,
    read_text,
)

if TYPE_CHECKING:
    from pathlib import Path


def raw_default_images(path: Path, problems: list[FactProblem]) -> object:
    """``[slots].default_images`` as written (None: none; hal0.toml unreadable: said)."""
    try:
        data = tomllib.loads(read_text(path, missing_ok=True, cap=MAX_CONFIG_BYTES))
    except SourceError as exc:
        problems.append(FactProblem("hal0.toml", str(path), f"{exc}: no default_images used"))
        return None
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        why = f"not valid TOML ({exc}): no default_images used"
        problems.append(FactProblem("hal0.toml", str(path), why))
        return None
    table = data.get("slots", {})
    if not isinstance(table, dict):
        return None
    return table.get("default_images")


def validated_images(
    path: Path,
    raw: object,
    runner_keys: set[str] | frozenset[str],
    aliases: Mapping[str, str],
    problems: list[FactProblem],
    *,
    schema: Path | None = None,
) -> dict[str, str]:
    """``raw`` as hal0 validates it; with ``schema`` (the installed ``schema.py``), the rest of
    ``[slots]`` is judged by its ``SlotsConfig`` too: a refused table gives no images."""
    if raw is None:
        return {}
    images, refused = defaults.validate(raw, runner_keys, aliases)
    if refused is None and images and schema is not None:
        refused = _slots_refusal(path, schema, problems)
        images = {} if refused is not None else images
    if refused is not None:
        why = f"{refused}: hal0 refuses this hal0.toml, so no default_images are used"
        problems.append(FactProblem("hal0.toml", str(path), why))
    return images


def _slots_refusal(path: Path, schema: Path, problems: list[FactProblem]) -> str | None:
    """Why the installed ``SlotsConfig`` refuses ``[slots]`` (None: accepted, or not judged:
    then said, and its ``default_images`` are used as written)."""
    keep = "its default_images are used as written"
    try:
        data = tomllib.loads(read_text(path, missing_ok=True, cap=MAX_CONFIG_BYTES))
        table = data.get("slots", {})
        rules = slotsconfig.read(pysource.tree(read_text(schema, cap=MAX_SOURCE_BYTES)))
        if rules is None:
            why = f"[slots] not judged ({schema} defines no SlotsConfig): {keep}"
            problems.append(FactProblem("hal0.toml", str(path), why))
            return None
        return slotsconfig.refusal(table, rules) if isinstance(table, dict) else None
    except (SourceError, tomllib.TOMLDecodeError, RecursionError, ValueError):
        return None  # the first read of the file said why
    except (pysource.Hal0CodeError, slotsconfig.Unjudged) as exc:
        problems.append(FactProblem("hal0.toml", str(path), f"{exc}: {keep}"))
        return None


def environment(path: Path, problems: list[FactProblem]) -> dict[str, str]:
    try:
        values = envfile.read_unit_environment(path)
    except OSError as exc:
        why = f"cannot be read ({_why(exc)}): no image overrides used"
        problems.append(FactProblem("environment", str(path), why))
        return {}
    return {
        k: v for k, v in values.items() if k.startswith(("HAL0_TOOLBOX_IMAGE_", pins.ENV_PREFIX))
    }


def _why(exc: OSError) -> str:
    """An OS error for people: its text, without Python's ``[Errno N]`` decoration."""
    return (exc.strerror or type(exc).__name__).lower()
