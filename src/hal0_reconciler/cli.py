"""The command line: `hal0-reconciler once | plan | probe | run | status | reload | aiter ...`.

Exit codes: 0 success / nothing pending; 1 error (a file could not be written, a usage error
such as a bad ``--set`` value, the probe found the lane unusable); 2 changes pending (`plan`, like
terraform's -detailed-exitcode); 3 a slot file could not be judged (`once`, `plan`); 78 the
settings file is invalid (EX_CONFIG: the unit does not restart on it). `status` never needs the
settings file and follows the LSB (3 not running, 4 unknown). Each verb's ``--help`` ends with
its own table (``_EXITS``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from hal0_reconciler import __version__, _log, console, held_signals, settings
from hal0_reconciler.errors import ReconcilerError, SettingsError, SettingsFileError

if TYPE_CHECKING:  # each verb loads what it runs: `status` needs no host facts, `plan` on an
    # empty folder no engine (see _plan)
    from hal0_reconciler.host import hal0
    from hal0_reconciler.model import HostFacts
    from hal0_reconciler.reconcile import PassReport

_cli_log = _log.get_logger("hal0_reconciler.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_PENDING = 2
EXIT_UNJUDGED = 3  # a slot file could not be judged (once, plan): distinct from "pending"
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: the settings file is invalid (RestartPreventExitStatus=)
_CONFIG_EXIT = (EXIT_CONFIG, "the settings file is invalid (the error names the file and the key)")
JSON_SCHEMA = 2  # of plan/once/probe/status --json; a change that breaks a reader bumps it
# (2: one name per lane state, the metrics' own: "not-amd" where 1 said null or "unusable")

# Each verb's exit codes, printed at the end of its --help.
_EXITS: dict[str, tuple[tuple[int, str], ...]] = {
    "once": (
        (0, "every slot judged, every change written"),
        (
            1,
            (
                "error: settings or usage, slots folder missing, a write failed, the probe "
                "could not run as the service user"
            ),
        ),
        (
            3,
            (
                "a slot file could not be judged (not TOML, not UTF-8, not a regular file, "
                "runtime unresolved)"
            ),
        ),
        _CONFIG_EXIT,
    ),
    "plan": (
        (0, "nothing pending"),
        (1, "error: settings or usage, slots folder missing"),
        (2, "changes pending"),
        (3, "a slot file could not be judged (takes precedence over 2)"),
        _CONFIG_EXIT,
    ),
    "probe": (
        (0, "the ROCm lane is usable by the service user"),
        (1, "not usable, not an AMD host, or error"),
        _CONFIG_EXIT,
    ),
    "run": (
        (0, "stopped (SIGTERM, SIGINT)"),
        (1, "could not start"),
        _CONFIG_EXIT,
        (75, "/etc/hal0 was re-created: systemd restarts the daemon to see it (EX_TEMPFAIL)"),
    ),
    "check-config": (
        (0, "the settings file is valid (or absent: the defaults apply)"),
        (1, "usage error (a bad --set value)"),
        _CONFIG_EXIT,
    ),
    "status": (
        (0, "running and healthy"),
        (1, "running but degraded or unhealthy, or its status is stale"),
        (3, "not running"),
        (4, "status unknown (the status file cannot be read)"),
    ),
    "reload": (
        (0, "the new settings are live (their first full pass is done)"),
        (1, "refused: the daemon keeps its old settings (the journal says why); or no answer"),
        (3, "not running, or it exited during the reload"),
        (EXIT_CONFIG, "refused: the settings file on disk is invalid (the old settings stay)"),
    ),
    "aiter plan": (
        (0, "nothing to do"),
        (1, "error, or a module whose heal cannot converge"),
        (2, "a heal is pending"),
    ),
    "aiter heal": ((0, "healed or nothing to do"), (1, "error"), (2, "refused: a build runs")),
    "aiter restore": ((0, "restored"), (1, "error")),
    "aiter explain": ((0, "explained"), (1, "not found in any table, or error")),
}

_EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "plan": (
        ("hal0-reconciler plan", "what the next pass would change on this host"),
        (
            "hal0-reconciler plan --assume-amd --assume-rocm=unusable",
            "preview a lost ROCm lane",
        ),
        ("hal0-reconciler plan --json | jq .slots", "the same as data"),
    ),
    "once": (("hal0-reconciler once --no-restart", "relabel now; restart the slots yourself"),),
    "status": (("hal0-reconciler status --json", "what monitoring reads"),),
    "run": (("systemctl reload hal0-reconciler", "re-read the settings (SIGHUP)"),),
    "check-config": (
        (
            "hal0-reconciler check-config && systemctl restart hal0-reconciler",
            "restart only with a file the daemon will take",
        ),
    ),
}

# Completion hints for shtab (plain data: shtab is a build-time tool, not imported here).
_COMPLETE_FILE = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}
_COMPLETE_DIR = {"bash": "_shtab_compgen_dirs", "zsh": "_files -/", "tcsh": "d"}
_DIR_DESTS = frozenset(
    {
        "slots_dir",
        "dri_dir",
        "amdgpu_module_dir",
        "state_dir",
        "runtime_dir",
        "package_dir",
        "jit_dir",
    }
)

# --flag -> settings field; every host path is configurable from the command line.
_PATH_FLAGS = {
    "slots_dir": "slots directory (default /etc/hal0/slots, under $HAL0_HOME when set)",
    "lock_file": "hal0's slot write lock (default <slots-dir>.lock)",
    "profiles_file": "hal0's profile catalog (default /etc/hal0/profiles.toml)",
    "hal0_venv": "hal0's venv, read for its image sets (default /usr/lib/hal0/venv)",
    "hal0_release_dir": "hal0's release tree, VERSION (default /usr/lib/hal0/current)",
    "hal0_config_file": "hal0's settings, [slots].default_images (default /etc/hal0/hal0.toml)",
    "kfd_path": "the KFD node the ROCm lane needs (default /dev/kfd)",
    "dri_dir": "where render nodes live (default /dev/dri)",
    "amdgpu_module_dir": "present on an AMD host (default /sys/module/amdgpu)",
    "state_dir": "the reconciler's own state (default /var/lib/hal0-reconciler)",
    "runtime_dir": "status file folder (default /run/hal0-reconciler)",
}


class _Parser(argparse.ArgumentParser):
    """argparse with the one error prefix, and exit 1 for a usage error: argparse's own 2
    would read as "changes pending" to a script running `plan`."""

    _verb_help: tuple[str, set[str]] | None = None
    """(verb path, the common options' dests): its exit codes and short usage line, made when
    first shown (``_finish``): a command that runs needs neither."""

    _checking = False
    """In ``add_argument``: argparse makes a formatter there only to check the option's metavar,
    and a formatter without a width looks up the terminal's (``shutil``, which imports the
    compression modules): ~2 ms of a command's start for a width that check never uses."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        self._checking = True
        try:
            return super().add_argument(*args, **kwargs)
        finally:
            self._checking = False

    def _get_formatter(self) -> argparse.HelpFormatter:
        if self._checking:
            return argparse.HelpFormatter(prog=self.prog, width=80)
        return super()._get_formatter()

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        console.error(f"{message} (see {self.prog} --help)")
        raise SystemExit(EXIT_ERROR)

    def format_usage(self) -> str:
        self._complete_help()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete_help()
        return super().format_help()

    def _complete_help(self) -> None:
        if self._verb_help is None:
            return
        full, common = self._verb_help
        self._verb_help = None
        if self.epilog is None:
            self.epilog = _epilog(full)
            self.formatter_class = argparse.RawDescriptionHelpFormatter
        self.usage = _short_usage(self, common)


