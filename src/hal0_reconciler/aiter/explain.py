"""``aiter explain``: what a crashed server's registry-miss message means, with or without a tree.

Without a tree, only the text speaks: the module comes from the message's own source or the
kernel-name prefix (routing data ``prefixes``), and an opus ``Kernel id N not found`` message
names ``module_deepgemm_opus``. With a tree, the rows that reference the kernel, the module on
disk, the target and what heal would do are added. aiter's own one-boot lever,
``AITER_REBUILD=1``, is named either way.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import TextIO

from hal0_reconciler import boundedread, console
from hal0_reconciler.aiter import monitor, survey
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import rows as tables
from hal0_reconciler.settings import Settings

EXIT_OK, EXIT_ERROR = 0, 1
_KERNEL = re.compile(r"(?:(\w+) )?kernel '([^']*)' is not present in the compiled registry")
_KERNEL_ID = re.compile(
    r"Kernel id (-?\d+) not found in (\w+) (\w+) tune lookup table(?: \((gfx\w+)\))?"
)
_TABLE = re.compile(r"aiter/configs/([\w./-]+\.csv)")
REBUILD_LEVER = (
    "aiter's own lever for one boot: AITER_REBUILD=1 in the server's environment rebuilds each "
    "module once in that process (2 keeps the build folder, whose stale generated sources can "
    "be compiled again)"
)


@dataclasses.dataclass(frozen=True)
class _Miss:
    """What a crash message says: a kernel name or a kernel id, and the module(s) it names."""

    kernel: str
    modules: tuple[str, ...]
    source: str  # what in the text named the module(s)
    table_hint: str | None = None


def _read_miss(text: str, rules: routing.Routing) -> _Miss | None:
    by_id = _KERNEL_ID.search(text)
    if by_id is not None:
        opus = tuple(r.module for r in rules.registries) or ("module_deepgemm_opus",)
        where = f"{by_id[2]} {by_id[3]} lookup table" + (f" ({by_id[4]})" if by_id[4] else "")
        return _Miss(by_id[1], opus, f"'Kernel id ... not found in {where}'")
    by_name = _KERNEL.search(text)
    if by_name is None:
        return None
    raiser, kernel = by_name[1], by_name[2]
    hint = _TABLE.search(text)
    modules: tuple[str, ...] = ()
    source = f"the kernel-name prefix of {kernel!r}"
    if raiser and raiser.startswith("gemm_"):
        modules = rules.prefixes.get(raiser.removeprefix("gemm_") + "_", ())
        source = f"the message's source {raiser!r}"
    if not modules:
        modules = rules.modules_for_name(kernel)
        source = f"the kernel-name prefix of {kernel!r}"
    return _Miss(kernel, modules, source, hint[1] if hint else None)


def without_tree(text: str, settings: Settings, out: TextIO) -> int:
    """Only the error text: name the module(s) from the text itself, say what a tree adds."""
    try:
        rules = routing.parse_routing(survey.routing_text(settings))
    except (OSError, routing.RoutingError) as exc:
        console.error(f"routing data: {exc}")
        return EXIT_ERROR
    miss = _read_miss(text, rules)
    if miss is None:
        console.error(_NO_MARKER)
        return EXIT_ERROR
    _print_miss(miss, out)
    if not miss.modules:
        print("  no module is known for this name (routing data: prefixes)", file=out)
    print(
        "  without an aiter tree this is all the text says. With --package-dir "
        "<site-packages>/aiter (and the server's AITER_*, GPU_ARCHS, CU_NUM as --env) explain "
        "also names the table rows that reference it, whether the module on disk registers "
        "it, the target the rows are for, and what heal would do",
        file=out,
    )
    print(f"  {REBUILD_LEVER}", file=out)
    return EXIT_OK if miss.modules else EXIT_ERROR


_NO_MARKER = (
    "the text holds neither \"kernel '...' is not present in the compiled registry\" "
    'nor "Kernel id N not found in ... tune lookup table"'
)


def _print_miss(miss: _Miss, out: TextIO) -> None:
    opus = miss.kernel.lstrip("-").isdigit()
    print(f"kernel {'id ' if opus else ''}{miss.kernel}", file=out)
    if miss.modules:
        alternatives = " or ".join(miss.modules)
        print(f"  module {alternatives} (from {miss.source})", file=out)
    if len(miss.modules) > 1:
        print(
            "  the same source is compiled into each of these modules, and its message names "
            "the same table for all of them: only the tables (a tree) tell which one",
            file=out,
        )
    if miss.table_hint:
        print(f"  the message names table {miss.table_hint}", file=out)
    if opus:
        print(
            "  opus kernels are registered by integer id, so whether a module holds an id "
            "cannot be verified from the file. If the tables are newer than the module, a "
            "rebuild from them adds the id; if this aiter's opus generator does not know the id "
            "(e.g. a flatmm id from an older tuning run), no rebuild adds it: re-tune the shape "
            "or delete the row",
            file=out,
        )


def with_tree(
    text: str, report: monitor.MonitorReport, mon: monitor.AiterMonitor, out: TextIO
) -> int:
    try:
        rules = mon.routing()
    except (OSError, routing.RoutingError):
        rules = routing.Routing("", ())
    miss = _read_miss(text, rules)
    if miss is None:
        console.error(_NO_MARKER)
        return EXIT_ERROR
    _print_miss(miss, out)
    found = False
    for p in report.plans:
        refs = [
            (src, row)
            for src in p.sources
            if src.table is not None
            for row in src.table.rows
            if row.name == miss.kernel and (not miss.modules or row.module in miss.modules)
        ]
        if not refs:
            continue
        found = True
        print(f"== {p.tree} [{p.environment}] target {p.target}", file=out)
        for module in dict.fromkeys(row.module for _, row in refs):
            _explain_module(module, miss.kernel, refs, p, rules=rules, out=out)
    if not found:
        print(
            "  no table a boot from the configured environments loads names it for the "
            "target; the crashed server's environment may differ (check its AITER_CONFIG_* "
            "and GPU_ARCHS)",
            file=out,
        )
        print(f"  {REBUILD_LEVER}", file=out)
        return EXIT_ERROR
    print(f"  {REBUILD_LEVER}", file=out)
    return EXIT_OK


def _sidecar_hint(
    reg: routing.IdRegistry | None, kernel: str, p: plan.EnvPlan, out: TextIO
) -> None:
    """What the last code generation of an id-keyed module says it compiled: a hint only."""
    if reg is None or not reg.sidecar or p.jit_dir is None:
        return
    path = Path(p.jit_dir) / reg.sidecar
    try:  # never through a final link, never a FIFO, capped
        data = boundedread.read_bounded(path, max_bytes=1 << 20)
        ids = {str(int(x)) for x in json.loads(data or b"")}
    except (boundedread.ReadRefused, ValueError, TypeError):
        return
    listed = "listed" if kernel in ids else "did NOT list"
    print(
        f"  the last code generation {listed} id {kernel} in {path} (a hint, not proof: tuners "
        "add ids to that list before a rebuild)",
        file=out,
    )


def _explain_module(
    module: str,
    kernel: str,
    refs: list[tuple[plan.TableSource, tables.KernelRow]],
    p: plan.EnvPlan,
    *,
    rules: routing.Routing,
    out: TextIO,
) -> None:
    print(f"  module {module}", file=out)
    for src, row in [r for r in refs if r[1].module == module][:20]:
        target = f" [row for {row.gfx or '*'}:{row.cu_num if row.cu_num is not None else '*'}]"
        print(f"  named by {src.file.path}:{row.line} ({src.file.origin}){target}", file=out)
    mod = next((m for m in p.modules if m.module == module), None)
    if mod is None:
        return
    unbuildable = any(m.name == kernel for m in mod.unbuildable)
    if mod.keyed is routing.Keyed.ID or mod.status is plan.Status.UNVERIFIABLE:
        print(f"  {mod.so_path}: {mod.reason}", file=out)
        reg = next((r for r in rules.registries if r.module == module), None)
        _sidecar_hint(reg, kernel, p, out)
    elif mod.status is plan.Status.NOT_BUILT:
        print(f"  {mod.so_path} is not built: aiter builds it from these tables", file=out)
    else:
        has = all(m.name != kernel for m in (*mod.missing, *mod.unbuildable))
        print(f"  {mod.so_path} {'registers' if has else 'does NOT register'} it", file=out)
    if unbuildable:
        print(
            "  these rows are for a target the build does not compile: no rebuild adds it "
            "(see the target line of `aiter plan`: set CU_NUM, or unset GPU_ARCHS)",
            file=out,
        )
    heal_says = {
        plan.Action.HEAL: f"heal would quarantine {mod.module}.so and build/{mod.module}/ "
        "so aiter rebuilds it from the current tables (restore puts them back)",
        plan.Action.WARN: "heal leaves it alone (shape-keyed: not verifiable)",
        plan.Action.STUCK: f"heal will not act again: {mod.reason}",
        plan.Action.HELD: f"heal leaves it alone: {mod.reason}",
        plan.Action.OPERATOR: "heal leaves it alone: no rebuild fixes these rows "
        f"({mod.reason}); fix or delete the rows, or the environment",
        plan.Action.NONE: "heal has nothing to do",
    }[mod.action]
    print(f"  {heal_says}", file=out)
