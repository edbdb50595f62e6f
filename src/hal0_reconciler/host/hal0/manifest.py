"""hal0's ``manifest.json`` as each era reads it: 1.4+'s ``runners`` pins (validated whole,
fail closed), 1.0-1.3's ``toolbox_images`` refs (errors swallowed: the bundled image then)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hal0_reconciler.host.hal0 import api_start, manifestlink, pins
from hal0_reconciler.host.hal0.sources import (
    MAX_CONFIG_BYTES,
    FactProblem,
    SourceError,
    read_text,
)

if TYPE_CHECKING:
    from pathlib import Path

    from hal0_reconciler.host.hal0.paths import Hal0Paths


def _note_newer_than_api(path: Path, venv: Path | None, problems: list[FactProblem]) -> None:
    """Say so when the manifest changed after the running hal0-api read its own copy."""
    if venv is None:
        return
    try:
        changed = path.stat().st_mtime
    except OSError:
        return
    started = api_start.started_at(venv)
    if started is not None and changed > started:
        why = (
            "changed after hal0-api started: judged by the file; hal0-api judges by the "
            "manifest it read until it restarts"
        )
        problems.append(FactProblem("manifest", str(path), why))


def pin_table(
    paths: Hal0Paths,
    problems: list[FactProblem],
    sources: dict[str, str],
    venv: Path | None = None,
) -> tuple[dict[str, pins.Pin] | None, str | None]:
    """The first manifest of 1.4+'s search order, parsed; or why there are no pins (loud)."""
    candidates = paths.manifests(pins_era=True)
    for path in candidates:
        try:
            real = manifestlink.real_manifest(path)
            text = read_text(real, missing_ok=True, cap=MAX_CONFIG_BYTES)
        except manifestlink.LinkRefused as exc:
            why = f"{path}: {exc}: refused (root follows a link only on root's ground)"
            break
        except SourceError as exc:
            why = f"{path}: {exc}"
            break
        if not text and not path.exists():
            continue
        sources["manifest"] = str(path)
        try:
            table = pins.parse(json.loads(text))
        except (ValueError, RecursionError) as exc:
            why = f"{path}: not valid JSON ({exc})"
        except pins.PinsError as exc:
            why = f"{path}: {exc}"
        else:
            _note_newer_than_api(path, venv, problems)
            return table, None
        break
    else:
        why = f"no manifest.json (looked at {', '.join(str(p) for p in candidates)})"
    line = (
        f"{why}: hal0 calls every gpu-vulkan slot not capable here; every slot is kept until "
        "the manifest is valid"
    )
    problems.append(FactProblem("manifest", str(candidates[0]), line, not_understood=True))
    return None, line


def toolbox_refs(
    candidates: tuple[Path, ...], problems: list[FactProblem], sources: dict[str, str]
) -> dict[str, str]:
    """1.0-1.3's ``manifest_image_ref`` for every ``toolbox_images`` key (``<repo>@<digest>``,
    else the tag); a missing or bad manifest gives none (hal0 then uses the bundled image)."""
    for path in candidates:
        try:
            text = read_text(
                manifestlink.real_manifest(path), missing_ok=True, cap=MAX_CONFIG_BYTES
            )
        except manifestlink.LinkRefused as exc:
            why = f"{exc}: refused (root follows a link only on root's ground), not used"
            problems.append(FactProblem("manifest", str(path), why))
            continue
        except SourceError as exc:
            problems.append(FactProblem("manifest", str(path), f"{exc}: not used"))
            continue
        if not text:
            continue
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            problems.append(FactProblem("manifest", str(path), f"not valid JSON ({exc}): not used"))
            return {}
        sources["manifest"] = str(path)
        images = data.get("toolbox_images") if isinstance(data, dict) else None
        if not isinstance(images, dict):
            return {}
        return {key: ref for key, entry in images.items() if (ref := _manifest_ref(entry))}
    return {}


def _manifest_ref(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return None
    tag, digest = entry.get("tag"), entry.get("digest")
    tag = str(tag) if tag else None
    if isinstance(digest, str) and digest.startswith("sha256:") and tag and "@" not in tag:
        repo = tag.rsplit(":", 1)[0] if ":" in tag.split("/")[-1] else tag
        return f"{repo}@{digest}"
    return tag
