"""Tables → libtype → module, from routing data (TOML text).                              [pure]

The data ships as ``routing.toml`` in this package; an operator may replace it. This module only
parses text: reading the file is the caller's job.
"""

from __future__ import annotations

import enum
import tomllib
from dataclasses import dataclass, field
from typing import Any

from hal0_reconciler.errors import ReconcilerError

NO_LIBTYPE = "-"
"""The routing key for rows without a libtype (no column, or an empty value)."""

ASM_PREFIX = "_ZN"
"""Without a libtype, a name starting with this is an asm kernel (a ``.co`` file): skipped."""


class RoutingError(ReconcilerError):
    """The routing data is malformed (names the key)."""


class Keyed(enum.StrEnum):
    """How the runtime finds a kernel: by name (a miss crashes) or by shape (a miss falls back)."""

    NAME = "name"
    SHAPE = "shape"
    ID = "id"  # an integer id (opus): kept as a number in a lookup table, not as a string


@dataclass(frozen=True)
class IdRegistry:
    """A module keyed by integer id (``module_deepgemm_opus``), fed by rows of one libtype from
    the tables a boot resolves (``tables``) and from fixed files under ``configs/`` (``files``,
    globs, whatever the variables say)."""

    module: str
    route: TableRoute  # reads the ids: keyed ID, columns = the id columns, modules = {libtype}
    tables: tuple[str, ...]
    files: tuple[str, ...]
    sidecar: str = ""  # JSON list of the ids the last code generation compiled (a hint only)


@dataclass(frozen=True)
class TableRoute:
    """One tuned table: its variable, stem, name columns and where its rows are compiled."""

    stem: str
    variable: str
    keyed: Keyed
    columns: tuple[str, ...]
    modules: dict[str, str]  # libtype (or NO_LIBTYPE) -> module name

    def module_for(self, libtype: str | None, name: str) -> str | None:
        """The module a row compiles into, or None when the row is never compiled into one."""
        lib = (libtype or "").strip()
        if not lib:
            if name.startswith(ASM_PREFIX):
                return None
            return self.modules.get(NO_LIBTYPE)
        return self.modules.get(lib)

    @property
    def compiled(self) -> bool:
        """Whether any of this table's rows can land in a ``module_*.so``."""
        return bool(self.modules)


@dataclass(frozen=True)
class Routing:
    """The routing for one aiter version."""

    version: str
    tables: tuple[TableRoute, ...]
    registries: tuple[IdRegistry, ...] = ()
    prefixes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kernel-name prefix

    def modules_for_name(self, kernel: str) -> tuple[str, ...]:
        """The modules a kernel name can belong to, by its longest known prefix."""
        best = max((p for p in self.prefixes if kernel.startswith(p)), key=len, default=None)
        return self.prefixes[best] if best is not None else ()

    def by_module(self, module: str) -> tuple[TableRoute, ...]:
        return tuple(
            t
            for t in (*self.tables, *(r.route for r in self.registries))
            if module in t.modules.values()
        )


def parse_routing(text: str, *, version: str = "") -> Routing:
    """The routing for ``version`` (empty: the data's ``default``). Raises RoutingError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RoutingError(f"routing data is not valid TOML: {exc}") from None
    chosen = version or data.get("default", "")
    versions = data.get("versions", {})
    if not isinstance(versions, dict) or chosen not in versions:
        known = ", ".join(sorted(versions)) if isinstance(versions, dict) else ""
        raise RoutingError(f"routing data has no version {chosen!r} (known: {known or 'none'})")
    tables = versions[chosen].get("tables", {})
    if not isinstance(tables, dict) or not tables:
        raise RoutingError(f"routing version {chosen!r} lists no tables")
    routes = tuple(
        _route(stem, raw, where=f"versions.{chosen}.tables.{stem}") for stem, raw in tables.items()
    )
    raw_regs = versions[chosen].get("registries", {})
    if not isinstance(raw_regs, dict):
        raise RoutingError(f"versions.{chosen}.registries must be a table")
    registries = tuple(
        _registry(module, raw, {r.stem for r in routes}, where=f"versions.{chosen}.registries")
        for module, raw in raw_regs.items()
    )
    raw_prefixes = versions[chosen].get("prefixes", {})
    if not isinstance(raw_prefixes, dict) or not all(
        isinstance(v, list) and v and all(isinstance(m, str) and m.startswith("module_") for m in v)
        for v in raw_prefixes.values()
    ):
        raise RoutingError(f"versions.{chosen}.prefixes must map a prefix to module_* names")
    return Routing(
        version=chosen,
        tables=routes,
        registries=registries,
        prefixes={str(k): tuple(v) for k, v in raw_prefixes.items()},
    )


def _registry(module: str, raw: Any, stems: set[str], *, where: str) -> IdRegistry:
    where = f"{where}.{module}"
    if not isinstance(raw, dict) or not module.startswith("module_"):
        raise RoutingError(f"{where} must be a table named after a module_* name")
    unknown = set(raw) - {"libtype", "columns", "tables", "files", "sidecar"}
    if unknown:
        raise RoutingError(f"{where}: unknown key {min(unknown)!r}")
    libtype = raw.get("libtype")
    if not isinstance(libtype, str) or not libtype:
        raise RoutingError(f"{where}.libtype must name the libtype of its rows")
    lists = {}
    for key in ("columns", "tables", "files"):
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise RoutingError(f"{where}.{key} must be a list of strings")
        lists[key] = tuple(value)
    if not lists["columns"]:
        raise RoutingError(f"{where}.columns must name the id column(s)")
    unknown_tables = set(lists["tables"]) - stems
    if unknown_tables:
        raise RoutingError(f"{where}.tables: {min(unknown_tables)!r} is not a table")
    if any(f.startswith("/") or ".." in f.split("/") for f in lists["files"]):
        raise RoutingError(f"{where}.files must be relative to configs/")
    sidecar = raw.get("sidecar", "")
    if not isinstance(sidecar, str) or sidecar.startswith("/") or ".." in sidecar.split("/"):
        raise RoutingError(f"{where}.sidecar must be a path relative to the JIT folder")
    route = TableRoute(
        stem=module,
        variable="",
        keyed=Keyed.ID,
        columns=lists["columns"],
        modules={libtype: module},
    )
    return IdRegistry(module, route, lists["tables"], lists["files"], sidecar)


def _route(stem: str, raw: Any, *, where: str) -> TableRoute:
    if not isinstance(raw, dict):
        raise RoutingError(f"{where} must be a table")
    unknown = set(raw) - {"variable", "keyed", "columns", "modules"}
    if unknown:
        raise RoutingError(f"{where}: unknown key {min(unknown)!r}")
    variable = raw.get("variable")
    if not isinstance(variable, str) or not variable.startswith("AITER_"):
        raise RoutingError(f"{where}.variable must be an AITER_* variable name")
    try:
        keyed = Keyed(raw.get("keyed", "shape"))
    except ValueError:
        raise RoutingError(f"{where}.keyed must be 'name' or 'shape'") from None
    if keyed is Keyed.ID:
        raise RoutingError(f"{where}.keyed: id-keyed modules are [registries], not tables")
    columns = raw.get("columns", ["kernelName"])
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
        raise RoutingError(f"{where}.columns must be a non-empty list of column names")
    modules = raw.get("modules", {})
    if not isinstance(modules, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v.startswith("module_")
        for k, v in modules.items()
    ):
        raise RoutingError(f"{where}.modules must map libtype to a module_* name")
    return TableRoute(
        stem=stem, variable=variable, keyed=keyed, columns=tuple(columns), modules=dict(modules)
    )
