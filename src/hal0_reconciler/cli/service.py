"""The verbs of the running service: ``run`` (the daemon itself), ``status`` (from its status
file) and ``reload`` (SIGHUP, then wait until the new settings are live)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hal0_reconciler import console, settings
from hal0_reconciler.cli.exits import JSON_SCHEMA


def run(args: argparse.Namespace, current: settings.Settings, overrides: dict[str, Any]) -> int:
    """``run``: the daemon, its host probe started before the daemon's modules load."""
    from hal0_reconciler.host import facts as host_facts

    early = host_facts.EarlyGather(current)  # the probe runs while the daemon loads
    from hal0_reconciler.daemon import runner

    return runner.run(current, config_path=args.config, overrides=overrides, gather=early)


def status(args: argparse.Namespace, current: settings.Settings, *, broken: str | None) -> int:
    """``status``: from the daemon's status file; ``broken``: the settings file's error."""
    from hal0_reconciler.daemon import status

    if args.json:
        doc, code = status.report_json(current, settings_error=broken)
        console.dump_json({"schema": JSON_SCHEMA, **doc})
        return code
    text, code = status.report(current, settings_error=broken)
    console.say(text)
    return code


def reload(args: argparse.Namespace, current: settings.Settings) -> int:
    """``reload``: ask the daemon to re-read its settings and wait for its answer."""
    from hal0_reconciler.daemon import status

    text, code = status.reload(current, pid=args.pid, timeout=args.timeout)
    if code != status.EXIT_OK:
        console.say(text, sys.stderr)
    elif sys.stdout.isatty():  # under systemd (ExecReload) success says nothing
        console.say(text)
    return code
