"""hal0 1.4+'s runner pins: the ``runners`` table of its ``manifest.json``.  [pure]

Validated exactly as hal0's ``parse_runner_pins`` validates it (any violation makes the whole
table unusable: hal0 then judges every gpu-vulkan llama.cpp slot not capable; the reconciler
keeps every slot, degraded):

- the manifest is a JSON object whose ``runners`` is a non-empty object of objects;
- ``image`` is a non-empty string (stripped), a bare repo: no ``:`` in its last path part,
  no ``@``;
- ``tag`` and ``digest`` are null or non-empty strings (stripped); a digest is
  ``sha256:<64 lower-case hex>`` and needs a tag;
- ``lanes_gated`` is absent or a list of strings.

A row's ref is ``repo:tag@digest`` or ``repo:tag`` (``tag: null``: unpublished, no ref). The
Vulkan-capable set is every spelling (``repo:tag@digest``, ``repo:tag``, ``repo@digest``) of
the pin of each runner whose ``supported_backends`` holds ``vulkan`` and whose row's
``lanes_gated`` holds ``vulkan``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # hal0's re.match with ^...$: "$" allows a "\n"
ENV_PREFIX = "HAL0_RUNNER_IMAGE_"


class PinsError(Exception):
    """The pin table is missing or malformed (the message says where, as hal0 would)."""


@dataclass(frozen=True)
class Pin:
    key: str
    image: str
    tag: str | None
    digest: str | None
    lanes_gated: tuple[str, ...]

    @property
    def ref(self) -> str | None:
        """The pull ref; None for an unpublished row (hal0 raises there)."""
        if self.tag and self.digest:
            return f"{self.image}:{self.tag}@{self.digest}"
        if self.tag:
            return f"{self.image}:{self.tag}"
        return None

    def spellings(self) -> frozenset[str]:
        if self.tag is None:
            return frozenset()
        out = {f"{self.image}:{self.tag}"}
        if self.digest:
            out |= {f"{self.image}:{self.tag}@{self.digest}", f"{self.image}@{self.digest}"}
        return frozenset(out)


def parse(manifest: object) -> dict[str, Pin]:
    """The pin table of a parsed manifest. Raises PinsError."""
    if not isinstance(manifest, Mapping):
        raise PinsError("the manifest is not a JSON object")
    table = manifest.get("runners")
    if not isinstance(table, Mapping) or not table:
        raise PinsError("the manifest has no `runners` pin table")
    pins: dict[str, Pin] = {}
    for key, row in table.items():
        if not isinstance(row, Mapping):
            raise PinsError(f"runners.{key} must be an object")
        image = _str_or_none(row.get("image"), "image", key)
        if image is None:
            raise PinsError(f"runners.{key}.image is required")
        if ":" in image.rsplit("/", 1)[-1] or "@" in image:
            raise PinsError(f"runners.{key}.image must be a bare repo (no tag or digest)")
        tag = _str_or_none(row.get("tag"), "tag", key)
        digest = _str_or_none(row.get("digest"), "digest", key)
        if digest is not None and not _digest_ok(digest):
            raise PinsError(f"runners.{key}.digest must be sha256:<64 hex>")
        if digest is not None and tag is None:
            raise PinsError(f"runners.{key} has a digest but no tag")
        lanes = row.get("lanes_gated", [])
        if not isinstance(lanes, list) or not all(isinstance(x, str) for x in lanes):
            raise PinsError(f"runners.{key}.lanes_gated must be a list of backends")
        pins[str(key)] = Pin(str(key), image, tag, digest, tuple(lanes))
    return pins


def capable(pins: Mapping[str, Pin], vulkan_runners: Collection[str]) -> frozenset[str]:
    """hal0's ``vulkan_capable_refs``: the spellings of each Vulkan runner's gated pin."""
    refs: set[str] = set()
    for key in vulkan_runners:
        pin = pins.get(key)
        if pin is not None and "vulkan" in pin.lanes_gated:
            refs |= pin.spellings()
    return frozenset(refs)


def _digest_ok(digest: str) -> bool:
    # hal0 strips the digest, then re.match("^sha256:[0-9a-f]{64}$"): a trailing "\n" cannot
    # survive the strip, so a full match is the same test
    return _DIGEST.fullmatch(digest) is not None


def _str_or_none(value: object, field: str, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise PinsError(f"runners.{key}.{field} must be a non-empty string or null")
    return value.strip()
