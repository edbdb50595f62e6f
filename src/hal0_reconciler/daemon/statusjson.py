"""status.json text whose cost is what changed: each slot's entry is rendered once, when it
changes, and the document is spliced from those fragments (one slot per line).

``SlotsJson.render`` returns the ``slots`` object as ``RawParts`` (cached blocks of fragments);
``dumps`` writes a snapshot holding such parts (or a ``Raw`` fragment) without joining them. An
entry is re-rendered only when it is not the very object rendered last time (``passes`` keeps
an unchanged entry's identity).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from typing import Any, cast

from hal0_reconciler.model import SlotKey


class Raw(bytes):
    """JSON text (UTF-8), put into the document as it is."""

    __slots__ = ()


class RawParts(tuple[bytes, ...]):
    """JSON text (UTF-8) in pieces, put into the document one after the other: never joined
    into one buffer (status.json's slots are ~1.5 MB at 10k slots)."""

    __slots__ = ()

    def joined(self) -> bytes:
        return b"".join(self)


BLOCK = 256
"""Slot fragments per cached block: a changed slot re-joins its block only (~40 KB)."""
_SEP = b",\n  "


class SlotsJson:
    """The ``slots`` object of status.json (keyed by file name), from cached fragments.

    The fragments live in a list, joined in blocks (``BLOCK`` fragments each) kept until one
    of their fragments changes; a changed slot's fragment is replaced in place, a gone slot's
    is swapped with the last one (the order of an object's members means nothing). A batch
    costs what it changed, one join per block it touched, and a list of the blocks.
    """

    def __init__(self, *, block: int = BLOCK) -> None:
        self._block = block
        self._cache: dict[SlotKey, tuple[dict[str, Any], bytes]] = {}
        self._parts: list[bytes] = []
        self._keys: list[SlotKey] = []  # whose fragment each part is
        self._index: dict[SlotKey, int] = {}
        self._blocks: list[bytes | None] = []  # joined parts; None: to join again

    def render(
        self, slots: Mapping[SlotKey, dict[str, Any]], *, changed: Collection[SlotKey] | None = None
    ) -> RawParts:
        """The ``slots`` object. ``changed``: the only keys that may differ from the last call
        (None: look at every entry, reusing the fragments of the very same objects)."""
        if changed is None:
            cache = self._cache
            self._cache = {key: _fragment(cache.get(key), key, e) for key, e in slots.items()}
            parts = [text for _, text in self._cache.values()]
            size = self._block
            old_parts, old_blocks = self._parts, self._blocks
            self._blocks = [  # a block keeps its text while its parts are the very same
                old_blocks[n] if parts[at : at + size] == old_parts[at : at + size] else None
                for n, at in enumerate(range(0, min(len(parts), len(old_blocks) * size), size))
            ]
            self._parts = parts
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
                    self._touch(len(self._parts) - 1)
                elif self._parts[at] is not fragment[1]:
                    self._parts[at] = fragment[1]
                    self._touch(at)
        if not self._parts:
            return RawParts((b"{}",))
        return RawParts((b"{\n  ", *self._joined(), b"\n }"))

    def _touch(self, at: int) -> None:
        block = at // self._block
        if block < len(self._blocks):
            self._blocks[block] = None

    def _joined(self) -> list[bytes]:
        """Every block's text, each but the first led by the separator."""
        size = self._block
        count = -(-len(self._parts) // size)
        del self._blocks[count:]
        self._blocks += [None] * (count - len(self._blocks))
        for n, block in enumerate(self._blocks):
            if block is None:
                lead = [b""] if n else []
                self._blocks[n] = _SEP.join([*lead, *self._parts[n * size : (n + 1) * size]])
        return cast("list[bytes]", self._blocks)

    def _drop(self, key: SlotKey) -> None:
        self._cache.pop(key, None)
        at = self._index.pop(key, None)
        if at is None:
            return
        last, moved = self._parts.pop(), self._keys.pop()
        self._touch(len(self._parts))  # the last block lost its last part
        if at < len(self._parts):  # the last fragment takes the gone one's place
            self._parts[at], self._keys[at] = last, moved
            self._index[moved] = at
            self._touch(at)


def _fragment(
    cached: tuple[dict[str, Any], bytes] | None, key: SlotKey, entry: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    if cached is not None and cached[0] is entry:
        return cached
    name = os.path.basename(key)  # a str: no Path objects
    text = json.dumps(name) + ": " + _encode_entry(entry)
    return entry, text.encode("utf-8")


_encode_entry = json.JSONEncoder(sort_keys=True, default=str).encode
"""``json.dumps(entry, sort_keys=True, default=str)``, with one encoder for every entry."""


def dumps(snapshot: Mapping[str, Any]) -> list[bytes]:
    """``json.dumps(snapshot, indent=1, sort_keys=True, default=str)`` as UTF-8, with every
    top-level ``Raw`` value put in as it is: the pieces, to be written one after the other (the
    big part is never decoded, re-encoded or copied again)."""
    marker = f"@raw-{os.urandom(8).hex()}@"
    raws: list[Raw | RawParts] = []
    plain: dict[str, Any] = {}
    for key, value in snapshot.items():
        if isinstance(value, Raw | RawParts):
            plain[key] = f"{marker}{len(raws)}"
            raws.append(value)
        else:
            plain[key] = value
    text = json.dumps(plain, indent=1, sort_keys=True, default=str)
    placed = sorted((text.find(json.dumps(f"{marker}{n}")), n) for n in range(len(raws)))
    pieces: list[bytes] = []
    for _, n in placed:  # in the order sort_keys put them
        before, _, text = text.partition(json.dumps(f"{marker}{n}"))
        raw = raws[n]
        pieces += [before.encode("utf-8"), *(raw if isinstance(raw, RawParts) else (raw,))]
    pieces.append(text.encode("utf-8"))
    return pieces
