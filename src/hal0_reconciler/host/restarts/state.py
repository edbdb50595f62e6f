"""What a careful restart reads and keeps outside hal0's API: update jobs, restarts in flight.

hal0 mirrors its update jobs to ``/var/lib/hal0/update-jobs/<id>.json`` (hal0's files: read
through ``boundedread``); a ``queued``/``running`` one means "wait". A restart the daemon's stop
dropped is written to the state folder (``restarts-in-flight.json``) and confirmed at the next
start.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from hal0_reconciler import _log, boundedread, fsio
from hal0_reconciler.host.restarts import rules as restart_rules
from hal0_reconciler.settings import Settings

log = _log.get_logger("hal0_reconciler.host.restarts.units")

_JOB_MAX_BYTES = 1 << 20
IN_FLIGHT_FILE = "restarts-in-flight.json"
_IN_FLIGHT_LOCK = threading.Lock()  # the file's read-modify-write, one writer at a time


def update_job(settings: Settings) -> str | None:
    """The id of a queued/running hal0 update job (not older than update_job_max_age)."""
    folder = settings.update_jobs_dir
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except OSError:
        return None
    wall = time.time()
    for name in names[:1000]:
        path = folder / name
        try:
            age = wall - path.lstat().st_mtime
            text = boundedread.read_bounded_text(path, max_bytes=_JOB_MAX_BYTES)
            job = json.loads(text or "{}")
        except (OSError, ValueError, boundedread.ReadRefused):
            continue
        if isinstance(job, dict) and restart_rules.update_in_progress(
            job, age=age, max_age=settings.update_job_max_age
        ):
            return name.removesuffix(".json")
    return None


def in_flight_path(settings: Settings) -> Path:
    return settings.state_dir / IN_FLIGHT_FILE


def read_in_flight(path: Path) -> dict[str, str]:
    """Slot token -> display name of each restart a stop left unconfirmed."""
    try:
        text = boundedread.read_bounded_text(path, max_bytes=_JOB_MAX_BYTES, missing_ok=True)
        doc = json.loads(text or "{}")
    except (ValueError, boundedread.ReadRefused) as exc:
        log.warning("unit.in_flight_unreadable", path=str(path), error=str(exc))
        return {}
    found = {}
    for token, entry in doc.items() if isinstance(doc, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            found[str(token)] = entry["name"]
    return found


def remove_in_flight(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("unit.in_flight_unwritable", path=str(path), error=str(exc))


def write_in_flight(path: Path, token: str, name: str, request_id: str) -> None:
    """One more restart dropped by a stop (the ones on record kept; each restart worker's stop
    writes its own, so the read-modify-write is serialized)."""
    with _IN_FLIGHT_LOCK:
        known = read_in_flight(path)
        doc: dict[str, dict[str, object]] = {t: {"name": n} for t, n in known.items()}
        doc[token] = {"name": name, "request_id": request_id, "dropped_at": round(time.time(), 3)}
        try:
            fsio.write_json(path, doc, mode=0o600)
        except OSError as exc:
            log.warning("unit.in_flight_unwritable", path=str(path), error=str(exc))
