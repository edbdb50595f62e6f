"""Reading what a running slot was started for, and the memory of the restarts made for it.

The rendered Quadlet units (``hal0-slot@<token>.container`` in ``quadlet_dir``) are root's, but
they are still read through ``boundedread``: capped, regular files only, never through a link;
a missing file is a slot hal0 has not rendered (nothing runs). The decision is
``running_lane``'s; here are the reads, the launch images of both GPU lanes (the installed
hal0's ladder, ``slots.image``), and ``AppliedMemory``: the labels this daemon wrote and the
changes a restart was already made for (slot token, label and the unit's image/device
fingerprint), kept in the state folder so a restart is never repeated for the same change, even
after the daemon restarts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hal0_reconciler import _log, boundedread, errors, fsio
from hal0_reconciler.host.restarts import running_lane
from hal0_reconciler.host.restarts.running_lane import Intent, LabelCheck, RenderedUnit
from hal0_reconciler.model import Hal0Facts
from hal0_reconciler.slots import document, image

log = _log.get_logger("hal0_reconciler.host.restarts.label_check")

UNIT_MAX_BYTES = 1 << 20
MEMORY_FILE = "labels-applied.json"
_MEMORY_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Candidate:
    """A llama.cpp slot whose label is to be compared with what runs."""

    name: str
    token: str
    label: str  # the device label in its file now
    path: Path  # the slot file (read again for image_pin and binary when it is rendered)
    hands_off: bool = False


def unit_file_name(token: str) -> str:
    return f"hal0-slot@{token}.container"


def rendered_names(quadlet_dir: Path) -> frozenset[str]:
    """The names in hal0's Quadlet folder (one listing; empty when it cannot be listed)."""
    try:
        return frozenset(os.listdir(quadlet_dir))
    except OSError:
        return frozenset()


def unit_identities(
    quadlet_dir: Path, tokens: Iterable[str]
) -> tuple[frozenset[str], tuple[tuple[str, tuple[int, ...] | None], ...]]:
    """What the look would read of the Quadlet folder: its names, and the identity
    (``lstat``: device, inode, size, mtime, ctime) of each of ``tokens``' rendered units."""
    names = rendered_names(quadlet_dir)
    found: list[tuple[str, tuple[int, ...] | None]] = []
    for token in tokens:
        name = unit_file_name(token)
        if name not in names:
            continue
        try:
            st = os.lstat(quadlet_dir / name)
        except OSError:
            found.append((name, None))
            continue
        found.append((name, fsio.full_identity(st)))
    return names, tuple(found)


def read_unit(quadlet_dir: Path, token: str) -> RenderedUnit | str | None:
    """The rendered unit of ``token``; None when it is not rendered; a string says why it
    could not be read."""
    path = quadlet_dir / unit_file_name(token)
    try:
        text = boundedread.read_bounded_text(path, max_bytes=UNIT_MAX_BYTES, missing_ok=True)
    except boundedread.ReadRefused as exc:
        return f"the rendered unit could not be read: {exc.reason}"
    return None if text is None else running_lane.parse_container(text)


def launch_images(slot: document.SlotDoc, facts: Hal0Facts) -> dict[str, str | None]:
    """The image hal0 launches for the slot on each GPU lane (what its renderer writes in
    ``Image=``: the ladder's result before any stale look-through)."""
    found: dict[str, str | None] = {}
    for lane in running_lane.GPU_LANES:
        moved = dataclasses.replace(slot, device=lane, raw_device=lane)
        resolution = image.effective_image(moved, facts)
        found[lane] = resolution.stale or resolution.image
    return found


def _slot_doc(path: Path, *, max_bytes: int) -> document.SlotDoc | str:
    try:
        text = boundedread.read_bounded_text(path, max_bytes=max_bytes)
        assert text is not None  # noqa: S101 - missing_ok is not set
        return document.parse_slot(text, stem=path.stem)
    except (boundedread.ReadRefused, errors.ReconcilerError) as exc:
        return f"the slot file could not be read again: {exc}"


@dataclass(frozen=True)
class Looked:
    """One rendered slot, as found: the check and the rendering's fingerprint."""

    candidate: Candidate
    check: LabelCheck
    fingerprint: str | None


