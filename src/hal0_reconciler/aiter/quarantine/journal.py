"""The journal of a heal or a restore: its moves, written (and fsynced) before any is made.

A journal lives in the quarantine folder the operation works on (``journal.json``); its keyed
digest is in root's state. Each move names a relative path (``module_x.so`` or
``build/module_x``) and the two places it goes between: ``jit`` (the JIT folder) or a quarantine
id. Rolling is the same code for a live operation and for one a kill interrupted:

- forward, in order: a move whose destination holds something is done; else its source is moved;
- back, in reverse: a move whose source holds something is undone already; else its destination
  is moved back.

A move with neither end present is a lost file: the roll stops there and says so. Forward is
chosen when every manifest the journal names is complete (present and written by this daemon),
back otherwise, so each module ends in exactly one place.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum

JOURNAL = "journal.json"
JIT = "jit"
_MODULE = re.compile(r"module_[A-Za-z0-9_]+")


class Op(StrEnum):
    HEAL = "heal"
    RESTORE = "restore"


class Direction(StrEnum):
    FORWARD = "forward"
    BACK = "back"


class JournalInvalid(ValueError):
    """A journal (or manifest) that does not describe moves this code makes."""


@dataclass(frozen=True)
class Step:
    """One rename: ``rel`` from place ``src`` to place ``dst`` (``jit`` or a quarantine id)."""

    rel: str
    src: str
    dst: str


@dataclass(frozen=True)
class Journal:
    op: Op
    home: str  # the quarantine folder holding this journal
    creates: str | None  # the quarantine folder this operation made (removed when rolled back)
    manifests: tuple[str, ...]  # quarantines whose complete manifest means "forward"
    steps: tuple[Step, ...]

    def encode(self) -> bytes:
        return json.dumps(
            {
                "op": str(self.op),
                "home": self.home,
                "creates": self.creates,
                "manifests": list(self.manifests),
                "moves": [{"rel": s.rel, "from": s.src, "to": s.dst} for s in self.steps],
            },
            indent=1,
        ).encode("utf-8")


def module_of(rel: str) -> str:
    """The module a relative path belongs to: ``module_x.so`` or ``build/module_x`` only."""
    head, _, tail = rel.partition("/")
    if not tail and rel.endswith(".so") and _MODULE.fullmatch(rel[:-3]):
        return rel[:-3]
    if head == "build" and _MODULE.fullmatch(tail):
        return tail
    raise JournalInvalid(f"{rel!r} is not a module file or a module's build folder")


def is_module_name(name: str) -> bool:
    return _MODULE.fullmatch(name) is not None


def decode(data: bytes, *, home: str) -> Journal:
    """Parse a journal; anything that is not exactly what ``encode`` writes is JournalInvalid."""
    try:
        raw = json.loads(data)
        op = Op(raw["op"])
        creates = raw["creates"]
        manifests = tuple(str(m) for m in raw["manifests"])
        steps = tuple(Step(str(m["rel"]), str(m["from"]), str(m["to"])) for m in raw["moves"])
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalInvalid(f"unreadable journal ({type(exc).__name__}: {exc})") from None
    if raw.get("home") != home or not (creates is None or isinstance(creates, str)):
        raise JournalInvalid("the journal names another quarantine")
    for step in steps:
        module_of(step.rel)
        if JIT not in {step.src, step.dst} or step.src == step.dst:
            raise JournalInvalid(f"move {step.rel} is not between the JIT folder and a quarantine")
    return Journal(op, home, creates, manifests, steps)


def next_action(direction: Direction, *, src_present: bool, dst_present: bool) -> str:
    """What rolling one step means now: ``move`` (src→dst), ``undo`` (dst→src), ``skip``, or
    ``lost`` (neither end holds it)."""
    if direction is Direction.FORWARD:
        if dst_present:
            return "skip"
        return "move" if src_present else "lost"
    if src_present:
        return "skip"
    return "undo" if dst_present else "lost"


def ordered(journal: Journal, direction: Direction) -> tuple[Step, ...]:
    return journal.steps if direction is Direction.FORWARD else tuple(reversed(journal.steps))
