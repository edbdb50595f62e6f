"""The exception tree. Every message is the one human line an operator reads."""

import tomllib


class ReconcilerError(Exception):
    """Base of every error this package raises on purpose."""


class SettingsError(ReconcilerError):
    """The settings file or a command-line override is wrong (names the key)."""


class SettingsFileError(SettingsError):
    """The settings *file* itself is unusable (missing when named, unreadable, not TOML, a bad
    key or value): exit status 78 (EX_CONFIG), which the unit does not restart on."""


class SlotParseError(ReconcilerError):
    """A slot file could not be decoded or parsed as TOML."""


class OverLimit(SlotParseError):
    """A file breaks a limit on the work it may cost (size, nesting, key or number length);
    the message names the limit and its value. The file is not parsed."""


class EditRefused(ReconcilerError):
    """A rewrite could not be verified to change only the intended value."""


class LockTimeout(ReconcilerError):
    """hal0's slot write lock could not be taken within the bounded wait."""


class WriteRefused(ReconcilerError):
    """A slot path is not something the reconciler may replace (symlink, FIFO, directory...)."""


class ProbeFailed(ReconcilerError):
    """The ROCm-lane probe itself could not run (not: the lane is unusable)."""


class ProcFailed(ReconcilerError):
    """A subprocess could not be started, timed out, or failed."""


def describe(exc: BaseException) -> str:
    """One line a person understands for whatever reading, parsing or editing a file raised
    (ours, Python's, the parser's), never a traceback."""
    if isinstance(exc, ReconcilerError | OSError):  # OSError says errno, reason and path
        return str(exc)
    if isinstance(exc, RecursionError):
        return "nested too deeply to process"
    if isinstance(exc, MemoryError):
        return "too large to process (out of memory)"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start} is not valid UTF-8)"
    if isinstance(exc, UnicodeError):
        return f"not UTF-8: {exc}"
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"not valid TOML: {exc}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
