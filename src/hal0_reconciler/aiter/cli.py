"""The ``aiter`` verbs: plan, heal, restore, explain. Exit codes: 0 nothing to do / done,
2 a heal is pending (plan) or was refused because a build runs (heal), 1 error (including a
module whose heal does not converge, table rows no rebuild fixes, and a boot that dies)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from hal0_reconciler import console
from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import resolve
from hal0_reconciler.aiter.tables import rows as tables
from hal0_reconciler.settings import AiterTree, Settings

EXIT_OK, EXIT_ERROR, EXIT_PENDING = 0, 1, 2


def add_parser(subparsers: Any, *, parents: Sequence[argparse.ArgumentParser] = ()) -> None:
    """Register the ``aiter`` verb and its sub-verbs; ``parents`` (the global options) and the
    aiter options go on every sub-verb, so ``aiter plan --config X --package-dir Y`` works."""
    opts = argparse.ArgumentParser(add_help=False)
    opts.add_argument(
        "--package-dir",
        type=Path,
        help="check this aiter package folder instead of the configured trees",
    )
    opts.add_argument("--jit-dir", type=Path, help="JIT folder (default: aiter's own rule)")
    opts.add_argument("--target", help="'auto' or gfxNNN:CUs, e.g. gfx942:304")
    opts.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="base environment entry (repeatable)",
    )
    opts.add_argument("--routing-file", type=Path, help="routing data replacing the shipped one")
    opts.add_argument("--no-slots", action="store_true", help="ignore slot environments")
    common = [*parents, opts]
    parser = subparsers.add_parser("aiter", help="check and heal aiter's compiled kernel registry")
    verbs = parser.add_subparsers(dest="aiter_verb", required=True, metavar="SUBVERB")
    p = verbs.add_parser("plan", parents=common, help="verdict per environment and module")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    verbs.add_parser("heal", parents=common, help="quarantine exactly the stale modules")
    r = verbs.add_parser("restore", parents=common, help="put a quarantine back")
    r.add_argument("id", help="the quarantine's id (its folder name, as heal printed it)")
    e = verbs.add_parser("explain", parents=common, help="explain a registry-miss error message")
    e.add_argument("text", help="the error text the crashed server printed (quote it)")


def main(args: argparse.Namespace, settings: Settings, *, out: TextIO | None = None) -> int:
    """Run one ``aiter`` sub-verb; returns the exit code."""
    out = out if out is not None else sys.stdout
    shown = console.InertWriter.over(out)  # text for people: one print, one inert line
    try:
        settings = _effective(args, settings)
    except ValueError as exc:
        console.error(str(exc))
        return EXIT_ERROR
    if not settings.aiter.trees:
        if args.aiter_verb == "explain":
            from hal0_reconciler.aiter import explain  # noqa: PLC0415 - only this verb uses it

            return explain.without_tree(args.text, settings, shown)
        console.error("no aiter tree configured ([[aiter.trees]] or --package-dir)")
        return EXIT_ERROR
    missing = [t.package_dir for t in settings.aiter.trees if not t.package_dir.is_dir()]
    for folder in missing:  # said once, not once per table the missing folder would hold
        console.error(f"aiter package folder {folder} does not exist or is not a folder")
    if missing:
        return EXIT_ERROR
    mon = monitor.AiterMonitor(settings, log_findings=False)  # the report says them all
    verb = args.aiter_verb
    if verb == "restore":
        try:
            restored, displaced = mon.restore(args.id)
        except (heal.HealFailed, OSError, routing.RoutingError) as exc:
            console.error(str(exc))
            return EXIT_ERROR
        print(f"restored quarantine {restored.id}: {', '.join(restored.modules)}", file=shown)
        if not restored.verified:
            print(
                "  its manifest was not verified as this daemon's (from 0.1.0, or changed "
                "since): only the module files it names were moved",
                file=shown,
            )
        if displaced is not None:
            print(f"what stood in its place is in quarantine {displaced.id}", file=shown)
        return EXIT_OK
    report = mon.check(heal=verb == "heal")
    if report.errors and not report.plans:
        for err in report.errors:
            console.error(str(err))
        return EXIT_ERROR
    if verb == "explain":
        from hal0_reconciler.aiter import explain  # noqa: PLC0415 - only this verb uses it

        return explain.with_tree(args.text, report, mon, shown)
    unreadable = {s.name: s.error for s in mon.surveyor.last_slots if s.error is not None}
    if verb == "plan" and args.json:
        json.dump({**_jsonable(report), "slots_unreadable": unreadable}, out, indent=1)
        out.write("\n")
    else:
        for name, error in unreadable.items():
            print(f"! slot {name} unreadable, its environment is not checked: {error}", file=shown)
        _print_report(report, shown)
    if (
        report.errors
        or report.fatal_boots
        or report.not_converging
        or report.needs_operator
        or report.modules_not_checked
        or not all(p.checked for p in report.plans)
    ):
        return EXIT_ERROR  # could not be checked, or only a person can fix it: not "nothing to do"
    if report.heal_pending or report.retry_soon:
        return EXIT_PENDING
    return EXIT_OK


def _effective(args: argparse.Namespace, settings: Settings) -> Settings:
    cfg = settings.aiter
    if args.routing_file is not None:
        cfg = dataclasses.replace(cfg, routing_file=args.routing_file)
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {item!r} is not KEY=VALUE")
        env[key] = value
    if args.package_dir is not None:
        tree = AiterTree(
            package_dir=args.package_dir,
            jit_dir=args.jit_dir,
            target=args.target or "auto",
            base_env=env,
            slot_envs=not args.no_slots,
        )
        cfg = dataclasses.replace(cfg, trees=(tree,))
    elif args.jit_dir or args.target or env or args.no_slots:
        cfg = dataclasses.replace(
            cfg,
            trees=tuple(
                dataclasses.replace(
                    t,
                    jit_dir=args.jit_dir or t.jit_dir,
                    target=args.target or t.target,
                    base_env={**t.base_env, **env},
                    slot_envs=t.slot_envs and not args.no_slots,
                )
                for t in cfg.trees
            ),
        )
    return dataclasses.replace(settings, aiter=cfg)


def _print_report(report: monitor.MonitorReport, out: TextIO) -> None:
    said: set[str] = set()
    for p in report.plans:
        print(f"== {p.tree} [{p.environment}] target {p.target}, jit {p.jit_dir}", file=out)
        print(f"  {p.rules}", file=out)
        if p.handled_as:
            print(f"  files handled as {p.handled_as}", file=out)
        if p.rules_note and p.rules_note not in said:
            said.add(p.rules_note)
            print(f"  ! {p.rules_note}", file=out)
        for problem in p.problems:
            print(f"  {'!! BOOT DIES:' if problem in p.fatal else '!'} {problem}", file=out)
        for note in p.notes:
            print(f"  ~ {note}", file=out)
        for res in p.resolutions:
            for f in res.files:
                if res.route.compiled:
                    flag = "" if f.exists else " (missing)"
                    print(f"  table {f.path} [{f.origin}]{flag}", file=out)
        told: set[str] = set()
        for src in p.sources:
            if str(src.file.path) in told:  # one file read for two modules (ck and opus rows)
                continue
            told.add(str(src.file.path))
            if src.file.origin is resolve.Origin.FIXED and src.table is not None:
                feeds = ", ".join(sorted(set(src.route.modules.values())))
                print(f"  table {src.file.path} [{src.file.origin} -> {feeds}]", file=out)
            if src.error is not None:
                print(f"  ! table {src.file.path} unreadable: {src.error}", file=out)
            elif src.table is not None and src.table.quirks:
                print(f"  ~ table {src.file.path}: {'; '.join(src.table.quirks)}", file=out)
        for m in p.modules:
            print(f"  {m.module}: {m.status} -> {m.action} ({m.reason})", file=out)
            for miss in m.missing[:10]:
                refs = ", ".join(f"{r.table}:{r.line}" for r in miss.refs[:3])
                print(f"      missing {miss.name}  <- {refs}", file=out)
            if len(m.missing) > 10:
                print(f"      ... and {len(m.missing) - 10} more", file=out)
            for miss in m.unbuildable[:10]:
                refs = ", ".join(f"{r.table}:{r.line}" for r in miss.refs[:3])
                print(f"      not compiled for this target {miss.name}  <- {refs}", file=out)
            if len(m.unbuildable) > 10:
                print(f"      ... and {len(m.unbuildable) - 10} more", file=out)
            for bad in m.broken[:10]:
                print(f"      broken row {bad.table}:{bad.line}: {bad.reason}", file=out)
            if len(m.broken) > 10:
                print(f"      ... and {len(m.broken) - 10} more", file=out)
    for h in report.heals:
        if h.quarantine:
            print(
                f"healed {h.jit_dir}: {', '.join(h.modules)} -> quarantine {h.quarantine} "
                f"(restore with: hal0-reconciler aiter restore {h.quarantine})",
                file=out,
            )
            for path, who in h.still_mapped.items():
                print(f"  {path} is still mapped by {'; '.join(who)}: restart them", file=out)
        elif h.refused:
            print(f"heal refused in {h.jit_dir}, a build runs: {'; '.join(h.refused)}", file=out)
        elif h.error:
            print(f"heal FAILED in {h.jit_dir}: {h.error}", file=out)


def _jsonable(report: monitor.MonitorReport) -> dict[str, Any]:
    def conv(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: conv(getattr(value, f.name))
                for f in dataclasses.fields(value)
                if not isinstance(getattr(value, f.name), tables.Table)  # rows: too many
            }
        if isinstance(value, tuple | list):
            return [conv(v) for v in value]
        if isinstance(value, dict):
            return {str(k): conv(v) for k, v in value.items()}
        if isinstance(value, str | int | float | bool) or value is None:
            return value
        return str(value)

    return {
        "heal_pending": report.heal_pending,
        "not_converging": report.not_converging,
        "fatal_boots": list(report.fatal_boots),
        "plans": [conv(p) for p in report.plans],
        "heals": [conv(h) for h in report.heals],
        "errors": list(report.errors),
    }
