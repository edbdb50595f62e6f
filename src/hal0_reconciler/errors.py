"""The exception tree. Every message is the one human line an operator reads."""


class ReconcilerError(Exception):
    """Base of every error this package raises on purpose."""


class SettingsError(ReconcilerError):
    """The settings file or a command-line override is wrong (names the key)."""


class SlotParseError(ReconcilerError):
    """A slot file could not be decoded or parsed as TOML."""


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
