"""A pass's outcomes in words and data: `plan`'s rows, notes and JSON entries, `once`'s summary.

Loaded by the command line with the reconcile engine, when a pass has run: `plan` on a folder
with no slot file to judge needs neither (``cli._plan``).
"""

from __future__ import annotations

import sys
from typing import Any

from hal0_reconciler import console
from hal0_reconciler.model import ImageResolution
from hal0_reconciler.reconcile import Outcome, OutcomeStatus, PassReport

UNJUDGED = frozenset({OutcomeStatus.UNREADABLE, OutcomeStatus.NOT_REGULAR, OutcomeStatus.SKIPPED})
"""Slot outcomes that mean "this file could not be judged": a person has to look at it."""


def unjudged(report: PassReport) -> int:
    """How many slot files of the pass could not be judged."""
    return sum(1 for o in report.outcomes if o.status in UNJUDGED)


def once_counts(report: PassReport) -> dict[str, int]:
    problems = {*UNJUDGED, OutcomeStatus.WRITE_FAILED}
    kept = {OutcomeStatus.UNCHANGED, OutcomeStatus.HANDS_OFF}
    return {
        "relabelled": len(report.relabeled),
        "kept": sum(1 for o in report.outcomes if o.status in kept),
        "problems": sum(1 for o in report.outcomes if o.status in problems),
    }


def once_lines(report: PassReport) -> list[str]:
    """What `once` did, for a person at a terminal: each change and problem, then counts.

    Coloured (``console.say(..., painted=True)``): names, labels and messages are the slot
    files' text, so each is made inert here."""
    counts = once_counts(report)
    out, inert = sys.stdout, console.inert
    lines = []
    for o in report.outcomes:
        v = o.verdict
        label = inert(f"{o.name} ({o.path.name})" if o.name else o.path.name)
        if o.status is OutcomeStatus.RELABELED and v is not None:
            change = f"{inert(v.old)} -> {inert(v.new)}"
            lines.append(f"  {console.paint('relabelled', 'green', out)} {label}: {change}")
        elif o.status is OutcomeStatus.WRITE_FAILED:
            why = inert(o.message)
            lines.append(f"  {console.paint('not written', 'red', out)} {label}: {why}")
        elif o.status in UNJUDGED:
            why = inert(o.message or (v.reason.value if v is not None else o.status.value))
            lines.append(
                f"  {console.paint('problem', 'yellow', out)} {label}: {o.status.value}: {why}"
            )
    lines.append(
        f"{counts['relabelled']} relabelled, {counts['kept']} kept, {counts['problems']} problem(s)"
    )
    return lines


def once_slots(report: PassReport) -> list[dict[str, Any]]:
    """`once --json`'s slot entries."""
    slots = []
    for o in report.outcomes:
        if o.status is OutcomeStatus.GONE:
            continue
        v = o.verdict
        slots.append(
            {
                "path": str(o.path),
                "slot": o.name,
                "status": o.status.value,
                "device": v.old if v else None,
                "new": v.new if v and o.status is OutcomeStatus.RELABELED else None,
                "reason": v.reason.value if v else None,
                "message": o.message,
            }
        )
    return slots


def plan_rows(report: PassReport) -> list[dict[str, str]]:
    """`plan`'s table, a row per slot file (its JSON entries have the same fields)."""
    rows = []
    for o in report.outcomes:
        v = o.verdict
        rows.append(
            {
                "slot": o.name or "-",
                "file": o.path.name,
                "runtime": v.runtime.value if v else "-",
                "device": v.old if v else "-",
                "action": _action_word(o.status),
                "new": (v.new or "") if v and o.status is OutcomeStatus.PENDING else "",
                "reason": v.reason.value if v else (o.message or ""),
                "image": (v.image.image or "-") if v and v.image else "-",
                "from": _rung_word(v.image) if v and v.image else "-",
                "capable": ("yes" if v.image.capable else "no") if v and v.image else "-",
            }
        )
    return rows


def plan_slots(report: PassReport) -> list[dict[str, Any]]:
    """`plan --json`'s slot entries: the table's fields (``None`` for an empty one) and more."""
    return [
        {
            "path": str(o.path),
            **{k: None if v in ("", "-") else v for k, v in row.items()},
            "effective_image": _image_json(o),
            **_comments_lost(o),
        }
        for o, row in zip(report.outcomes, plan_rows(report), strict=True)
    ]


def write_notes(report: PassReport) -> list[str]:
    """A line for each pending write that would not be byte-minimal or would be refused (for
    people: the file's name and the message are shown inert)."""
    notes = []
    inert = console.inert
    for o in report.outcomes:
        if o.status is OutcomeStatus.PENDING and o.message is not None:
            lost = "the write would rewrite the whole file, losing its comments and layout"
            notes.append(f"note: {inert(o.path.name)}: {lost} ({inert(o.message)})")
        elif o.status is OutcomeStatus.WRITE_FAILED:
            refused = f"the write would be refused ({inert(o.message)})"
            notes.append(f"note: {inert(o.path.name)}: {refused}")
    return notes


def _rung_word(image: ImageResolution) -> str:
    """The rung, marked when a stale former default was looked through to reach it."""
    return f"{image.rung.value}<-stale" if image.stale is not None else image.rung.value


def _action_word(status: OutcomeStatus) -> str:
    return {
        OutcomeStatus.PENDING: "relabel",
        OutcomeStatus.UNCHANGED: "keep",
        OutcomeStatus.SKIPPED: "skip",
    }.get(status, status.value)


def _comments_lost(o: Outcome) -> dict[str, Any]:
    """Whether a pending write would rewrite the whole file (comments lost), and why."""
    lost = o.message if o.status is OutcomeStatus.PENDING else None
    return {"loses_comments": lost is not None, "loses_comments_why": lost}


def _image_json(outcome: Outcome) -> dict[str, Any] | None:
    """A candidate's effective image: what, from which rung of which runner, capable or not."""
    v = outcome.verdict
    if v is None or v.image is None:
        return None
    i = v.image
    return {
        "image": i.image,
        "rung": i.rung.value,
        "runner": i.runner,
        "capable": i.capable,
        "stale_looked_through": i.stale,
        "error": i.error,
        "note": i.note,
        "explain": i.explain(),
    }
