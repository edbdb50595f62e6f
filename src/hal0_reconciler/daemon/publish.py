"""What the daemon shows: the status.json snapshot and the one-line ``STATUS=`` for systemd.

Composed on the main loop from the worker's progress, the watcher's health, the restarter's
pending restarts and the aiter self-heal's summary; written by ``status.write_status``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hal0_reconciler import __version__
from hal0_reconciler.daemon import passes, progress, selfheal, status, statusjson, watch
from hal0_reconciler.model import LaneState


@dataclass(frozen=True)
class Sources:
    """Everything a snapshot is made from (each read under its own lock)."""

    passes: passes.Passes
    health: watch.WatchHealth | None
    pending_restarts: dict[str, float]
    selfheal: selfheal.SelfHeal
    started_at: float
    slots_json: statusjson.SlotsJson | None = None  # cached per-slot fragments (the daemon's)


def compose(
    src: Sources, problems: list[str], *, ready: bool, degraded: tuple[str, ...] = ()
) -> tuple[dict[str, Any], str]:
    """The status.json snapshot and the STATUS= line (health ``problems`` first).

    ``problems`` make the daemon *unhealthy* (its own machinery is broken: WATCHDOG=1 stops);
    ``degraded`` and the worker's problems make it *degraded* (alive, but part of its job cannot
    be done: no slots folder, a probe that cannot run, a write or a watch that fails).
    Either way ``healthy`` is false and ``status`` exits non-zero."""
    with src.passes.lock:
        p = src.passes.progress
        facts = p.facts
        hands_off = sorted(
            str(p.slots.get(k, {}).get("name", k)) for k in src.passes.fights.hands_off
        )
        snapshot: dict[str, Any] = {
            "schema": status.SCHEMA,
            "pid": os.getpid(),
            "pid_start": status.process_start_time(os.getpid()),
            "version": __version__,
            "started_at": src.started_at,
            "updated_at": time.time(),
            "heartbeat": status.HEARTBEAT,
            "ready": ready,
            # a worker problem that also makes it unhealthy (passes.HEALTH_PROBLEMS) once
            "problems": [
                *problems,
                *degraded,
                *(v for v in p.problems.values() if v not in problems),
            ],
            "passes": p.passes,
            "relabels_total": p.relabels_total,
            "last_pass": {
                "at": p.last_pass_at,
                "duration": round(p.last_duration, 6),
                "slots": len(p.slots),
            }
            if p.passes
            else None,
            # keyed by file name: unique in the folder, unlike display names
            "slots": {Path(k).name: e for k, e in p.slots.items()}
            if src.slots_json is None
            else src.slots_json.render(
                p.slots, changed=None if p.slots_renewed else p.slots_changed
            ),
            "hands_off": hands_off,
            "hal0": p.hal0,
        }
        p.slots_changed = set()  # the fragments are up to date
        p.slots_renewed = False
        last_pass_at = p.last_pass_at
        relabels = p.relabels_total
        count = len(p.slots)
    lane_text = "unknown"
    if facts is not None:
        state = progress.lane_metric_state(facts)  # one name per state: the metrics' own
        lane_text = "not an AMD host" if not facts.amd else f"rocm lane {state}"
        snapshot["lane"] = {
            "amd": facts.amd,
            "state": state,
            "within_grace": facts.lane is LaneState.UNSETTLED,  # unusable, not yet demoting
            "reason": facts.lane_reason if facts.amd else "not an AMD host",
        }
        credentials = facts.probe.credentials if facts.probe is not None else None
        if credentials is not None:
            snapshot["lane"]["probed_as"] = {
                "user": credentials.user,
                "uid": credentials.uid,
                "why": credentials.why or None,
            }
    snapshot["pending_restarts"] = src.pending_restarts
    health = src.health
    if health is not None:
        snapshot["watch_mode"] = health.mode
        snapshot["watched"] = list(health.watched)
        snapshot["problems"] += [f"cannot watch {p}: {r}" for p, r in health.failures.items()]
    state = "unhealthy" if problems else "degraded" if snapshot["problems"] else "healthy"
    snapshot["health"] = state
    snapshot["healthy"] = state == "healthy" and ready  # never while starting
    heal = src.selfheal.status()
    if heal is not None:
        snapshot["aiter"] = heal
    ago = f"{round(time.time() - last_pass_at)}s ago" if last_pass_at else "pending"
    line = f"{count} slots, {relabels} relabelled, {lane_text}, last pass {ago}"
    if health is not None and health.mode == "polling":
        line += ", POLLING (watch failed)"
    if hands_off:
        line += f", hands off: {len(hands_off)}"
    if heal is not None and heal.get("state") == "not checked yet":
        line += ", aiter: not checked yet"
    elif heal is not None and heal.get("not_converging"):
        line += f", aiter not converging: {len(heal['not_converging'])}"
    elif heal is not None and heal.get("heal_pending"):
        line += ", aiter heal pending"
    if problems:
        line += f", UNHEALTHY: {problems[0]}"
    elif state == "degraded":
        line += f", DEGRADED: {snapshot['problems'][0]}"
    return snapshot, line
