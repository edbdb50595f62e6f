"""status.json text whose cost is what changed: each slot's entry is rendered once, when it
changes, and the document is spliced from those fragments (one slot per line).

``SlotsJson.render`` returns a ``Raw`` fragment for the ``slots`` object; ``dumps`` writes a
snapshot that holds such fragments. An entry is re-rendered only when it is not the very object
rendered last time (``passes`` keeps an unchanged entry's identity).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from hal0_reconciler.model import SlotKey


class Raw(str):
    """JSON text, put into the document as it is."""

    __slots__ = ()


class SlotsJson:
    """The ``slots`` object of status.json (keyed by file name), from cached fragments."""

    def __init__(self) -> None:
        self._cache: dict[SlotKey, tuple[dict[str, Any], str]] = {}

    def render(self, slots: Mapping[SlotKey, dict[str, Any]]) -> Raw:
        cache = self._cache
        fresh: dict[SlotKey, tuple[dict[str, Any], str]] = {}
        parts = []
        for key, entry in slots.items():
            cached = cache.get(key)
            if cached is None or cached[0] is not entry:
                name = os.path.basename(key)  # a str: no Path objects
                text = json.dumps(name) + ": " + json.dumps(entry, sort_keys=True, default=str)
                cached = (entry, text)
            fresh[key] = cached
            parts.append(cached[1])
        self._cache = fresh
        if not parts:
            return Raw("{}")
        return Raw("{\n  " + ",\n  ".join(parts) + "\n }")


def dumps(snapshot: Mapping[str, Any]) -> str:
    """``json.dumps(snapshot, indent=1, sort_keys=True, default=str)``, with every top-level
    ``Raw`` value put in as it is."""
    marker = f"@raw-{os.urandom(8).hex()}@"
    raws: dict[str, Raw] = {}
    plain: dict[str, Any] = {}
    for key, value in snapshot.items():
        if isinstance(value, Raw):
            raws[f"{marker}{len(raws)}"] = value
            plain[key] = f"{marker}{len(raws) - 1}"
        else:
            plain[key] = value
    text = json.dumps(plain, indent=1, sort_keys=True, default=str)
    for placeholder, raw in raws.items():
        text = text.replace(json.dumps(placeholder), raw, 1)
    return text
