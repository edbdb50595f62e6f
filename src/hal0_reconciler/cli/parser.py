"""The command line's grammar and help: the verbs, their options, the common options, the
usage lines and each verb's exit table in its ``--help`` (built only for the verb that runs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hal0_reconciler import __version__, console, settings
from hal0_reconciler.cli.exits import EXIT_ERROR, EXITS

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
_SET_FUNCTION = "_hal0_reconciler_setting_names"


def _complete_set() -> dict[str, object]:
    """``--set``: every setting's name with its ``=`` (not the deprecated ones, nor the
    ``[[aiter.trees]]`` tables, which only the file can hold)."""
    names = [
        f"{n}="
        for n in settings.setting_names()
        if n not in settings.DEPRECATED and n != "aiter.trees"
    ]
    words = " ".join(names)
    return {
        "bash": _SET_FUNCTION,
        "zsh": _SET_FUNCTION,
        "preamble": {
            "bash": f'{_SET_FUNCTION}() {{\n  compgen -W "{words}" -- "$1"\n}}\n',
            "zsh": f"{_SET_FUNCTION}() {{\n  compadd -S '' -- {words}\n}}\n",
        },
    }


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
PATH_FLAGS = {
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
    for code, text in EXITS[verb]:
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
    for field, text in PATH_FLAGS.items():
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

    for name, add in VERBS.items():
        if only is None or only == name:
            add(verb, verbs, common)
    _finish(parser, common={a.dest for a in common._actions})  # noqa: SLF001
    return parser


_Verb = Callable[[str, str], argparse.ArgumentParser]


def _add_what_if(parser: argparse.ArgumentParser) -> None:
    """What-if judging: a known hal0 release's rules, whatever (if anything) is installed."""
    from hal0_reconciler.host.hal0 import release

    parser.add_argument(
        "--assume-hal0",
        dest="assume_hal0",
        choices=[r.version for r in release.RELEASES],
        metavar="RELEASE",
        help="judge by this hal0 release's rules ("
        + ", ".join(r.version for r in release.RELEASES)
        + "), not the installed one's",
    )
    parser.add_argument(
        "--manifest",
        dest="manifest_file",
        type=_path_arg,
        metavar="FILE",
        help="hal0's manifest.json to judge by (1.4+ need one: its runner pins)",
    )


def _add_once(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    once = verb("once", "one reconcile pass over every slot, then exit")
    _add_what_if(once)
    once.add_argument(
        "--no-restart",
        action="store_true",
        help="do not restart active slots whose label changed (they keep serving on the old lane)",
    )
    once.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def _add_plan(verb: _Verb, _verbs: Any, _common: argparse.ArgumentParser) -> None:
    plan = verb("plan", "dry run: per slot, what would change and why")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    _add_what_if(plan)
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
    _add_what_if(probe)


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
VERBS: dict[str, Callable[[_Verb, Any, argparse.ArgumentParser], None]] = {
    "once": _add_once,
    "plan": _add_plan,
    "probe": _add_probe,
    "run": _add_run,
    "check-config": _add_check_config,
    "status": _add_status,
    "reload": _add_reload,
    "aiter": _add_aiter,
}


def verb_of(argv: Sequence[str]) -> str | None:
    """The verb when the command line starts with one (then only its parser is built); None
    for anything else (no verb, a top-level option first, a mistyped verb): the whole parser
    gives the top-level help, usage and errors exactly."""
    return argv[0] if argv and argv[0] in VERBS else None


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
        elif action.dest == "assignments":  # --set NAME=VALUE
            setattr(action, "complete", _complete_set())  # noqa: B010
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                full = f"{path} {name}".strip()
                if full in EXITS and isinstance(sub, _Parser):
                    sub._verb_help = (full, common)  # noqa: SLF001 - our own class
                _finish(sub, full, common=common)
