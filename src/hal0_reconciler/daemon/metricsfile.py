"""The metrics textfile as a file on the host: where it may be written, what to say when it
cannot, which file is the daemon's own (its first line, ``metrics.HEADER``), and the record of
the path written (``metrics-path`` in the state folder), so that turning the setting off, a new
path, or removing the package (the postrm) removes exactly the file the daemon wrote.

The folder is never made with its parents: a missing folder is said as such ("install
prometheus-node-exporter or create it"). Under the unit (``ProtectSystem=strict``) a folder made
after the start is read-only to the service: its ``ReadWritePaths=`` entry was skipped when the
path did not exist (the ``-`` prefix), so the daemon asks systemd for a fresh sandbox (exit 75)
the first time it finds the folder there after having found it missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path

from hal0_reconciler import _log, boundedread, fsio
from hal0_reconciler.daemon import metrics

log = _log.get_logger("hal0_reconciler.daemon")

RECORD = "metrics-path"  # in the state folder: the path of the last textfile written
_FOLDER_MODE = 0o755  # node_exporter reads it; the unit's UMask=0077 would give 0700
_READ_LIMIT = 4096


def is_own(path: Path) -> bool:
    """Whether ``path`` is a regular file (not followed if a link) that starts with the
    daemon's header line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, len(metrics.HEADER) + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    return head == (metrics.HEADER + "\n").encode()


def remove_own(path: Path) -> bool:
    """Remove ``path`` when it is the daemon's own textfile (never a link, never another
    file of that name); True when removed."""
    if not is_own(path):
        return False
    try:
        path.unlink()
    except OSError:
        return False
    return True


class MetricsFile:
    """Writes the textfile and remembers what it wrote (worker and main loop: one lock)."""

    def __init__(self, state_dir: Path, *, under_unit: bool | None = None) -> None:
        self._state_dir = state_dir
        self._under_unit = (
            bool(os.environ.get("INVOCATION_ID")) if under_unit is None else under_unit
        )
        self._lock = threading.Lock()
        self._found_missing: set[Path] = set()  # folders found missing since the start
        self.restart_for: str | None = None  # why a fresh sandbox is needed (exit 75)
        self.written: Path | None = None  # the path last written by this process
        self._configured: tuple[Path | None] | None = None  # as last settled (None: not yet)
        self._recorded: tuple[Path | None] | None = None  # the record's content, once read

    @property
    def record(self) -> Path:
        return self._state_dir / RECORD

    def recorded(self) -> Path | None:
        """The path in the record (read once; this process keeps it up to date)."""
        if self._recorded is None:
            try:
                text = boundedread.read_bounded_text(
                    self.record, max_bytes=_READ_LIMIT, missing_ok=True
                )
            except (OSError, boundedread.ReadRefused):
                text = None  # not a regular file of root's size: no path recorded
            text = text or ""
            line = text.partition("\n")[0].strip()
            self._recorded = (Path(line) if line.startswith("/") else None,)
        return self._recorded[0]

    def settle(self, current: Path | None, state_dir: Path | None = None) -> None:
        """At the start and at a reload: a textfile the daemon wrote at a path the settings no
        longer name (``metrics_textfile`` turned off or moved) is removed, if it is its own."""
        with self._lock:
            if state_dir is not None and state_dir != self._state_dir:
                self._state_dir = state_dir
                self._recorded = None
            self._configured = (None if current is None else current.absolute(),)
            old = self.recorded()
            if old is None or (current is not None and old == current.absolute()):
                return
            removed = remove_own(old)
            if removed:
                log.info("daemon.metrics_removed", path=str(old), reason="no longer configured")
            if removed or not old.exists():
                self._forget()

    def write(self, path: Path, text: str) -> str | None:
        """Write ``text`` to ``path`` atomically (0644); the problem when it cannot be. A
        write for a path the settings no longer name (a pass that began before the reload
        that moved or turned off the metrics) is dropped: the removed file stays removed."""
        path = path.absolute()
        with self._lock:
            if self._configured is not None and self._configured[0] != path:
                return None
            return self._write(path, text)

    def _write(self, path: Path, text: str) -> str | None:
        folder = path.parent
        if not folder.is_dir() and not self._made(folder):
            self._found_missing.add(folder)
            self.written = None
            if folder.exists() or folder.is_symlink():
                return f"cannot write metrics to {path}: {folder} is not a folder"
            return (
                f"cannot write metrics to {path}: the folder {folder} does not exist: "
                "install prometheus-node-exporter or create it"
            )
        try:
            fsio.write_atomically(path, text.encode("utf-8"), mode=0o644)
        except OSError as exc:
            self.written = None
            return self._failed(path, exc)
        self._found_missing.discard(folder)
        self.written = path
        if self.recorded() != path:
            try:
                fsio.write_atomically(self.record, f"{path}\n".encode(), mode=0o644)
                self._recorded = (path,)
            except OSError as exc:
                log.warning("daemon.metrics_record_failed", path=str(self.record), error=str(exc))
        return None

    def due(self, path: Path | None) -> bool:
        """Whether the main loop should write now: the file at ``path`` is not (yet) the one
        this process wrote (the start, a reload that moved it, a folder that was missing)."""
        return path is not None and self.written != path.absolute()

    def _made(self, folder: Path) -> bool:
        """The folder itself made (0755) when its parent is there; never the parents."""
        if not folder.parent.is_dir():
            return False
        try:
            folder.mkdir()
            folder.chmod(_FOLDER_MODE)
        except FileExistsError:
            return folder.is_dir()
        except OSError:
            return False
        return True

    def _failed(self, path: Path, exc: OSError) -> str:
        folder = path.parent
        if exc.errno != errno.EROFS or not self._under_unit:
            return f"cannot write metrics to {path}: {exc.strerror or exc}"
        if folder in self._found_missing:  # made since: not in this start's sandbox
            self.restart_for = (
                f"the metrics folder {folder} was created after the start; restarting so the "
                "service's sandbox includes it"
            )
            return f"cannot write metrics to {path}: {folder} is read-only until a restart"
        return (
            f"cannot write metrics to {path}: {folder} is read-only in the service's sandbox: "
            f"add ReadWritePaths={folder} (systemctl edit hal0-reconciler)"
        )

    def _forget(self) -> None:
        with contextlib.suppress(OSError):
            self.record.unlink()
        self._recorded = (None,)
