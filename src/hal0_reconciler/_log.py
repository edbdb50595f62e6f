"""structlog configuration, decided once (from the CLI): journald, console or JSON.

- ``journal`` (auto under systemd: ``JOURNAL_STREAM`` names our stderr): one line per event,
  prefixed with the sd-daemon priority (``<4>`` warning, ``<3>`` error ...) so
  ``journalctl -p warning`` shows exactly the warnings; a traceback stays on that line (its
  newlines escaped). When the Debian ``systemd`` Python module is importable, the event is sent
  natively instead (same line as MESSAGE, plus EVENT=, SLOT=, PATH= ... fields), so
  ``journalctl -u hal0-reconciler SLOT=agent`` works; not both, or the journal would hold it twice.
- ``console`` otherwise (a terminal, a pipe, cron mail): structlog's readable renderer, in
  colour only on a terminal.
- ``json`` only when asked for (``--log-format json``), for pipelines.

Terminal output is inert (``console.inert``): a value logged may be a slot file's or hal0's
text, so the journal line (the native MESSAGE too) and the console renderer's ``key=value``
show its control characters escaped; the native journal's structured fields (SLOT=, PATH= ...)
and the JSON format keep the exact value (JSON escapes them itself).

Only structlog APIs that exist in 22.3 (Debian 12) are used.

structlog (which imports asyncio) is imported when the first event is logged, not before:
modules take their logger from ``get_logger`` (a proxy), and ``configure`` is applied then. A
command that logs nothing (``plan``, ``status``) never pays for it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import threading
import types
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

from hal0_reconciler import console
from hal0_reconciler._writelock import WRITE_LOCK
from hal0_reconciler.settings import LogFormat

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}  # logging's
# sd-daemon(3) priorities by structlog method / level name
_PRIORITY = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "warning": 4,
    "warn": 4,
    "msg": 6,
    "info": 6,
    "debug": 7,
}
_FIELD_NAME = re.compile(r"[^A-Z0-9_]")
_BARE = re.compile(r"^[A-Za-z0-9_.,:/@+%=-]+$")
SYSLOG_IDENTIFIER = "hal0-reconciler"

Processor = Callable[[Any, str, MutableMapping[str, Any]], Any]


def drop_none(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """A field with no value is left out: ``None`` is Python's word, not an operator's."""
    for key in [k for k, v in event_dict.items() if v is None]:
        del event_dict[key]
    return event_dict


def journal_stream_is_stderr(stream: TextIO | None = None) -> bool:
    """True when ``JOURNAL_STREAM`` (``dev:inode``) names this process's stderr."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def resolve_format(fmt: LogFormat) -> LogFormat:
    """``auto`` → journal under systemd, else console: human lines for a person, on a terminal
    or not (``plan 2>&1 | less``, cron mail); JSON only when asked for."""
    if fmt is not LogFormat.AUTO:
        return fmt
    if journal_stream_is_stderr():
        return LogFormat.JOURNAL
    return LogFormat.CONSOLE


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


_muted: frozenset[str] = frozenset()


def mute(*events: str) -> None:
    """Leave these events out of the log: what a command prints for a person already says them
    (``plan``'s header shows hal0's fact fallbacks). Set once by the command line."""
    global _muted  # noqa: PLW0603 - one process-wide switch, set once
    _muted = frozenset(events)


