"""``once``: one reconcile pass over every slot, the changed active slots restarted (or said
to need it), then exit."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType

from hal0_reconciler import _log, console, held_signals, settings
from hal0_reconciler.cli import hostview, preflight
from hal0_reconciler.cli.exits import EXIT_ERROR, EXIT_OK, EXIT_UNJUDGED, JSON_SCHEMA

_cli_log = _log.get_logger("hal0_reconciler.cli")


@contextlib.contextmanager
def _stop_flag() -> Iterator[Callable[[], bool]]:
    """SIGTERM / SIGINT end a one-shot pass between two files (never mid-write)."""
    stopped: list[int] = []

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)

    previous = {
        signum: signal.signal(signum, on_stop) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    held_signals.release()
    try:
        yield lambda: bool(stopped)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def once(current: settings.Settings, *, restart: bool, as_json: bool = False) -> int:
    with _stop_flag() as stopped:
        return _once_until(current, restart=restart, as_json=as_json, stopped=stopped)


def _once_until(
    current: settings.Settings, *, restart: bool, as_json: bool, stopped: Callable[[], bool]
) -> int:
    from hal0_reconciler import passview, reconcile, state  # the engine: see cli.plan
    from hal0_reconciler.host import facts as host_facts
    from hal0_reconciler.host.restarts import units
    from hal0_reconciler.model import LaneState

    preflight.require_slots_dir(current)
    facts = host_facts.gather(current)
    probe_failed = facts.amd and facts.lane is LaneState.UNKNOWN
    if probe_failed:
        _cli_log.error(
            "host.probe_failed", reason=facts.lane_reason, effect="no slot is demoted to cpu"
        )
    ledger = state.DemotionLedger.in_state_dir(current.state_dir) if facts.amd else None
    report = reconcile.Reconciler(current, ledger=ledger, cancelled=stopped).reconcile(facts)
    if stopped():
        _cli_log.warning("once.stopped", relabeled=len(report.relabeled), reason="signal")
        return EXIT_ERROR
    # an active slot keeps its old devices until restarted; one systemctl call asks for all
    changed = [o for o in report.relabeled if o.name is not None and o.token is not None]
    states = units.active_states(current, [o.token for o in changed if o.token is not None])
    for outcome in changed:
        if outcome.name is None or outcome.token is None:
            continue
        request = units.RestartRequest(name=outcome.name, token=outcome.token)
        if restart:
            units.apply_change(current, request, active=states[outcome.token])
        elif states[outcome.token]:
            _cli_log.warning(
                "unit.needs_reload",
                slot=outcome.name,
                unit=units.unit_name(outcome.token),
                action="restart the slot in hal0 to apply its new device",
            )
    if report.failed or probe_failed:
        code = EXIT_ERROR
    elif passview.unjudged(report):
        code = EXIT_UNJUDGED
    else:
        code = EXIT_OK
    if as_json:
        doc = {"schema": JSON_SCHEMA, "host": hostview.host_json(facts)}
        doc |= {"slots": passview.once_slots(report), **passview.once_counts(report)}
        console.dump_json({**doc, "exit_code": code})
    elif sys.stdout.isatty():  # a person is reading; a pipe or the journal gets the logs only
        console.say(
            "\n".join([hostview.facts_line(facts), *passview.once_lines(report)]), painted=True
        )
    return code
