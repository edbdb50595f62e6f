"""The command line: `hal0-reconciler once | plan | probe | run | status | reload | aiter ...`.

Exit codes: 0 success / nothing pending; 1 error (a file could not be written, a usage error
such as a bad ``--set`` value, the probe found the lane unusable); 2 changes pending (`plan`, like
terraform's -detailed-exitcode); 3 a slot file could not be judged (`once`, `plan`); 78 the
settings file is invalid (EX_CONFIG: the unit does not restart on it). `status` never needs the
settings file and follows the LSB (3 not running, 4 unknown). Each verb's ``--help`` ends with
its own table (``exits.EXITS``).

One module per verb family, each loaded only when its verb runs: ``parser`` (the grammar and
help), ``exits`` (the codes), ``once``, ``plan``, ``probe``, ``service`` (run, status, reload),
with ``hostview`` (the host's and hal0's facts as lines and data) and ``preflight`` shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from hal0_reconciler import _log, console, held_signals, settings
from hal0_reconciler.cli.exits import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_UNJUDGED,
    JSON_SCHEMA,
)
from hal0_reconciler.cli.parser import PATH_FLAGS, build_parser, verb_of
from hal0_reconciler.errors import ReconcilerError, SettingsError, SettingsFileError
from hal0_reconciler.host import caller

__all__ = [
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_PENDING",
    "EXIT_UNJUDGED",
    "JSON_SCHEMA",
    "build_parser",
    "main",
]

_cli_log = _log.get_logger("hal0_reconciler.cli")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=verb_of(argv))
    args = parser.parse_args(argv)
    if args.no_color:
        console.refuse_colour()
    broken: str | None = None  # the settings file's error, for the verbs that answer anyway
    try:
        overrides = _overrides(args)
        delegated = _delegated(args, overrides)
        if isinstance(delegated, str):
            console.error(delegated)
            return EXIT_ERROR
        try:
            loaded = settings.read(args.config, overrides)
        except SettingsFileError as exc:
            if args.verb not in ("status", "reload"):
                console.error(str(exc))
                return EXIT_CONFIG
            # `status` answers from the status file and `reload` only needs the runtime folder
            # (the daemon judges the new file itself and keeps its old settings): the defaults
            # and the command line
            broken = str(exc)
            loaded = settings.Loaded(settings.without_file(overrides), None)
    except ReconcilerError as exc:
        console.error(str(exc))
        return EXIT_ERROR
    current = loaded.settings
    if delegated:  # root acting for another user: systemctl from root's own folder only
        systemctl = caller.fixed_systemctl()
        if systemctl is None:
            console.error(
                "run for another user through sudo: refused: no systemctl root owns on a way "
                f"only root can change ({', '.join(map(str, caller.SYSTEMCTL_PATHS))})"
            )
            return EXIT_ERROR
        current = dataclasses.replace(current, systemctl=systemctl)
    resolved = _log.configure(current.log_format, current.log_level)
    muted: list[str] = []
    if args.verb == "plan" and resolved is settings.LogFormat.CONSOLE:
        # its header (and --json's "problems") says them: one place, not also on stderr; the
        # journal and --log-format json still get the structured event
        muted.append("hal0.facts_note")
    if muted:
        _log.mute(*muted)
    # check-config prints them itself; the daemon says them at the reload `reload` asks for
    said = args.verb == "check-config" and resolved is settings.LogFormat.CONSOLE
    said = said or args.verb == "reload"
    for line in () if said else loaded.deprecated:
        _cli_log.warning("settings.deprecated", message=line, effect="ignored")
    if args.verb == "check-config":
        return _check_config(loaded)
    try:
        if broken is not None and args.verb == "status":
            from hal0_reconciler.cli import service

            return service.status(args, current, broken=broken)
        code = _dispatch(args, current, overrides)
    except ReconcilerError as exc:
        console.error(str(exc))
        return EXIT_ERROR
    except BrokenPipeError:  # `hal0-reconciler plan | head`: the reader left, not an error
        devnull = os.open(os.devnull, os.O_WRONLY)  # no flush into the closed pipe at exit
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    if broken is not None and code == EXIT_ERROR:  # `reload` refused: the file is why
        console.error(broken)
        return EXIT_CONFIG
    return code


def _delegated(args: argparse.Namespace, overrides: dict[str, Any]) -> bool | str:
    """True when root runs this for another user (sudo); a string when that run is refused:
    it chooses a program, a peer, a trusted user, a process or a path for root."""
    uid = caller.delegating_uid()
    if uid is None:
        return False
    refused = caller.refusals(vars(args), overrides, os.environ)
    if not refused:
        return True
    return (
        f"run for uid {uid} through sudo (or another way root runs a command for a user): "
        f"refused: {', '.join(refused)} choose(s) for root; only root itself may set them "
        "(see hal0-reconciler(8), SUDO)"
    )


def _check_config(loaded: settings.Loaded) -> int:
    """``check-config``: the file was read exactly as ``run`` reads it (errors exit 78 in
    ``main``); say what was checked, and every deprecated setting it still sets (valid: exit 0;
    the log has them too unless it is this terminal)."""
    if loaded.path is None:
        print(f"no settings file at {settings.default_config_path()}: the defaults apply")
    else:
        count = len(loaded.deprecated)
        also = f", with {count} deprecated setting{'s' * (count != 1)}" if count else ""
        print(f"{loaded.path}: valid{also}")
    for line in loaded.deprecated:
        print(f"warning: {line}")
    return EXIT_OK


def _dispatch(
    args: argparse.Namespace, current: settings.Settings, overrides: dict[str, Any]
) -> int:
    verb: str = args.verb
    if verb not in ("run", "once"):  # those release them once their handlers are in place
        held_signals.release()
    if verb == "once":
        from hal0_reconciler.cli import once

        return once.once(current, restart=not args.no_restart, as_json=args.json)
    if verb == "plan":
        from hal0_reconciler.cli import plan

        return plan.plan(current, args)
    if verb == "probe":
        from hal0_reconciler.cli import probe

        return probe.probe(current, as_json=args.json)
    if verb in ("run", "status", "reload"):
        from hal0_reconciler.cli import service

        if verb == "run":
            return service.run(args, current, overrides)
        if verb == "status":
            return service.status(args, current, broken=None)
        return service.reload(args, current)
    from hal0_reconciler.aiter import cli as aiter_cli

    return aiter_cli.main(args, current)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for item in args.assignments:
        key, sep, value = item.partition("=")
        parts = [part.strip() for part in key.split(".")]
        if not sep or not all(parts):
            raise SettingsError(f"--set {item!r}: expected KEY=VALUE (nested: TABLE.KEY=VALUE)")
        table = overrides
        for part in parts[:-1]:  # aiter.heal=false -> {"aiter": {"heal": "false"}}
            inner = table.setdefault(part, {})
            if not isinstance(inner, dict):
                raise SettingsError(f"--set {item!r}: {part!r} is set as a value already")
            table = inner
        table[parts[-1]] = value
    for field in (*PATH_FLAGS, "service_user", "log_format", "log_level", "assume_hal0"):
        value = getattr(args, field, None)
        if value is not None:
            overrides[field] = str(value)
    if getattr(args, "manifest_file", None) is not None:
        overrides["manifest_file"] = str(args.manifest_file)
    return overrides