def _drop_muted(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    if _muted and event_dict.get("event") in _muted:
        import structlog  # noqa: PLC0415 - loaded already: this runs inside it

        raise structlog.DropEvent
    return event_dict


def _value(value: Any) -> str:
    """A value as an operator reads it: bare when it can be (a path stays whole), else quoted
    once, its backslashes as they are; lists as ``a, b`` (``console.plain``); every control
    character escaped, so one event stays one line."""
    text = console.plain(value)
    if text and _BARE.match(text):
        return text
    if '"' in text and "'" not in text:
        quoted = f"'{text}'"
    else:
        quoted = '"' + text.replace('"', '\\"') + '"'
    return console.inert(quoted)


def plain_values(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """The console renderer's lists and tables as ``a, b`` text (``console.plain``)."""
    for key, value in event_dict.items():
        if isinstance(value, list | tuple | dict | set | frozenset) and key != "exc_info":
            event_dict[key] = console.plain(value)
    return event_dict


def journal_line(method_name: str, event_dict: MutableMapping[str, Any]) -> str:
    """``<N>event key=value ...`` on one line (no timestamp: the journal has one)."""
    fields = dict(event_dict)
    level = str(fields.pop("level", method_name))
    event = str(fields.pop("event", ""))
    fields.pop("timestamp", None)
    priority = _PRIORITY.get(level, _PRIORITY.get(method_name, 6))
    parts = [console.inert(event)]
    parts.extend(f"{k}={_value(v)}" for k, v in fields.items())
    return f"<{priority}>" + " ".join(parts)


def inert_values(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """The console renderer's text values inert (it writes a ``str`` as it is; other values
    go through ``repr``, which escapes control characters itself). A traceback keeps its lines."""
    for key, value in event_dict.items():
        if isinstance(value, str) and key not in {"exception", "exc_info"}:
            event_dict[key] = console.inert(value)
    return event_dict


def native_fields(line: str, event_dict: MutableMapping[str, Any]) -> dict[str, str]:
    """journal.send() keyword fields for one event: MESSAGE, PRIORITY, EVENT, SLOT ..."""
    priority = line[1] if line.startswith("<") else "6"
    fields = {
        "MESSAGE": line[3:] if line.startswith("<") else line,
        "PRIORITY": priority,
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "EVENT": str(event_dict.get("event", "")),
    }
    for key, value in event_dict.items():
        if key in {"event", "level", "timestamp"}:
            continue
        name = _FIELD_NAME.sub("_", key.upper()).lstrip("_")
        if name and name not in fields and not name.startswith(("MESSAGE", "PRIORITY")):
            fields[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return fields


class JournalLogger:
    """The final sink: the native journal when given ``send``, else one whole line on stderr.

    Every format ends here (console and JSON with no ``send``): the line and its newline are one
    write under ``WRITE_LOCK``, shared with the stdlib handler, so lines never interleave.
    """

    def __init__(self, file: TextIO | None = None, send: Callable[..., Any] | None = None) -> None:
        self._file = file
        self._send = send

    def msg(self, line: str, fields: dict[str, str] | None = None) -> None:
        if self._send is not None and fields is not None:
            try:
                self._send(**fields)
            except Exception:  # noqa: S110 - fall through to stderr
                pass
            else:
                return
        out = self._file or sys.stderr
        with WRITE_LOCK:
            out.write(line + "\n")
            out.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def _journal_renderer(*, native: bool) -> Processor:
    def render(_logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
        line = journal_line(method_name, event_dict)
        if not native:
            return ((line,), {})
        return ((line,), {"fields": native_fields(line, event_dict)})

    return render


def _journal_send() -> Callable[..., Any] | None:
    try:
        journal = importlib.import_module("systemd.journal")  # Debian's python3-systemd
    except ImportError:
        return None
    send: Callable[..., Any] | None = getattr(journal, "send", None)
    return send


class _LazyLogger:
    """A logger that imports structlog on its first use (``structlog.get_logger`` once there)."""

    __slots__ = ("_args", "_real")

    def __init__(self, *args: Any) -> None:
        self._args = args
        self._real: Any = None

    def __getattr__(self, name: str) -> Any:
        real = self._real
        if real is None:
            real = self._real = _structlog().get_logger(*self._args)
        return getattr(real, name)


def get_logger(*args: Any) -> Any:
    """``structlog.get_logger(*args)``, without importing structlog until an event is logged."""
    return _LazyLogger(*args)


_IMPORTING = threading.Lock()
_pending: tuple[LogFormat, str] | None = None  # configured, not yet applied to structlog


def _structlog() -> Any:
    """structlog, with the configuration given to ``configure`` applied on first import."""
    global _pending  # noqa: PLW0603 - one process-wide logging setup
    if "structlog" not in sys.modules:
        for_a_person = _pending is not None and _pending[0] is LogFormat.CONSOLE and _tty()
        _import_structlog(console=for_a_person)
    import structlog  # noqa: PLC0415 - on first use: asyncio and friends cost ~50 ms

    if _pending is not None:
        fmt, level = _pending
        _pending = None
        _apply(fmt, level)
    return structlog


def _import_structlog(*, console: bool) -> None:
    """Import structlog; without ``rich`` unless the log is for a person at a terminal, and
    without asyncio until something asks for it.

    structlog loads rich (when installed) for its console renderer's tracebacks; the journal
    and JSON formats never use it, and it is the larger half of structlog's import. A reload
    that switches to ``console`` keeps structlog's plain traceback formatter. structlog's
    stdlib and level modules ``import asyncio`` (with ssl, ~20 ms) only for their ``async``
    log methods, which this package never calls: they get a stand-in (``_Deferred``) that
    imports asyncio at its first attribute lookup."""
    with _IMPORTING:  # two threads logging their first events: one does this
        if "structlog" in sys.modules:
            return
        stand_ins: dict[str, types.ModuleType | None] = {}
        if not console and "rich" not in sys.modules:
            stand_ins["rich"] = None  # the import system: "not there"
        if "asyncio" not in sys.modules:
            stand_ins["asyncio"] = _Deferred("asyncio")
        sys.modules.update(stand_ins)  # type: ignore[arg-type]  # None: "not there"
        try:
            importlib.import_module("structlog")
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]  # an import from now on gets the real module


class _Deferred(types.ModuleType):
    """A module name bound to this imports the real module at its first attribute lookup
    (whatever is looked up, at import time or later, comes from the real module)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__spec__ = None  # the import statement binds it as it is, loading nothing

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:  # looked up while structlog loads
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def configure(fmt: LogFormat, level: str) -> LogFormat:
    """Configure structlog (and stdlib logging for libraries); returns the format used.

    Safe to call again (the daemon does on SIGHUP when ``log_format``/``log_level`` changed):
    structlog is reconfigured and only the stdlib handler installed here is replaced; handlers
    others added to the root logger stay. Applied now when structlog is already loaded, else
    when the first event is logged.
    """
    global _pending  # noqa: PLW0603 - one process-wide logging setup
    resolved = resolve_format(fmt)
    if "structlog" in sys.modules:
        _pending = None
        _apply(resolved, level)
    else:
        _pending = (resolved, level)
    return resolved


def _apply(resolved: LogFormat, level: str) -> None:
    import logging  # noqa: PLC0415 - see _structlog

    import structlog  # noqa: PLC0415 - see _structlog

    from hal0_reconciler._logstd import (  # noqa: PLC0415
        _OurHandler,
        _StdlibJournalFormatter,
        _StdlibJsonFormatter,
    )

    threshold = _LEVELS.get(level.lower(), logging.INFO)
    shared: list[Processor] = [
        _drop_muted,
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        drop_none,
    ]
    processors: list[Processor]
    handler = _OurHandler(sys.stderr)
    if resolved is LogFormat.JOURNAL:
        send = _journal_send()
        processors = [
            *shared,
            structlog.processors.format_exc_info,
            _journal_renderer(native=send is not None),
        ]
        sink = JournalLogger(send=send)
        handler.setFormatter(_StdlibJournalFormatter("%(name)s: %(message)s"))
    elif resolved is LogFormat.CONSOLE:
        processors = [
            *shared,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            plain_values,
            inert_values,
            structlog.dev.ConsoleRenderer(colors=console.colour_enabled(sys.stderr)),
        ]
        sink = JournalLogger()
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    else:
        processors = [
            *shared,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
        sink = JournalLogger()
        handler.setFormatter(_StdlibJsonFormatter())
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=lambda *_args: sink,
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(max(threshold, logging.WARNING))


def __getattr__(name: str) -> Any:
    """The stdlib classes, from ``_logstd`` (imported on first use)."""
    if name in {"_OurHandler", "_StdlibJournalFormatter", "_StdlibJsonFormatter"}:
        from hal0_reconciler import _logstd  # noqa: PLC0415

        return getattr(_logstd, name)
    raise AttributeError(name)