def _path_arg(text: str) -> Path:
    """A path option; an empty one would silently mean the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a path must not be empty (it would mean this folder)")
    return Path(text)


def _epilog(verb: str) -> str:
    import textwrap  # only for --help

    lines: list[str] = []
    if verb in _EXAMPLES:
        lines.append("examples:")
        lines += [f"  {cmd}\n      {what}" for cmd, what in _EXAMPLES[verb]]
        lines.append("")
    lines.append("exit status:")
    for code, text in _EXITS[verb]:
        lines += textwrap.wrap(
            text, width=79, initial_indent=f"  {code}  ", subsequent_indent=" " * 5
        )
    return "\n".join(lines)


def _common_options() -> _Parser:
    """The options every verb takes, in one help group."""
    common = _Parser(add_help=False)
    group = common.add_argument_group(
        "common options", "every verb takes these; a flag wins over the settings file"
    )
    group.add_argument(
        "--config",
        type=_path_arg,
        metavar="FILE",
        help="settings file (default /etc/hal0/reconciler.toml)",
    )
    for field, text in _PATH_FLAGS.items():
        group.add_argument(
            "--" + field.replace("_", "-"), dest=field, type=_path_arg, metavar="PATH", help=text
        )
    group.add_argument(
        "--user",
        dest="service_user",
        help="service user the probe runs as (name or uid[:gid[:groups]])",
    )
    group.add_argument(
        "--log-format",
        choices=[f.value for f in settings.LogFormat],
        help="log lines on stderr: journal under systemd, else console (human lines; json only "
        "when asked) (default auto)",
    )
    group.add_argument(
        "--log-level", choices=settings.CHOICES["log_level"], help="least severe level logged"
    )
    group.add_argument(
        "--no-color",
        "--no-colour",
        dest="no_color",
        action="store_true",
        help="no colour (also: NO_COLOR=1, TERM=dumb; never into a file or pipe)",
    )
    group.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any setting, nested ones dotted: --set demote_grace=10 "
        "--set aiter.heal=false",
    )
    return common


def build_parser(*, only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line (``--help``, the shell completions), or with ``only`` just that
    verb's parser under the same top level: what the command line needs when it starts with
    the verb (the others' options and help are not built; nor is the aiter engine loaded)."""
    common = _common_options()

    parser = _Parser(
        prog="hal0-reconciler",
        description="Keep hal0 slot device labels and aiter's compiled registry true to the host.",
        epilog="Run 'hal0-reconciler VERB --help' for a verb's options and exit codes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(
        dest="verb", required=True, metavar="VERB", parser_class=_Parser, prog=parser.prog
    )  # prog: what argparse would format from the usage (no positional comes before VERB)

    def verb(name: str, text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = verbs.add_parser(
            name,
            parents=[common],
            help=text,
            description=text[0].upper() + text[1:] + ".",
        )  # the epilog (exit codes) and the short usage line come from _finish
        return sub

    for name, add in _VERBS.items():
        if only is None or only == name:
            add(verb, verbs, common)
    _finish(parser, common={a.dest for a in common._actions})  # noqa: SLF001
    return parser


_Verb = Callable[[str, str], argparse.ArgumentParser]


def _add_once(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    once = verb("once", "one reconcile pass over every slot, then exit")
    once.add_argument(
        "--no-restart",
        action="store_true",
        help="do not restart active slots whose label changed (they keep serving on the old lane)",
    )
    once.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def _add_plan(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    plan = verb("plan", "dry run: per slot, what would change and why")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    amd = plan.add_mutually_exclusive_group()
    amd.add_argument(
        "--assume-amd",
        dest="assume_amd",
        action="store_const",
        const=True,
        help="plan as if this were an AMD host (amdgpu loaded)",
    )
    amd.add_argument(
        "--assume-not-amd",
        dest="assume_amd",
        action="store_const",
        const=False,
        help="plan as if this were not an AMD host",
    )
    plan.add_argument(
        "--assume-rocm",
        choices=["usable", "unusable"],
        help="take this ROCm-lane verdict instead of probing",
    )


def _add_probe(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    probe = verb("probe", "print the host facts and the ROCm-lane verdict for the service user")
    probe.add_argument("--json", action="store_true", help="machine-readable output")


def _add_run(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    verb("run", "the daemon (systemd Type=notify; SIGHUP re-reads the settings)")


def _add_check_config(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    verb("check-config", "check the settings file exactly as `run` reads it, then exit")


def _add_status(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    status = verb("status", "report on the running daemon from its status file")
    status.add_argument("--json", action="store_true", help="machine-readable output")


def _add_reload(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    reload = verb("reload", "reload the daemon's settings and wait until they are live")
    reload.add_argument("--pid", type=int, help="the daemon's pid (default: from its status file)")
    reload.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")


def _add_aiter(_verb: _Verb, verbs: Any, common: argparse.ArgumentParser) -> None:
    from hal0_reconciler.aiter import cli as aiter_cli

    aiter_cli.add_parser(verbs, parents=[common])


# Every verb, in the order of the help; each adds its own parser (see build_parser's ``only``).
_VERBS: dict[str, Callable[[_Verb, Any, argparse.ArgumentParser], None]] = {
    "once": _add_once,
    "plan": _add_plan,
    "probe": _add_probe,
    "run": _add_run,
    "check-config": _add_check_config,
    "status": _add_status,
    "reload": _add_reload,
    "aiter": _add_aiter,
}


def _verb_of(argv: Sequence[str]) -> str | None:
    """The verb when the command line starts with one (then only its parser is built); None
    for anything else (no verb, a top-level option first, a mistyped verb): the whole parser
    gives the top-level help, usage and errors exactly."""
    return argv[0] if argv and argv[0] in _VERBS else None


def _short_usage(parser: argparse.ArgumentParser, common: set[str]) -> str:
    """The verb's usage line with its own options, the common ones as one ``[common options]``
    (each is listed once, in its help group)."""
    own = [a for a in parser._actions if a.dest not in common]  # noqa: SLF001
    formatter = parser._get_formatter()  # noqa: SLF001
    groups = parser._mutually_exclusive_groups  # noqa: SLF001
    formatter.add_usage(None, own, groups, prefix="usage: ")
    text = formatter.format_help().strip().removeprefix("usage: ")
    return text.replace("[-h]", "[-h] [common options]", 1)


def _finish(parser: argparse.ArgumentParser, path: str = "", *, common: set[str]) -> None:
    """Walk the verb tree: exit codes in every verb's epilog and its short usage, when shown
    (the aiter verbs register their own parsers; subparsers inherit ``_Parser``, so one error
    prefix), and completion hints."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if action.dest in _DIR_DESTS:
            setattr(action, "complete", _COMPLETE_DIR)  # noqa: B010 - shtab reads this attribute
        elif action.type is _path_arg or action.dest == "routing_file":
            setattr(action, "complete", _COMPLETE_FILE)  # noqa: B010
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                full = f"{path} {name}".strip()
                if full in _EXITS and isinstance(sub, _Parser):
                    sub._verb_help = (full, common)  # noqa: SLF001 - our own class
                _finish(sub, full, common=common)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=_verb_of(argv))
    args = parser.parse_args(argv)
    if args.no_color:
        console.refuse_colour()
    broken: str | None = None  # the settings file's error, for the verbs that answer anyway
    try:
        overrides = _overrides(args)
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
    resolved = _log.configure(current.log_format, current.log_level)
    if args.verb == "plan" and resolved is settings.LogFormat.CONSOLE:
        # its header (and --json's "problems") says them: one place, not also on stderr; the
        # journal and --log-format json still get the structured event
        _log.mute("hal0.facts_fallback")
    for line in loaded.deprecated:
        _cli_log.warning("settings.deprecated", message=line, effect="ignored")
    if args.verb == "check-config":
        return _check_config(loaded)
    try:
        if broken is not None and args.verb == "status":
            return _status(args, current, broken=broken)
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


def _check_config(loaded: settings.Loaded) -> int:
    """``check-config``: the file was read exactly as ``run`` reads it (errors exit 78 in
    ``main``); say what was checked. Deprecation warnings went to the log (stderr)."""
    if loaded.path is None:
        print(f"no settings file at {settings.default_config_path()}: the defaults apply")
    else:
        print(f"{loaded.path}: valid")
    return EXIT_OK


def _dispatch(
    args: argparse.Namespace, current: settings.Settings, overrides: dict[str, Any]
) -> int:
    verb: str = args.verb
    if verb not in ("run", "once"):  # those release them once their handlers are in place
        held_signals.release()
    if verb == "once":
        return _once(current, restart=not args.no_restart, as_json=args.json)
    if verb == "plan":
        return _plan(current, args)
    if verb == "probe":
        return _probe(current, as_json=args.json)
    if verb == "run":
        from hal0_reconciler.host import facts as host_facts

        early = host_facts.EarlyGather(current)  # the probe runs while the daemon loads
        from hal0_reconciler.daemon import runner

        return runner.run(current, config_path=args.config, overrides=overrides, gather=early)
    if verb == "status":
        return _status(args, current, broken=None)
    if verb == "reload":
        from hal0_reconciler.daemon import status

        text, code = status.reload(current, pid=args.pid, timeout=args.timeout)
        if code != status.EXIT_OK:
            console.say(text, sys.stderr)
        elif sys.stdout.isatty():  # under systemd (ExecReload) success says nothing
            console.say(text)
        return code
    from hal0_reconciler.aiter import cli as aiter_cli

    return aiter_cli.main(args, current)


def _status(args: argparse.Namespace, current: settings.Settings, *, broken: str | None) -> int:
    """``status``: from the daemon's status file; ``broken``: the settings file's error."""
    from hal0_reconciler.daemon import status

    if args.json:
        doc, code = status.report_json(current, settings_error=broken)
        console.dump_json({"schema": JSON_SCHEMA, **doc})
        return code
    text, code = status.report(current, settings_error=broken)
    console.say(text)
    return code


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
    for field in (*_PATH_FLAGS, "service_user", "log_format", "log_level"):
        value = getattr(args, field, None)
        if value is not None:
            overrides[field] = str(value)
    return overrides


def _require_slots_dir(current: settings.Settings) -> None:
    """A one-shot run against a folder that is not there is a mistake, not "no changes"."""
    folder = current.slots_dir
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a directory"
        raise SettingsError(f"slots directory {folder} {what}")
    if not os.access(folder, os.R_OK | os.X_OK):
        raise SettingsError(f"slots directory {folder} cannot be read")


@contextlib.contextmanager
def _stop_flag() -> Iterator[Callable[[], bool]]:
    """SIGTERM / SIGINT end a one-shot pass between two files (never mid-write)."""
    stopped: list[int] = []

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)

    previous = {
        signum: signal.signal(signum, on_stop) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    held_signals.release()
    try:
        yield lambda: bool(stopped)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _once(current: settings.Settings, *, restart: bool, as_json: bool = False) -> int:
    with _stop_flag() as stopped:
        return _once_until(current, restart=restart, as_json=as_json, stopped=stopped)


def _once_until(
    current: settings.Settings, *, restart: bool, as_json: bool, stopped: Callable[[], bool]
) -> int:
    from hal0_reconciler import passview, reconcile, state  # the engine: see _plan
    from hal0_reconciler.host import facts as host_facts
    from hal0_reconciler.host import units
    from hal0_reconciler.model import LaneState

    _require_slots_dir(current)
    facts = host_facts.gather(current)
    probe_failed = facts.amd and facts.lane is LaneState.UNKNOWN
    if probe_failed:
        _cli_log.error(
            "host.probe_failed", reason=facts.lane_reason, effect="no slot is demoted to cpu"
        )
    ledger = state.DemotionLedger.in_state_dir(current.state_dir) if facts.amd else None
    report = reconcile.Reconciler(current, ledger=ledger, cancelled=stopped).reconcile(facts)
    if stopped():
        _cli_log.warning("once.stopped", relabeled=len(report.relabeled), reason="signal")
        return EXIT_ERROR
    # an active slot keeps its old devices until restarted; one systemctl call asks for all
    changed = [o for o in report.relabeled if o.name is not None and o.token is not None]
    states = units.active_states(current, [o.token for o in changed if o.token is not None])
    for outcome in changed:
        if outcome.name is None or outcome.token is None:
            continue
        request = units.RestartRequest(name=outcome.name, token=outcome.token)
        if restart:
            units.apply_change(current, request, active=states[outcome.token])
        elif states[outcome.token]:
            _cli_log.warning(
                "unit.needs_reload",
                slot=outcome.name,
                unit=units.unit_name(outcome.token),
                action="restart the slot in hal0 to apply its new device",
            )
    if report.failed or probe_failed:
        code = EXIT_ERROR
    elif passview.unjudged(report):
        code = EXIT_UNJUDGED
    else:
        code = EXIT_OK
    if as_json:
        doc = {"schema": JSON_SCHEMA, "host": _host_json(facts)}
        doc |= {"slots": passview.once_slots(report), **passview.once_counts(report)}
        console.dump_json({**doc, "exit_code": code})
    elif sys.stdout.isatty():  # a person is reading; a pipe or the journal gets the logs only
        console.say("\n".join([_facts_line(facts), *passview.once_lines(report)]), painted=True)
    return code


def _plan(current: settings.Settings, args: argparse.Namespace) -> int:
    """The dry run. With no slot file to judge off an AMD host (where the engine logs nothing),
    hal0's facts are all it shows: the reconcile engine and the outcomes' views stay unloaded."""
    from hal0_reconciler.host import hal0
    from hal0_reconciler.slots import store

    _require_slots_dir(current)
    facts = _assumed_facts(current, args.assume_amd, args.assume_rocm)
    if not facts.amd and not store.list_slot_names(current.slots_dir):
        return _plan_print(args, facts, hal0.Hal0Reader(current).read(), None)
    from hal0_reconciler import reconcile, state  # a slot to judge, or an AMD host

    ledger = state.DemotionLedger.in_state_dir(current.state_dir) if facts.amd else None
    reconciler = reconcile.Reconciler(current, ledger=ledger)
    report = reconciler.reconcile(facts, apply=False)
    read = hal0.Hal0Read(
        reconciler.hal0_facts or hal0.read_facts(current).facts, reconciler.hal0_problems
    )
    from hal0_reconciler.daemon import labels  # what runs vs the labels (rendered units)

    shown = labels.plan_entries(current, report.outcomes, read.facts) if facts.amd else {}
    return _plan_print(args, facts, read, report, labels=shown)


def _plan_print(
    args: argparse.Namespace,
    facts: HostFacts,
    read: hal0.Hal0Read,
    report: PassReport | None,
    *,
    labels: dict[str, dict[str, Any]] | None = None,
) -> int:
    """Print the plan (``report`` None: no slot file); its exit code."""
    rows: list[dict[str, str]] = []
    slots: list[dict[str, Any]] = []
    notes: list[str] = []
    pending = unjudged = 0
    if report is not None:
        from hal0_reconciler import passview  # with the engine (see _plan)

        rows, notes = passview.plan_rows(report), passview.write_notes(report)
        slots = passview.plan_slots(report) if args.json else []
        pending, unjudged = len(report.pending), passview.unjudged(report)
    code = EXIT_UNJUDGED if unjudged else EXIT_PENDING if pending else EXIT_OK
    if args.json:
        doc = {"schema": JSON_SCHEMA, "host": _host_json(facts), "hal0": _hal0_json(read)}
        doc |= {"slots": slots, "pending": pending, "labels_not_applied": labels or {}}
        console.dump_json({**doc, "unjudged": unjudged, "exit_code": code})
    else:
        console.say(_plan_table(rows, notes, pending, facts, read))
        if labels:
            from hal0_reconciler.daemon import labels as label_lines

            console.say("\n".join(label_lines.plan_lines(labels)))
        if unjudged:
            console.say(f"{unjudged} slot file(s) could not be judged: see their REASON")
    return code


def _assumed_facts(
    current: settings.Settings, assume_amd: bool | None, assume_rocm: str | None
) -> HostFacts:
    from hal0_reconciler.host import facts as host_facts
    from hal0_reconciler.model import HostFacts, LaneState

    amd = host_facts.is_amd_host(current) if assume_amd is None else assume_amd
    if assume_rocm is not None:
        lane = LaneState.USABLE if assume_rocm == "usable" else LaneState.UNUSABLE
        return HostFacts(amd=amd, lane=lane)
    if not amd:
        return HostFacts(amd=False, lane=LaneState.UNUSABLE)
    probed = host_facts.gather(current)
    return HostFacts(amd=True, lane=probed.lane, probe=probed.probe)


def _facts_line(facts: HostFacts) -> str:
    if not facts.amd:
        return "host: not AMD (nothing is touched)"
    why = facts.lane_reason if facts.probe is not None else "assumed, not probed"
    return f"host: AMD, ROCm lane {facts.lane.value} ({console.inert(why)})"


def _hal0_lines(read: hal0.Hal0Read) -> list[str]:
    """hal0's facts for people: every value is hal0's file's, shown inert."""
    f, inert = read.facts, console.inert
    version = inert(f.version or "version unknown")
    capable = ", ".join(inert(c) for c in sorted(f.capable)) or "none"
    lines = [f"hal0: {version}; default image {inert(f.default_image)}; Vulkan-capable: {capable}"]
    lines += [f"  rule: {f.rule.value} ({inert(f.rule_evidence)})"]
    lines += [f"  runners: {f.runners_shape.value} ({inert(f.runners_evidence)})"]
    lines += [f"  hal0 fact fallback: {inert(p.line())}" for p in read.problems]
    return lines


_COLUMNS = (
    "slot",
    "file",
    "runtime",
    "device",
    "action",
    "new",
    "reason",
    "image",
    "from",
    "capable",
)


def _plan_table(
    rows: list[dict[str, str]],
    notes: list[str],
    pending: int,
    facts: HostFacts,
    read: hal0.Hal0Read,
) -> str:
    head = {k: k.upper() for k in _COLUMNS}
    rows = [{k: console.inert(r[k]) for k in head} for r in rows]  # names, images: files' text
    widths = {k: max(len(r[k]) for r in [head, *rows]) for k in head}
    lines = [_facts_line(facts), *_hal0_lines(read), ""]
    lines += ["  ".join(r[k].ljust(widths[k]) for k in head).rstrip() for r in [head, *rows]]
    lines += notes
    lines += ["", f"{pending} change(s) pending" if pending else "no changes"]
    return "\n".join(lines)


def _host_json(facts: HostFacts) -> dict[str, Any]:
    if not facts.amd:
        return {"amd": False, "rocm_lane": "not-amd", "reason": "not an AMD host"}
    why = facts.lane_reason if facts.probe is not None else "assumed, not probed"
    return {"amd": True, "rocm_lane": facts.lane.value, "reason": why}


def _hal0_json(read: hal0.Hal0Read) -> dict[str, Any]:
    from hal0_reconciler.host import hal0

    return {**hal0.describe(read.facts), "problems": [p.line() for p in read.problems] or None}


def _probe_doc(current: settings.Settings, facts: HostFacts, read: hal0.Hal0Read) -> dict[str, Any]:
    """What `probe` found, as data; the text output is printed from it."""
    doc: dict[str, Any] = {
        "schema": JSON_SCHEMA,
        "amd": facts.amd,
        "amdgpu_module_dir": str(current.amdgpu_module_dir),
        "hal0": {**_hal0_json(read), "sources": dict(sorted(read.facts.sources.items()))},
        "rocm_lane": facts.lane.value if facts.amd else "not-amd",
        "reason": facts.lane_reason if facts.amd else "not an AMD host",
        "service_user": None,
        "failures": [],
    }
    probe = facts.probe
    if probe is not None and probe.credentials is not None:
        c = probe.credentials
        doc["service_user"] = {
            "name": c.user,
            "uid": c.uid,
            "gid": c.gid,
            "groups": c.groups,
            "why": c.why,
        }
    if probe is not None:
        doc["render_node"] = probe.render_node
        doc["failures"] = [
            {"path": f.path, "kind": f.kind.value, "errno": f.errno, "message": f.message}
            for f in probe.failures
        ]
    return doc


def _probe(current: settings.Settings, *, as_json: bool = False) -> int:
    from hal0_reconciler.host import facts as host_facts
    from hal0_reconciler.host import hal0
    from hal0_reconciler.model import LaneState

    facts = host_facts.gather(current)
    read = hal0.read_facts(current)
    code = EXIT_OK if facts.amd and facts.lane is LaneState.USABLE else EXIT_ERROR
    doc = _probe_doc(current, facts, read)
    if as_json:
        console.dump_json({**doc, "exit_code": code})
        return code
    say, inert = console.say, console.inert  # paths, names and reasons: shown inert
    say(f"AMD host: {'yes' if facts.amd else 'no'} ({inert(current.amdgpu_module_dir)})")
    say("\n".join(_hal0_lines(read)))
    for fact, source in doc["hal0"]["sources"].items():
        say(f"  {inert(fact)}: {inert(source)}")
    if not facts.amd:
        say("ROCm lane: not probed (not an AMD host)")
        return code
    user = doc["service_user"]
    if user is not None:
        groups = ",".join(str(g) for g in user["groups"])
        say(
            f"probed as: {inert(user['name'])} (uid {user['uid']}, gid {user['gid']}, "
            f"groups {groups or '-'})"
        )
        say(f"  why this identity: {inert(user['why'] or 'given')}")
    say(f"ROCm lane: {facts.lane.value}: {inert(facts.lane_reason)}")
    for failure in doc["failures"]:
        errno = failure["errno"]
        errno_text = f" errno {errno}" if errno is not None else ""
        where, message = inert(failure["path"]), inert(failure["message"])
        say(f"  {where}: {failure['kind']}{errno_text}: {message}")
    return code
