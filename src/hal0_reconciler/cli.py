"""The command line: `hal0-reconciler once | plan | probe | run | status | aiter ...`.

Exit codes: 0 success / nothing pending; 1 error (a file could not be written, bad settings,
the probe found the lane unusable); 2 changes pending (`plan`, like terraform's
-detailed-exitcode).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from hal0_reconciler import __version__, _log, settings
from hal0_reconciler.errors import ReconcilerError, SettingsError
from hal0_reconciler.host import facts as host_facts
from hal0_reconciler.host import hal0, units
from hal0_reconciler.model import HostFacts, ImageResolution, LaneState
from hal0_reconciler.reconcile import Outcome, OutcomeStatus, PassReport, Reconciler
from hal0_reconciler.state import DemotionLedger

_cli_log = structlog.get_logger("hal0_reconciler.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_PENDING = 2

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


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", type=Path, help="settings file (default /etc/hal0/reconciler.toml)"
    )
    for field, text in _PATH_FLAGS.items():
        common.add_argument("--" + field.replace("_", "-"), dest=field, type=Path, help=text)
    common.add_argument(
        "--user",
        dest="service_user",
        help="service user the probe runs as (name or uid[:gid[:groups]])",
    )
    common.add_argument("--log-format", choices=[f.value for f in settings.LogFormat])
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    common.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any top-level setting, e.g. --set demote_grace=10",
    )

    parser = argparse.ArgumentParser(
        prog="hal0-reconciler",
        description="Keep hal0 slot device labels and aiter's compiled registry true to the host.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    once = verbs.add_parser("once", parents=[common], help="one reconcile pass, then exit")
    once.add_argument(
        "--no-restart",
        action="store_true",
        help="do not restart active slots whose label changed (they keep serving on the old lane)",
    )
    plan = verbs.add_parser("plan", parents=[common], help="dry run: what would change and why")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    amd = plan.add_mutually_exclusive_group()
    amd.add_argument("--assume-amd", dest="assume_amd", action="store_const", const=True)
    amd.add_argument("--assume-not-amd", dest="assume_amd", action="store_const", const=False)
    plan.add_argument("--assume-rocm", choices=["usable", "unusable"], help="skip the probe")
    verbs.add_parser("probe", parents=[common], help="print the host facts and the probe verdict")
    verbs.add_parser("run", parents=[common], help="the daemon (systemd Type=notify)")
    verbs.add_parser("status", parents=[common], help="report on the running daemon")
    try:
        from hal0_reconciler.aiter import cli as aiter_cli
    except ImportError:  # pragma: no cover - the aiter verbs are optional during development
        pass
    else:
        aiter_cli.add_parser(verbs, parents=[common])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        overrides = _overrides(args)
        current = settings.load(args.config, overrides)
    except ReconcilerError as exc:
        print(f"hal0-reconciler: {exc}", file=sys.stderr)
        return EXIT_ERROR
    _log.configure(current.log_format, current.log_level)
    try:
        return _dispatch(args, current, overrides)
    except ReconcilerError as exc:
        print(f"hal0-reconciler: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `hal0-reconciler plan | head`: the reader left, not an error
        devnull = os.open(os.devnull, os.O_WRONLY)  # no flush into the closed pipe at exit
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _dispatch(
    args: argparse.Namespace, current: settings.Settings, overrides: dict[str, Any]
) -> int:
    verb: str = args.verb
    if verb == "once":
        return _once(current, restart=not args.no_restart)
    if verb == "plan":
        return _plan(current, args)
    if verb == "probe":
        return _probe(current)
    if verb == "run":
        from hal0_reconciler.daemon import runner

        return runner.run(current, config_path=args.config, overrides=overrides)
    if verb == "status":
        from hal0_reconciler.daemon import status

        text, code = status.report(current)
        print(text)
        return code
    from hal0_reconciler.aiter import cli as aiter_cli

    return aiter_cli.main(args, current)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for item in args.assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value
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


def _once(current: settings.Settings, *, restart: bool) -> int:
    _require_slots_dir(current)
    facts = host_facts.gather(current)
    if facts.amd and facts.lane is LaneState.UNKNOWN:
        _cli_log.error(
            "host.probe_failed", reason=facts.lane_reason, effect="no slot is demoted to cpu"
        )
    ledger = DemotionLedger.in_state_dir(current.state_dir) if facts.amd else None
    report = Reconciler(current, ledger=ledger).reconcile(facts)
    for outcome in report.relabeled:  # an active slot keeps its old devices until restarted
        if outcome.name is None or outcome.token is None:
            continue
        request = units.RestartRequest(name=outcome.name, token=outcome.token)
        if restart:
            units.apply_change(current, request)
        elif units.is_active(current, outcome.token):
            _cli_log.warning(
                "unit.needs_reload",
                slot=outcome.name,
                unit=units.unit_name(outcome.token),
                action="restart the slot in hal0 to apply its new device",
            )
    return EXIT_ERROR if report.failed else EXIT_OK


def _plan(current: settings.Settings, args: argparse.Namespace) -> int:
    _require_slots_dir(current)
    facts = _assumed_facts(current, args.assume_amd, args.assume_rocm)
    ledger = DemotionLedger.in_state_dir(current.state_dir) if facts.amd else None
    reconciler = Reconciler(current, ledger=ledger)
    report = reconciler.reconcile(facts, apply=False)
    read = hal0.Hal0Read(
        reconciler.hal0_facts or hal0.read_facts(current).facts, reconciler.hal0_problems
    )
    if args.json:
        print(json.dumps(_plan_json(report, facts, read), indent=2))
    else:
        print(_plan_table(report, facts, read))
    return EXIT_PENDING if report.pending else EXIT_OK


def _assumed_facts(
    current: settings.Settings, assume_amd: bool | None, assume_rocm: str | None
) -> HostFacts:
    amd = host_facts.is_amd_host(current) if assume_amd is None else assume_amd
    if assume_rocm is not None:
        lane = LaneState.USABLE if assume_rocm == "usable" else LaneState.UNUSABLE
        return HostFacts(amd=amd, lane=lane)
    if not amd:
        return HostFacts(amd=False, lane=LaneState.UNUSABLE)
    probed = host_facts.gather(current)
    return HostFacts(amd=True, lane=probed.lane, probe=probed.probe)


def _plan_rows(report: PassReport) -> list[dict[str, str]]:
    rows = []
    for o in report.outcomes:
        v = o.verdict
        rows.append(
            {
                "slot": o.name or "-",
                "file": o.path.name,
                "runtime": v.runtime.value if v else "-",
                "device": v.old if v else "-",
                "action": _action_word(o.status),
                "new": (v.new or "") if v and o.status is OutcomeStatus.PENDING else "",
                "reason": v.reason.value if v else (o.message or ""),
                "image": (v.image.image or "-") if v and v.image else "-",
                "from": _rung_word(v.image) if v and v.image else "-",
                "capable": ("yes" if v.image.capable else "no") if v and v.image else "-",
            }
        )
    return rows


def _rung_word(image: ImageResolution) -> str:
    """The rung, marked when a stale former default was looked through to reach it."""
    return f"{image.rung.value}<-stale" if image.stale is not None else image.rung.value


def _action_word(status: OutcomeStatus) -> str:
    return {
        OutcomeStatus.PENDING: "relabel",
        OutcomeStatus.UNCHANGED: "keep",
        OutcomeStatus.SKIPPED: "skip",
    }.get(status, status.value)


def _facts_line(facts: HostFacts) -> str:
    if not facts.amd:
        return "host: not AMD (nothing is touched)"
    why = facts.lane_reason if facts.probe is not None else "assumed, not probed"
    return f"host: AMD, ROCm lane {facts.lane.value} ({why})"


def _hal0_lines(read: hal0.Hal0Read) -> list[str]:
    f = read.facts
    version = f.version or "version unknown"
    capable = ", ".join(sorted(f.capable)) or "none"
    lines = [f"hal0: {version}; default image {f.default_image}; Vulkan-capable: {capable}"]
    lines += [f"  hal0 fact fallback: {p.line()}" for p in read.problems]
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


def _plan_table(report: PassReport, facts: HostFacts, read: hal0.Hal0Read) -> str:
    rows = _plan_rows(report)
    head = {k: k.upper() for k in _COLUMNS}
    widths = {k: max(len(r[k]) for r in [head, *rows]) for k in head}
    lines = [_facts_line(facts), *_hal0_lines(read), ""]
    lines += ["  ".join(r[k].ljust(widths[k]) for k in head).rstrip() for r in [head, *rows]]
    lines += _write_notes(report)
    pending = len(report.pending)
    lines += ["", f"{pending} change(s) pending" if pending else "no changes"]
    return "\n".join(lines)


def _plan_json(report: PassReport, facts: HostFacts, read: hal0.Hal0Read) -> dict[str, Any]:
    return {
        "host": {"amd": facts.amd, "rocm_lane": facts.lane.value, "reason": facts.lane_reason},
        "hal0": _hal0_json(read),
        "slots": [
            {"path": str(o.path), **row, "effective_image": _image_json(o), **_comments_lost(o)}
            for o, row in zip(report.outcomes, _plan_rows(report), strict=True)
        ],
        "pending": len(report.pending),
    }


def _write_notes(report: PassReport) -> list[str]:
    """A line for each pending write that would not be byte-minimal or would be refused."""
    notes = []
    for o in report.outcomes:
        if o.status is OutcomeStatus.PENDING and o.message is not None:
            lost = "the write would rewrite the whole file, losing its comments and layout"
            notes.append(f"note: {o.path.name}: {lost} ({o.message})")
        elif o.status is OutcomeStatus.WRITE_FAILED:
            notes.append(f"note: {o.path.name}: the write would be refused ({o.message})")
    return notes


def _comments_lost(o: Outcome) -> dict[str, Any]:
    """Whether a pending write would rewrite the whole file (comments lost), and why."""
    lost = o.message if o.status is OutcomeStatus.PENDING else None
    return {"loses_comments": lost is not None, "loses_comments_why": lost}


def _hal0_json(read: hal0.Hal0Read) -> dict[str, Any]:
    return {**hal0.describe(read.facts), "problems": [p.line() for p in read.problems] or None}


def _image_json(outcome: Any) -> dict[str, Any] | None:
    """A candidate's effective image: what, from which rung of which runner, capable or not."""
    v = outcome.verdict
    if v is None or v.image is None:
        return None
    i = v.image
    return {
        "image": i.image,
        "rung": i.rung.value,
        "runner": i.runner,
        "capable": i.capable,
        "stale_looked_through": i.stale,
        "error": i.error,
        "explain": i.explain(),
    }


def _probe(current: settings.Settings) -> int:
    facts = host_facts.gather(current)
    read = hal0.read_facts(current)
    print(f"AMD host: {'yes' if facts.amd else 'no'} ({current.amdgpu_module_dir})")
    print("\n".join(_hal0_lines(read)))
    for fact, source in sorted(read.facts.sources.items()):
        print(f"  {fact}: {source}")
    if not facts.amd:
        print("ROCm lane: not probed (not an AMD host)")
        return EXIT_ERROR
    probe = facts.probe
    if probe is not None and probe.credentials is not None:
        c = probe.credentials
        groups = ",".join(str(g) for g in c.groups)
        print(f"probed as: {c.user} (uid {c.uid}, gid {c.gid}, groups {groups or '-'})")
        print(f"  why this identity: {c.why or 'given'}")
    print(f"ROCm lane: {facts.lane.value}: {facts.lane_reason}")
    if probe is not None:
        for failure in probe.failures:
            errno_text = f" errno {failure.errno}" if failure.errno is not None else ""
            print(f"  {failure.path}: {failure.kind.value}{errno_text}: {failure.message}")
    return EXIT_OK if facts.lane is LaneState.USABLE else EXIT_ERROR