def look(
    candidates: Iterable[Candidate],
    *,
    quadlet_dir: Path,
    facts: Hal0Facts,
    memory: AppliedMemory,
    intent: Intent,
    slot_max_bytes: int,
) -> list[Looked]:
    """Each candidate hal0 has rendered (hands-off slots are not looked at)."""
    names = rendered_names(quadlet_dir)
    found: list[Looked] = []
    for c in candidates:
        if c.hands_off or unit_file_name(c.token) not in names:
            continue
        unit = read_unit(quadlet_dir, c.token)
        if unit is None:
            continue
        if isinstance(unit, str):
            found.append(Looked(c, running_lane.cannot_read(c.label, unit), None))
            continue
        doc = _slot_doc(c.path, max_bytes=slot_max_bytes)
        if isinstance(doc, str):
            found.append(Looked(c, running_lane.cannot_read(c.label, doc), None))
            continue
        fingerprint = unit.fingerprint()
        running = running_lane.running_lanes(
            unit, launch_images(doc, facts), marker=facts.device_marker
        )
        mine = dataclasses.replace(
            intent,
            ours=memory.ours(c.token, c.label),
            tried=memory.tried(c.token, c.label, fingerprint),
        )
        found.append(Looked(c, running_lane.judge(c.label, running, mine), fingerprint))
    return found


class AppliedMemory:
    """Labels this daemon wrote, and the changes restarted for (``token -> label|fingerprint``;
    an empty fingerprint: requested before the unit was read, bound at the next look)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._written: dict[str, str] = {}
        self._restarted: dict[str, str] = {}
        self.revision = 0  # bumped at each change (the daemon's look skips an unchanged world)
        if path is not None:
            self._load(path)

    @classmethod
    def read_only(cls, path: Path) -> AppliedMemory:
        """The memory as the daemon left it, never written (for ``plan``)."""
        memory = cls(None)
        memory._load(path)
        return memory

    def _load(self, path: Path) -> None:
        try:
            text = boundedread.read_bounded_text(path, max_bytes=_MEMORY_MAX_BYTES, missing_ok=True)
            doc = json.loads(text or "{}")
        except (boundedread.ReadRefused, ValueError) as exc:
            log.warning("slot.label_memory_unreadable", path=str(path), error=str(exc))
            return
        if isinstance(doc, dict):
            self._written = _strings(doc.get("written"))
            self._restarted = _strings(doc.get("restarted"))

    def ours(self, token: str, label: str) -> bool:
        return self._written.get(token) == label

    def tried(self, token: str, label: str, fingerprint: str) -> bool:
        """A restart was made for this label; one requested before the unit was read is
        bound to this rendering now."""
        made = self._restarted.get(token)
        if made == f"{label}|":
            self._restarted[token] = f"{label}|{fingerprint}"
            self._save()
            return True
        return made == f"{label}|{fingerprint}"

    def note_written(self, written: Iterable[tuple[str, str]]) -> None:
        """This daemon wrote each ``(token, label)`` and asked for its restart already; the
        memory is saved once for them all (a pass's relabels: one write, not one per relabel)."""
        noted = False
        for token, label in written:
            self._written[token] = label
            self._restarted[token] = f"{label}|"
            noted = True
        if noted:
            self._save()

    def note_restarted(self, token: str, label: str, fingerprint: str | None) -> None:
        self._restarted[token] = f"{label}|{fingerprint or ''}"
        self._save()

    def keep_only(self, tokens: Iterable[str]) -> None:
        """After a look at every slot: forget the slots that are gone (bounded memory)."""
        kept = set(tokens)
        written = {t: v for t, v in self._written.items() if t in kept}
        restarted = {t: v for t, v in self._restarted.items() if t in kept}
        if written != self._written or restarted != self._restarted:
            self._written, self._restarted = written, restarted
            self._save()

    def _save(self) -> None:
        self.revision += 1
        if self._path is None:
            return
        doc = {"written": self._written, "restarted": self._restarted}
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fsio.write_json(self._path, doc, mode=0o600)
        except OSError as exc:
            log.warning("slot.label_memory_unwritable", path=str(self._path), error=str(exc))


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}
