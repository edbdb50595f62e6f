"""The process entry point: hold the stop and reload signals, then import everything else."""

from __future__ import annotations

from hal0_reconciler import held_signals


def main() -> int:
    held_signals.hold()
    from hal0_reconciler import cli  # noqa: PLC0415 - only once the signals are held

    return cli.main()
