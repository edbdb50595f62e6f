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


class Raw(bytes):
    """JSON text (UTF-8), put into the document as it is."""

    __slots__ = ()


class SlotsJson:
    """The ``slots`` object of status.json (keyed by file name), from cached fragments.

    The fragments live in a list joined in one C call; a changed slot's fragment is replaced in
    place, a gone slot's is swapped with the last one (the order of an object's members means
    nothing), so a batch costs what it changed plus one join.
    """

    def __init__(self) -> None:
        self._cache: dict[SlotKey, tuple[dict[str, Any], bytes]] = {}
        self._parts: list[bytes] = []
        self._keys: list[SlotKey] = []  # whose fragment each part is
        self._index: dict[SlotKey, int] = {}

    def render(
        self, slots: Mapping[SlotKey, dict[str, Any]], *, changed: Collection[SlotKey] | None = None
    ) -> Raw:
        """The ``slots`` object. ``changed``: the only keys that may differ from the last call
        (None: look at every entry, reusing the fragments of the very same objects)."""
        if changed is None:
            cache = self._cache
            self._cache = {key: _fragment(cache.get(key), key, e) for key, e in slots.items()}
            self._parts = [text for _, text in self._cache.values()]
            self._keys = list(self._cache)
            self._index = {key: i for i, key in enumerate(self._keys)}
        else:
            for key in changed:
                entry = slots.get(key)
                if entry is None:
                    self._drop(key)
                    continue
                fragment = self._cache[key] = _fragment(self._cache.get(key), key, entry)
                at = self._index.get(key)
                if at is None:
                    self._index[key] = len(self._parts)
                    self._parts.append(fragment[1])
                    self._keys.append(key)
                else:
                    self._parts[at] = fragment[1]
        if not self._parts:
            return Raw(b"{}")
        return Raw(b"{\n  " + b",\n  ".join(self._parts) + b"\n }")

    def _drop(self, key: SlotKey) -> None:
        self._cache.pop(key, None)
        at = self._index.pop(key, None)
        if at is None:
            return
        last, moved = self._parts.pop(), self._keys.pop()
        if at < len(self._parts):  # the last fragment takes the gone one's place
            self._parts[at], self._keys[at] = last, moved
            self._index[moved] = at


def _fragment(
    cached: tuple[dict[str, Any], bytes] | None, key: SlotKey, entry: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    if cached is not None and cached[0] is entry:
        return cached
    name = os.path.basename(key)  # a str: no Path objects
    text = json.dumps(name) + ": " + json.dumps(entry, sort_keys=True, default=str)
    return entry, text.encode("utf-8")


def dumps(snapshot: Mapping[str, Any]) -> list[bytes]:
    """``json.dumps(snapshot, indent=1, sort_keys=True, default=str)`` as UTF-8, with every
    top-level ``Raw`` value put in as it is: the pieces, to be written one after the other (the
    big part is never decoded, re-encoded or copied again)."""
    marker = f"@raw-{os.urandom(8).hex()}@"
    raws: list[Raw] = []
    plain: dict[str, Any] = {}
    for key, value in snapshot.items():
        if isinstance(value, Raw):
            plain[key] = f"{marker}{len(raws)}"
            raws.append(value)
        else:
            plain[key] = value
    text = json.dumps(plain, indent=1, sort_keys=True, default=str)
    placed = sorted((text.find(json.dumps(f"{marker}{n}")), n) for n in range(len(raws)))
    pieces: list[bytes] = []
    for _, n in placed:  # in the order sort_keys put them
        before, _, text = text.partition(json.dumps(f"{marker}{n}"))
        pieces += [before.encode("utf-8"), raws[n]]
    pieces.append(text.encode("utf-8"))
    return pieces
