"""``plan``: the dry run: per slot, what would change and why, as a table or ``--json``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from hal0_reconciler import console, settings
from hal0_reconciler.cli import hostview, preflight
from hal0_reconciler.cli.exits import EXIT_OK, EXIT_PENDING, EXIT_UNJUDGED, JSON_SCHEMA

if TYPE_CHECKING:  # `plan` on an empty folder loads no engine (see plan)
    from hal0_reconciler.host.hal0 import reader as hal0
    from hal0_reconciler.model import HostFacts
    from hal0_reconciler.reconcile import PassReport


def plan(current: settings.Settings, args: argparse.Namespace) -> int:
    """The dry run. With no slot file to judge off an AMD host (where the engine logs nothing),
    hal0's facts are all it shows: the reconcile engine and the outcomes' views stay unloaded."""
    from hal0_reconciler.host.hal0 import reader as hal0
    from hal0_reconciler.slots import store

    preflight.require_slots_dir(current)
    facts = _assumed_facts(current, args.assume_amd, args.assume_rocm)
    if not facts.amd and not store.list_slot_names(current.slots_dir):
        return _plan_print(args, facts, hal0.Hal0Reader(current).read(), None)
    from hal0_reconciler import reconcile, state  # a slot to judge, or an AMD host

    ledger = state.DemotionLedger.in_state_dir(current.state_dir) if facts.amd else None
    reconciler = reconcile.Reconciler(current, ledger=ledger)
    report = reconciler.reconcile(facts, apply=False)
    read = hal0.Hal0Read(
        reconciler.hal0_facts or hal0.read_facts(current).facts, reconciler.hal0_problems
    )
    from hal0_reconciler.daemon import labels  # what runs vs the labels (rendered units)

    shown = labels.plan_entries(current, report, read.facts) if facts.amd else {}
    return _plan_print(args, facts, read, report, labels=shown)


def _plan_print(
    args: argparse.Namespace,
    facts: HostFacts,
    read: hal0.Hal0Read,
    report: PassReport | None,
    *,
    labels: dict[str, dict[str, Any]] | None = None,
) -> int:
    """Print the plan (``report`` None: no slot file); its exit code."""
    rows: list[dict[str, str]] = []
    slots: list[dict[str, Any]] = []
    notes: list[str] = []
    pending = unjudged = 0
    if report is not None:
        from hal0_reconciler import passview  # with the engine (see plan)

        rows, notes = passview.plan_rows(report), passview.write_notes(report)
        slots = passview.plan_slots(report) if args.json else []
        pending, unjudged = len(report.pending), passview.unjudged(report)
    code = EXIT_UNJUDGED if unjudged else EXIT_PENDING if pending else EXIT_OK
    if args.json:
        doc = {
            "schema": JSON_SCHEMA,
            "host": hostview.host_json(facts),
            "hal0": hostview.hal0_json(read),
        }
        doc |= {"slots": slots, "pending": pending, "labels_not_applied": labels or {}}
        console.dump_json({**doc, "unjudged": unjudged, "exit_code": code})
    else:
        console.say(_plan_table(rows, notes, pending, facts, read))
        if labels:
            from hal0_reconciler.daemon import labels as label_lines

            console.say("\n".join(label_lines.plan_lines(labels)))
        if unjudged:
            console.say(f"{unjudged} slot file(s) could not be judged: see their REASON")
    return code


def _assumed_facts(
    current: settings.Settings, assume_amd: bool | None, assume_rocm: str | None
) -> HostFacts:
    from hal0_reconciler.host import facts as host_facts
    from hal0_reconciler.model import HostFacts, LaneState

    amd = host_facts.is_amd_host(current) if assume_amd is None else assume_amd
    if assume_rocm is not None:
        lane = LaneState.USABLE if assume_rocm == "usable" else LaneState.UNUSABLE
        return HostFacts(amd=amd, lane=lane)
    if not amd:
        return HostFacts(amd=False, lane=LaneState.UNUSABLE)
    probed = host_facts.gather(current)
    return HostFacts(amd=True, lane=probed.lane, probe=probed.probe)


_COLUMNS = (
    "slot",
    "file",
    "runtime",
    "device",
    "action",
    "new",
    "reason",
    "image",
    "from",
    "capable",
)


def _plan_table(
    rows: list[dict[str, str]],
    notes: list[str],
    pending: int,
    facts: HostFacts,
    read: hal0.Hal0Read,
) -> str:
    head = {k: k.upper() for k in _COLUMNS}
    rows = [{k: console.inert(r[k]) for k in head} for r in rows]  # names, images: files' text
    widths = {k: max(len(r[k]) for r in [head, *rows]) for k in head}
    lines = [hostview.facts_line(facts), *hostview.hal0_lines(read), ""]
    lines += ["  ".join(r[k].ljust(widths[k]) for k in head).rstrip() for r in [head, *rows]]
    lines += notes
    lines += ["", f"{pending} change(s) pending" if pending else "no changes"]
    return "\n".join(lines)
