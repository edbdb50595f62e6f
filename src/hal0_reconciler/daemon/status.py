"""``status.json`` in the runtime directory: written atomically by the daemon, read by ``status``.

The daemon rewrites it after every pass and at least every ``HEARTBEAT`` seconds, so a file
whose writer is gone (pid not alive, or another process now) or that stopped changing is stale.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hal0_reconciler import console, fsio
from hal0_reconciler.boundedread import ReadRefused, read_bounded
from hal0_reconciler.daemon import statusjson
from hal0_reconciler.settings import Settings

FILE_NAME = "status.json"
SCHEMA = 3  # 2: lane "state" takes the metrics' names; 3: hal0 by release (release, rule values)
HEARTBEAT = 30.0  # seconds between two rewrites when nothing happens
MAX_BYTES = 64 << 20
"""The cap on status.json read back (a slot's entry is ~300 bytes: 200,000 slots fit)."""

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_NOT_RUNNING = 3  # LSB: program is not running
EXIT_UNKNOWN = 4  # LSB: status unknown (file unreadable)


@dataclass
class ReloadState:
    """The daemon's side of ``reload``: a generation that grows when a reload has finished
    (the new settings' first full pass done, or the new settings refused)."""

    generation: int = 0
    pending: bool = False  # new settings taken, their first full pass not done yet
    ok: bool | None = None
    at: float | None = None

    def finished(self, *, ok: bool) -> None:
        self.generation += 1
        self.pending = False
        self.ok = ok
        self.at = time.time()

    def snapshot(self) -> dict[str, Any]:
        return {"generation": self.generation, "ok": self.ok, "at": self.at}


def status_path(settings: Settings) -> Path:
    return settings.runtime_dir / FILE_NAME


def process_start_time(pid: int) -> float | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22).

    With the pid it identifies one process (pids get reused). Read from the pid's own /proc
    entry, which the unit's ``ProcSubset=pid`` keeps visible.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return float(fields[19])
    except (IndexError, ValueError):
        return None


def write_status(settings: Settings, snapshot: dict[str, Any]) -> None:
    """Replace status.json atomically (mode 0644: operators read it without root).

    ``statusjson.Raw`` and ``RawParts`` values (the cached per-slot fragments) go in as they
    are, written piece by piece (never joined into one buffer)."""
    path = status_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fsio.write_atomically(path, statusjson.dumps(snapshot), mode=0o644)


def _alive(snapshot: dict[str, Any]) -> bool:
    pid = snapshot.get("pid")
    if not isinstance(pid, int):
        return False
    started = process_start_time(pid)
    recorded = snapshot.get("pid_start")
    if started is None:
        return False
    return not isinstance(recorded, int | float) or started == recorded


def _ago(now: float, then: Any) -> str:
    if not isinstance(then, int | float) or then <= 0:
        return "never"
    return f"{max(0, round(now - then))}s ago"


def _aiter_lines(summary: dict[str, Any]) -> list[str]:
    """The aiter self-heal's part of the report (nothing when no tree is configured)."""
    if not summary:
        return []
    if summary.get("state") == "not checked yet":
        return ["  aiter:      not checked yet"]
    inert = console.inert
    counts = sorted((summary.get("verdicts") or {}).items())
    verdicts = ", ".join(f"{inert(n)} {inert(v)}" for v, n in counts) or "no modules"
    state = "heal pending" if summary.get("heal_pending") else "nothing to heal"
    lines = [f"  aiter:      {verdicts}; {state}; {inert(summary.get('heals', 0))} healed"]
    stuck = summary.get("not_converging") or []
    if stuck:
        lines.append(f"  aiter not converging: {', '.join(inert(m) for m in stuck)}")
    return lines


