"""What a pass did with each slot file: the outcome records and the pass's report."""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hal0_reconciler import errors
from hal0_reconciler.model import SlotKey, Verdict

if TYPE_CHECKING:
    from pathlib import Path

    from hal0_reconciler.slots import document

FIGHT_REASON = "fight: another writer keeps reverting this slot"


class OutcomeStatus(enum.StrEnum):
    UNCHANGED = "unchanged"  # kept, with the verdict's reason
    PENDING = "pending"  # dry run: would be relabelled (message: why comments would be lost)
    RELABELED = "relabeled"
    SKIPPED = "skipped"  # runtime unresolved
    HANDS_OFF = "hands-off"  # the daemon stopped fighting over this slot
    UNREADABLE = "unreadable"
    NOT_REGULAR = "not-regular"
    WRITE_FAILED = "write-failed"
    GONE = "gone"


class Hold(enum.StrEnum):
    """Why a HANDS_OFF outcome keeps its slot as it is (what the metrics count it by)."""

    OPERATOR = "operator"  # the operator's hands_off names the slot
    PAUSED = "paused"  # hal0's Vulkan opt-in while a gpu-vulkan relabel is due
    FIGHT = "fight"  # the daemon stopped fighting another writer over it


SAME = frozenset({OutcomeStatus.UNCHANGED, OutcomeStatus.SKIPPED, OutcomeStatus.PENDING})
"""Outcomes an unchanged file gets again in the same context (kept with the file's parse)."""


@dataclass(frozen=True)
class Outcome:
    """What a pass did with one slot file."""

    key: SlotKey
    path: Path
    name: str | None
    token: str | None  # the unit token; None when hal0 could not run the slot under it
    status: OutcomeStatus
    verdict: Verdict | None = None
    message: str | None = None
    unit_problem: str | None = None  # why the name or id is not one hal0 could run
    errno: int | None = None  # a failed write's OSError errno (EROFS, EACCES, ...)
    hold: Hold | None = None  # a HANDS_OFF outcome's reason


def of_doc(  # noqa: PLR0917 - the Outcome's own fields, in its order
    key: SlotKey,
    path: Path,
    doc: document.SlotDoc,
    status: OutcomeStatus,
    verdict: Verdict | None,
    message: str | None = None,
    *,
    hold: Hold | None = None,
) -> Outcome:
    """An outcome for a parsed slot: its token only when hal0 could run a unit by it."""
    problem = doc.unit_problem
    token = doc.token if problem is None else None
    return Outcome(key, path, doc.name, token, status, verdict, message, problem, hold=hold)


def write_failed(
    key: SlotKey, path: Path, doc: document.SlotDoc, verdict: Verdict, exc: Exception
) -> Outcome:
    """A relabel that could not be written: the error in one line, and its errno if any."""
    failed = of_doc(key, path, doc, OutcomeStatus.WRITE_FAILED, verdict, errors.describe(exc))
    return dataclasses.replace(failed, errno=getattr(exc, "errno", None))


@dataclass(frozen=True)
class PassReport:
    """Every file's outcome of one pass, how long it took, and what it read of hal0's api.env."""

    outcomes: tuple[Outcome, ...]
    duration: float
    held: tuple[Outcome, ...] = ()  # unreadable files read at once after a close: not reported
    vulkan_paused: bool = False  # HAL0_ALLOW_VULKAN_FALLBACK was set when the pass read api.env

    # looked at several times per pass (the daemon, the CLI): each filtered once, 10k outcomes
    @functools.cached_property
    def relabeled(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.status is OutcomeStatus.RELABELED)

    @functools.cached_property
    def pending(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.status is OutcomeStatus.PENDING)

    @functools.cached_property
    def failed(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.status is OutcomeStatus.WRITE_FAILED)
