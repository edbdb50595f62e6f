"""One reconcile pass over slot files: read -> decide -> write under the lock -> one event.

Level-triggered and idempotent: every call re-reads the files it is given, so a second pass
over its own output changes nothing and logs nothing. Problems (unreadable files, unresolved
runtimes, non-regular files) are reported once per file content, not on every pass.

One file can never stop the others: a file over a limit (``slots.limits``) is reported, not
parsed, and whatever reading, parsing, deciding or editing one file raises becomes that file's
reported problem, in one line, and the pass goes on. A pass stops between two files (never in
the middle of one) once ``cancelled()`` is true. Temp files of this package's own writes that a
crash left in the slots folder are removed under hal0's lock (so never one in flight).

The rooms: ``reconciler`` (the pass: which files, in which order, which from memory),
``listing`` (the folder's slot files), ``judge`` (what a verdict depends on; pure), ``look``
(one file read and judged), ``writegroup`` (hal0's lock, the fsync batch, the folder sync),
``temps`` (leftover temp files), ``demotions`` (the ledger's rules), ``reports`` (what was
already said about which file), ``catalog``, ``hal0view`` and ``vulkan`` (what is read once
per pass), ``outcome`` (the records).
"""

from hal0_reconciler.reconcile.listing import slot_key
from hal0_reconciler.reconcile.outcome import (
    FIGHT_REASON,
    Hold,
    Outcome,
    OutcomeStatus,
    PassReport,
)
from hal0_reconciler.reconcile.reconciler import Reconciler
from hal0_reconciler.reconcile.writegroup import WRITE_GROUP

__all__ = [
    "FIGHT_REASON",
    "WRITE_GROUP",
    "Hold",
    "Outcome",
    "OutcomeStatus",
    "PassReport",
    "Reconciler",
    "slot_key",
]
