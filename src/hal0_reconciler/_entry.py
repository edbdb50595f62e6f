"""The process entry point: hold the stop and reload signals, then import everything else."""

from __future__ import annotations

import sys

from hal0_reconciler import held_signals


def main() -> int:
    held_signals.hold()
    if sys.argv[1:2] == ["run"]:  # the daemon (as its unit starts it): no garbage collection
        from hal0_reconciler.daemon import memory  # noqa: PLC0415 - until READY

        memory.hold()
    from hal0_reconciler import cli  # noqa: PLC0415 - only once the signals are held

    return cli.main()