def _judge(settings: Settings, now: float) -> tuple[str, str, int, dict[str, Any] | None]:
    """The daemon's state word, the report's first line, the exit code, and the snapshot."""
    path = status_path(settings)
    try:
        data = read_bounded(path, max_bytes=MAX_BYTES, missing_ok=True)
        if data is None:
            return "not-running", f"not running (no {path})", EXIT_NOT_RUNNING, None
        snapshot = json.loads(data)
    except ReadRefused as exc:  # a FIFO, a link, a giant: never blocked on, never followed
        return "unknown", f"status unknown ({path}: {exc.reason})", EXIT_UNKNOWN, None
    except (ValueError, RecursionError):
        return "unknown", f"status unknown ({path}: not JSON)", EXIT_UNKNOWN, None
    if not isinstance(snapshot, dict):
        return "unknown", f"status unknown ({path}: not an object)", EXIT_UNKNOWN, None
    pid = console.inert(snapshot.get("pid"))  # for the report's words: the file's own text
    heartbeat = float(snapshot.get("heartbeat", HEARTBEAT))
    updated = snapshot.get("updated_at", 0)
    if not _alive(snapshot):
        head = f"not running (pid {pid} is gone; status from {_ago(now, updated)})"
        return "not-running", head, EXIT_NOT_RUNNING, snapshot
    if not isinstance(updated, int | float) or now - updated > 3 * heartbeat:
        head = f"unhealthy (pid {pid}; status not updated since {_ago(now, updated)})"
        return "stale", head, EXIT_UNHEALTHY, snapshot
    if not snapshot.get("ready", False):
        head = f"starting (pid {pid}), not healthy yet: first pass not finished"
        return "starting", head, EXIT_UNHEALTHY, snapshot
    health = snapshot.get("health")
    if health == "degraded":
        return "degraded", f"degraded (pid {pid})", EXIT_UNHEALTHY, snapshot
    if health == "unhealthy" or not snapshot.get("healthy", False):
        return "unhealthy", f"unhealthy (pid {pid})", EXIT_UNHEALTHY, snapshot
    return "running", f"running (pid {pid}), healthy", EXIT_OK, snapshot


def report_json(
    settings: Settings, *, now: float | None = None, settings_error: str | None = None
) -> tuple[dict[str, Any], int]:
    """``status --json``: the judged state (what monitoring alerts on) and the daemon's own
    snapshot (``null`` when there is none). ``settings_error``: why the settings file on disk
    is invalid (``null`` when it is valid): the daemon keeps running on the settings it read
    last, so the exit code stays the daemon's."""
    now = time.time() if now is None else now
    state, head, code, snapshot = _judge(settings, now)
    doc = {"state": state, "summary": head, "exit_code": code, "daemon": snapshot}
    return {**doc, "settings_file_error": settings_error}, code


def _settings_line(settings_error: str | None) -> list[str]:
    if settings_error is None:
        return []
    return [
        f"  settings file on disk is invalid: {settings_error}",
        "    (a running daemon keeps its settings; check with: hal0-reconciler check-config)",
    ]


