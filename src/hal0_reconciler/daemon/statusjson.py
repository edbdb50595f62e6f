"""status.json text whose cost is what changed: each slot's entry is rendered once, when it
changes, and the document is spliced from those fragments (one slot per line).

``SlotsJson.render`` returns a ``Raw`` fragment for the ``slots`` object; ``dumps`` writes a
snapshot that holds such fragments. An entry is re-rendered only when it is not the very object
rendered last time (``passes`` keeps an unchanged entry's identity).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from typing import Any

from hal0_reconciler.model import SlotKey


class Raw(str):
    """JSON text, put into the document as it is."""

    __slots__ = ()


class SlotsJson:
    """The ``slots`` object of status.json (keyed by file name), from cached fragments."""

    def __init__(self) -> None:
        self._cache: dict[SlotKey, tuple[dict[str, Any], str]] = {}

    def render(
        self, slots: Mapping[SlotKey, dict[str, Any]], *, changed: Collection[SlotKey] | None = None
    ) -> Raw:
        """The ``slots`` object. ``changed``: the only keys that may differ from the last call
        (None: look at every entry, reusing the fragments of the very same objects)."""
        if changed is None:
            cache = self._cache
            self._cache = {key: self._fragment(cache.get(key), key, e) for key, e in slots.items()}
        else:
            for key in changed:
                entry = slots.get(key)
                if entry is None:
                    self._cache.pop(key, None)
                else:
                    self._cache[key] = self._fragment(self._cache.get(key), key, entry)
        if not self._cache:
            return Raw("{}")
        return Raw("{\n  " + ",\n  ".join(t for _, t in self._cache.values()) + "\n }")

    @staticmethod
    def _fragment(
        cached: tuple[dict[str, Any], str] | None, key: SlotKey, entry: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        if cached is not None and cached[0] is entry:
            return cached
        name = os.path.basename(key)  # a str: no Path objects
        return entry, json.dumps(name) + ": " + json.dumps(entry, sort_keys=True, default=str)


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
