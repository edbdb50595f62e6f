"""Who asked for this run: root itself, or a user root runs it for (sudo, pkexec, doas).

A command run through ``sudo`` is root acting for someone else: whatever that caller chooses
must not become root's choice. So, when the caller is not really root (the real uid is not 0,
or ``SUDO_UID``/``PKEXEC_UID``/``DOAS_USER`` names another user), the command line may not
choose a program root runs (``systemctl``), a peer root talks to (``api_url``), a user root
trusts (``hal0_api_user``, ``hal0_api_unit``, ``service_user``), a process root signals
(``reload --pid``), or any path root reads or writes (``--config``, the folder and file flags,
every path setting, ``HAL0_HOME``), nor start the daemon (``run``); ``systemctl`` is run from a
fixed root-owned path; and the
caller's uid is never trusted as hal0-api's owner. What stays: the verbs; on the verbs that only
look, numbers, switches and log choices; on the verbs that write, presentation only
(docs/security.md, "Running it through sudo")."""

from __future__ import annotations

import dataclasses
import os
import pwd
import stat
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hal0_reconciler import settings as settings_mod

DELEGATION_VARIABLES = ("SUDO_UID", "PKEXEC_UID")
SYSTEMCTL_PATHS = (Path("/usr/bin/systemctl"), Path("/bin/systemctl"))
CHOOSERS: Mapping[str, str] = {
    "systemctl": "a program root runs",
    "api_url": "the peer root sends hal0's admin key to",
    "hal0_api_user": "a user root trusts as hal0-api",
    "hal0_api_unit": "the unit whose User= root trusts as hal0-api",
    "service_user": "the user root runs the probe as",
}
"""Settings (besides every path) that choose for root, with what they choose."""


def delegating_uid(
    environ: Mapping[str, str] | None = None, *, real_uid: int | None = None
) -> int | None:
    """The uid root runs this command for; None when the caller is root itself."""
    real = os.getuid() if real_uid is None else real_uid
    if real != 0:
        return real
    env = os.environ if environ is None else environ
    for variable in DELEGATION_VARIABLES:
        value = env.get(variable, "").strip()
        if value.isdigit() and int(value) != 0:
            return int(value)
    name = env.get("DOAS_USER", "").strip()
    if name and name != "root":
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return -1  # a name this host does not know: still not root
    return None


def _holds_path(hint: Any) -> bool:
    """The type names a path, or a structure (a list, a table) that holds one."""
    if hint is Path:
        return True
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return any(_holds_path(h) for h in typing.get_type_hints(hint).values())
    return any(_holds_path(arg) for arg in typing.get_args(hint))


def chosen_for_root(overrides: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``--set`` names (dotted) a delegated caller may not set, with what each chooses."""
    hints = typing.get_type_hints(settings_mod.Settings)
    refused: list[tuple[str, str]] = []
    for key, value in overrides.items():
        if key in CHOOSERS:
            refused.append((key, CHOOSERS[key]))
        elif key == "aiter" and isinstance(value, Mapping):
            refused += _nested(value, key)
        elif key in hints and _holds_path(hints[key]):
            refused.append((key, "a path root reads or writes"))
    return refused


def _nested(overrides: Mapping[str, Any], table: str) -> list[tuple[str, str]]:
    hints = typing.get_type_hints(settings_mod.AiterSettings)
    return [
        (f"{table}.{key}", "a path root reads or writes")
        for key in overrides
        if key in hints and _holds_path(hints[key])
    ]


def refusals(
    flags: Mapping[str, object], overrides: Mapping[str, Any], environ: Mapping[str, str]
) -> list[str]:
    """Why a delegated run is refused (empty: it may run): ``flags`` are the parsed command
    line's values (a path flag given, ``pid``), ``overrides`` the ``--set`` table."""
    why: list[str] = []
    if flags.get("verb") == "run":
        why.append("run (the daemon is systemd's to start: systemctl start hal0-reconciler)")
    for flag, value in flags.items():
        if isinstance(value, Path):
            why.append(f"--{flag.replace('_', '-')} (a path root reads or writes)")
        elif flag == "pid" and value is not None:
            why.append("--pid (the process root signals)")
        elif flag == "service_user" and value is not None:
            why.append(f"--user ({CHOOSERS['service_user']})")
    given = {k: v for k, v in overrides.items() if k not in flags or flags[k] is None}
    why += [f"--set {name} ({what})" for name, what in chosen_for_root(given)]
    if _writes(flags):
        why += _changes_what_root_writes(flags, given)
    if environ.get("HAL0_HOME", "").strip():
        why.append("HAL0_HOME (it moves every path root reads or writes)")
    return why


WRITING_VERBS = frozenset({"once", "aiter heal", "aiter restore"})
"""Verbs that change files or slots: a delegated caller may run them only as root would."""
PRESENTATION_FLAGS = frozenset(
    {"verb", "aiter_verb", "id", "json", "no_color", "no_restart", "log_format", "log_level"}
)
"""Flags of a writing verb that change only what is shown (or make it do less)."""
PRESENTATION_SETTINGS = frozenset({"log_format", "log_level"})


def _writes(flags: Mapping[str, object]) -> bool:
    verb = str(flags.get("verb"))
    sub = flags.get("aiter_verb")
    return (f"{verb} {sub}" if sub else verb) in WRITING_VERBS


def _changes_what_root_writes(flags: Mapping[str, object], given: Mapping[str, Any]) -> list[str]:
    """A writing verb's flags and settings beyond the presentation ones: the facts, rules,
    limits and slots root writes by (``--assume-hal0``, ``--target``, ``hands_off``,
    ``demote_grace``...) are the settings file's, not the caller's."""
    why = [
        f"--{flag.replace('_', '-')} (it changes what root writes)"
        for flag, value in flags.items()
        if flag not in PRESENTATION_FLAGS
        and flag != "assignments"
        and value not in (None, False, [], ())
        and not isinstance(value, Path)  # refused above, as a path
        and flag not in {"pid", "service_user"}
    ]
    listed = {name for name, _ in chosen_for_root(given)}
    why += [
        f"--set {name} (it changes what root writes)"
        for name in given
        if name not in PRESENTATION_SETTINGS and name not in listed
    ]
    return why


def fixed_systemctl(candidates: tuple[Path, ...] = SYSTEMCTL_PATHS) -> str | None:
    """The first candidate that is a regular file root owns, on a way only root can change
    (every folder root's and not writable by others); None when none is (the delegated run is
    refused: a systemctl another user can change is never run for them)."""
    for candidate in candidates:
        if _root_only(candidate):
            return str(candidate.resolve())
    return None


def _root_only(path: Path) -> bool:
    try:
        real = path.resolve(strict=True)
        mode = os.lstat(real)
        if not stat.S_ISREG(mode.st_mode) or mode.st_uid != 0 or mode.st_mode & 0o022:
            return False
        for folder in real.parents:
            info = os.lstat(folder)
            if info.st_uid != 0 or info.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True