def report(
    settings: Settings, *, now: float | None = None, settings_error: str | None = None
) -> tuple[str, int]:
    """A short human report of the daemon's status file, and the exit code for ``status``
    (``settings_error``: see ``report_json``).

    Slot names, reasons and problems are the slot files' and hal0's text: each is shown inert
    (``console.inert``), so none can move the cursor, erase a row or start a new line."""
    now = time.time() if now is None else now
    _state, head, code, snapshot = _judge(settings, now)
    lines = [f"hal0-reconciler: {head}", *_settings_line(settings_error)]
    if snapshot is None:
        return "\n".join(lines), code
    inert = console.inert
    last = snapshot.get("last_pass") or {}
    if last:
        lines.append(
            f"  last pass:  {_ago(now, last.get('at'))}, {inert(last.get('slots', 0))} slots, "
            f"{last.get('duration', 0.0):.3f}s; {inert(snapshot.get('passes', 0))} passes, "
            f"{inert(snapshot.get('relabels_total', 0))} relabelled since start"
        )
    lane = snapshot.get("lane") or {}
    if lane.get("amd") is False:
        lines.append("  host:       not an AMD host (nothing is touched)")
    elif lane:
        lines.append(f"  rocm lane:  {inert(lane.get('state'))} ({inert(lane.get('reason'))})")
    hal0 = snapshot.get("hal0") or {}
    if isinstance(hal0, dict) and hal0.get("summary"):
        lines.append(f"  hal0:       {inert(hal0['summary'])}")
    lines.append(f"  watches:    {inert(snapshot.get('watch_mode', '?'))}")
    lines.extend(_aiter_lines(snapshot.get("aiter") or {}))
    for file_name, slot in sorted((snapshot.get("slots") or {}).items()):
        name = inert(f"{slot.get('name') or '-'} ({file_name})")
        change = inert(slot.get("device") or "")
        reason = inert(slot.get("reason") or slot.get("message") or "")
        state = inert(slot.get("status", "?"))
        lines.append(f"    {name:<32} {state:<12} {change:<11} {reason}".rstrip())
    pending = snapshot.get("pending_restarts") or {}
    if pending:
        items = ", ".join(f"{inert(n)} in {round(s)}s" for n, s in sorted(pending.items()))
        lines.append(f"  restarts pending: {items}")
    restarts = snapshot.get("restarts") or {}
    for name, why in sorted((restarts.get("waiting") or {}).items()):
        lines.append(f"  restart waits: {name}: {why}")
    for name, message in sorted((restarts.get("failed") or {}).items()):
        lines.append(f"  restart failed: {name}: {message}")
    for name, e in sorted((snapshot.get("labels_not_applied") or {}).items()):
        lines.append(
            f"  label not applied: {inert(name)}: {inert(e.get('label'))}, running "
            f"{inert(e.get('running'))} ({inert(e.get('state'))}: {inert(e.get('reason'))})"
        )
    hands_off = snapshot.get("hands_off") or []
    if hands_off:
        lines.append(f"  hands off (fight): {', '.join(inert(n) for n in hands_off)}")
    lines.extend(f"  problem: {inert(p)}" for p in snapshot.get("problems") or [])
    return "\n".join(lines), code


def _snapshot(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(read_bounded(path, max_bytes=MAX_BYTES) or b"")
    except (ReadRefused, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _generation(snapshot: dict[str, Any] | None, pid: int) -> int | None:
    """The reload generation that daemon ``pid`` published (None: nothing from it yet)."""
    if snapshot is None or snapshot.get("pid") != pid:
        return None
    generation = (snapshot.get("reload") or {}).get("generation", 0)
    return generation if isinstance(generation, int) else 0


def reload(
    settings: Settings, *, pid: int | None, timeout: float, poll: float = 0.05
) -> tuple[str, int]:
    """``hal0-reconciler reload`` (the unit's ExecReload): SIGHUP the daemon, then wait until
    it says the reload finished, so ``systemctl reload`` returns only once the new settings are
    live (systemd 252 has no Type=notify-reload). Returns the message and the exit code."""
    path = status_path(settings)
    if pid is None:
        found = (_snapshot(path) or {}).get("pid")
        if not isinstance(found, int):
            return f"hal0-reconciler: not running (no pid in {path})", EXIT_NOT_RUNNING
        pid = found
    # a daemon that has published nothing yet has finished no reload: generation 0
    before = _generation(_snapshot(path), pid) or 0
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        return f"hal0-reconciler: not running (pid {pid} is gone)", EXIT_NOT_RUNNING
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = _snapshot(path)
        now = _generation(snapshot, pid)
        if now is not None and now > before:
            assert snapshot is not None  # noqa: S101 - a generation comes from a snapshot
            if (snapshot.get("reload") or {}).get("ok"):
                return f"hal0-reconciler: reloaded (pid {pid})", EXIT_OK
            refused = f"reload refused, the old settings stay (pid {pid}; the journal says why)"
            return f"hal0-reconciler: {refused}", EXIT_UNHEALTHY
        if process_start_time(pid) is None:
            return f"hal0-reconciler: pid {pid} exited during the reload", EXIT_NOT_RUNNING
        time.sleep(poll)
    return (
        f"hal0-reconciler: no confirmation of the reload from pid {pid} within {timeout:g}s",
        EXIT_UNHEALTHY,
    )
