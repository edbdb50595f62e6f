"""What the reconciler remembers across restarts: the slots it demoted to cpu itself.

Kept in ``<state_dir>/demotions.json`` (atomic writes). When the ROCm lane is usable again,
those slots go back to gpu-rocm; a slot the operator changed since is dropped from the record.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import fsio
from hal0_reconciler._log import get_logger
from hal0_reconciler.boundedread import ReadRefused, read_bounded
from hal0_reconciler.model import SlotKey

_log = get_logger("hal0_reconciler.state")
MAX_BYTES = 8 << 20
"""The cap on demotions.json read back (an entry is ~100 bytes: 80,000 slots fit)."""


@dataclass(frozen=True)
class Demotion:
    """A slot this reconciler moved to ``cpu``: its name, former label and when."""

    slot: str
    old: str
    at: float


class DemotionLedger:
    """The reconciler's own demotions, by slot key. Writes through to disk on every change.

    A ledger that cannot be written keeps working in memory and says so once.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: dict[SlotKey, Demotion] = {}
        self._write_failed = False
        if path is not None:
            self._entries = _read(path)

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> DemotionLedger:
        return cls(state_dir / "demotions.json")

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> frozenset[SlotKey]:
        return frozenset(self._entries)

    def record(self, key: SlotKey, *, slot: str, old: str) -> None:
        self._entries[key] = Demotion(slot, old, time.time())
        self._save()

    def drop(self, key: SlotKey) -> None:
        if self._entries.pop(key, None) is not None:
            self._save()

    def _save(self) -> None:
        if self._path is None:
            return
        payload = {k: {"slot": d.slot, "old": d.old, "at": d.at} for k, d in self._entries.items()}
        try:
            fsio.write_json(self._path, payload, indent=1)
        except OSError as exc:
            if not self._write_failed:
                _log.warning("state.write_failed", path=str(self._path), error=str(exc))
            self._write_failed = True
        else:
            self._write_failed = False


def _read(path: Path) -> dict[SlotKey, Demotion]:
    try:
        data = read_bounded(path, max_bytes=MAX_BYTES, missing_ok=True)
        if data is None:
            return {}
        raw = json.loads(data)
        return {
            SlotKey(k): Demotion(str(v["slot"]), str(v["old"]), float(v["at"]))
            for k, v in raw.items()
        }
    except ReadRefused as exc:
        _log.warning("state.unreadable", path=str(path), error=exc.reason)
        return {}
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        _log.warning("state.unreadable", path=str(path), error=str(exc))
        return {}
