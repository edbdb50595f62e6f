"""``[slots]`` in ``hal0.toml`` as the installed release's ``SlotsConfig`` judges it.  [pure]

hal0 validates the whole ``[slots]`` table with pydantic; when any key of it fails, hal0 drops
the table, and with it every ``[slots].default_images``. The fields and their simple rules are
read from the installed ``hal0/config/schema.py`` with :mod:`ast` (never imported):

- ``model_config``'s ``"extra": "forbid"`` (an unknown key is refused; else ignored);
- each field's type, ``int``, ``bool`` or ``str`` with pydantic's lax coercion (an ``int``
  takes a bool, an integral float, a decimal string such as ``" +1_000 "`` or ``"8.00"``; a
  ``bool`` takes 0/1 and ``true/false/yes/no/on/off/t/f/y/n/1/0`` in any case; a ``str`` takes
  only a string), and an ``int``'s ``ge``/``gt``/``le``/``lt`` literal bounds;
- the validators hal0 1.0-1.7 define, known by name: ``_publish_host_sane``,
  ``_network_mode_known``, ``port_range_sane``. ``default_images`` is :mod:`defaults`' job.

A field present in the file whose rule is not one of these (another type, a bound that is not a
literal, a validator of another name) cannot be judged: :func:`refusal` says so rather than
guess, and the caller keeps the file's ``default_images`` and reports it.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

IMAGES_FIELD = "default_images"  # judged by hal0_reconciler.host.hal0.defaults
_BOUNDS = ("ge", "gt", "le", "lt")
_KNOWN_VALIDATORS = {
    "_publish_host_sane": "publish_host",
    "_network_mode_known": "network_mode",
    "_default_images_known_families": IMAGES_FIELD,
}
_PORT_RANGE_VALIDATOR = "port_range_sane"
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


class Kind(StrEnum):
    INT = "int"
    BOOL = "bool"
    STR = "str"
    OTHER = "other"  # a type this module does not judge


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    readable: bool  # False: a type, bound or validator this module cannot read
    bounds: tuple[tuple[str, int], ...] = ()
    validator: str | None = None  # a known validator's name


@dataclass(frozen=True)
class Rules:
    """One release's ``SlotsConfig``."""

    fields: Mapping[str, Field]
    forbid_extra: bool
    port_range: bool  # ``port_range_sane``: port_range_end >= port_range_start
    defaults: Mapping[str, int]  # an int field's literal default (for the port range check)


class Unjudged(Exception):
    """A ``[slots]`` key whose rule is not understood (the message says which)."""


def read(tree: ast.Module) -> Rules | None:
    """The rules of ``class SlotsConfig`` in ``schema.py``'s tree (None: no such class)."""
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value.value, int)
    }
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SlotsConfig":
            return _rules(node, constants)
    return None


def _rules(cls: ast.ClassDef, constants: Mapping[str, int]) -> Rules:
    fields: dict[str, Field] = {}
    forbid = False
    port_range = False
    defaults: dict[str, int] = {}
    validators: dict[str, str | None] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and _names(stmt.targets) == ["model_config"]:
            forbid = _forbids(stmt.value)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            field = _field(stmt.target.id, stmt.annotation, stmt.value, constants)
            fields[field.name] = field
            if (default := _default(stmt.value, constants)) is not None:
                defaults[field.name] = default
        elif isinstance(stmt, ast.FunctionDef):
            for target in _validated(stmt):
                validators[target] = (
                    stmt.name if _KNOWN_VALIDATORS.get(stmt.name) == target else None
                )
            port_range = port_range or stmt.name == _PORT_RANGE_VALIDATOR
    for target, name in validators.items():
        if target in fields:
            known = name is not None and fields[target].readable
            fields[target] = Field(target, fields[target].kind, known, fields[target].bounds, name)
    return Rules(fields, forbid, port_range, defaults)


def _names(targets: list[ast.expr]) -> list[str]:
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _forbids(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict):
        for key, item in zip(value.keys, value.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "extra":
                return isinstance(item, ast.Constant) and item.value == "forbid"
    if isinstance(value, ast.Call):  # ConfigDict(extra="forbid")
        return any(
            k.arg == "extra" and isinstance(k.value, ast.Constant) and k.value.value == "forbid"
            for k in value.keywords
        )
    return False


def _field(
    name: str, annotation: ast.expr, value: ast.expr | None, consts: Mapping[str, int]
) -> Field:
    kind = {"int": Kind.INT, "bool": Kind.BOOL, "str": Kind.STR}.get(ast.unparse(annotation))
    if kind is None:
        return Field(name, Kind.OTHER, readable=False)
    bounds: list[tuple[str, int]] = []
    readable = True
    if isinstance(value, ast.Call):
        for keyword in value.keywords:
            if keyword.arg in _BOUNDS:
                bound = _int(keyword.value, consts)
                if bound is None or kind is not Kind.INT:
                    readable = False
                else:
                    bounds.append((keyword.arg, bound))
            elif keyword.arg in {"strict", "pattern", "min_length", "max_length", "multiple_of"}:
                readable = False
    return Field(name, kind, readable, tuple(bounds))


def _default(value: ast.expr | None, consts: Mapping[str, int]) -> int | None:
    if isinstance(value, ast.Call):
        for keyword in value.keywords:
            if keyword.arg == "default":
                return _int(keyword.value, consts)
    return None


def _int(node: ast.expr, consts: Mapping[str, int]) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand, consts)
        return None if inner is None else -inner
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def _validated(func: ast.FunctionDef) -> list[str]:
    """The fields a ``@field_validator("a", "b", ...)`` names."""
    for deco in func.decorator_list:
        if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "field_validator":
            return [
                a.value
                for a in deco.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
    return []


def refusal(table: Mapping[str, object], rules: Rules) -> str | None:
    """Why hal0 refuses this ``[slots]`` table apart from ``default_images`` (None: it does not).
    Raises :class:`Unjudged` for a key whose rule this module cannot read."""
    values: dict[str, object] = {}
    unjudged: list[str] = []
    for key, raw in table.items():
        field = rules.fields.get(key)
        if field is None:
            if rules.forbid_extra:
                return f"[slots] key {key!r} is not one hal0 knows"
            continue
        if key == IMAGES_FIELD:
            continue
        if not field.readable:
            unjudged.append(key)
            continue
        value, why = coerce(field.kind, raw)
        if why is not None:
            return f"[slots].{key} is {why}"
        bad = _outside(value, field.bounds)
        if bad is not None:
            return f"[slots].{key} = {value!r} is {bad}"
        why = _validator(field.validator, value)
        if why is not None:
            return f"[slots].{key} {why}"
        values[key] = value
    if rules.port_range:
        start = values.get("port_range_start", rules.defaults.get("port_range_start"))
        end = values.get("port_range_end", rules.defaults.get("port_range_end"))
        if isinstance(start, int) and isinstance(end, int) and end < start:
            return f"[slots].port_range_end ({end}) is below port_range_start ({start})"
    if unjudged:
        keys = ", ".join(unjudged)
        msg = f"[slots] {keys}: its rule in this release's SlotsConfig is not understood"
        raise Unjudged(msg)
    return None


def coerce(kind: Kind, raw: object) -> tuple[object, str | None]:
    """``raw`` as pydantic's lax mode turns it into ``kind``, or why it does not."""
    if kind is Kind.STR:
        return (raw, None) if isinstance(raw, str) else (None, f"{_what(raw)}, not a string")
    if kind is Kind.BOOL:
        return _bool(raw)
    return _integer(raw)


def _integer(raw: object) -> tuple[object, str | None]:
    if isinstance(raw, bool | int):
        return int(raw), None
    if isinstance(raw, float):
        if not math.isfinite(raw) or not raw.is_integer():
            return None, f"{raw!r}, not a whole number"
        return int(raw), None
    if isinstance(raw, str):
        text = raw.strip()
        if _INT_TEXT.fullmatch(text):
            return int(text.split(".", 1)[0].replace("_", "")), None
        return None, f"{raw!r}, not a whole number"
    return None, f"{_what(raw)}, not a whole number"


def _bool(raw: object) -> tuple[object, str | None]:
    if isinstance(raw, bool):
        return raw, None
    if isinstance(raw, int | float) and raw in {0, 1}:
        return raw == 1, None
    if isinstance(raw, str) and raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE, None
    shown = repr(raw) if isinstance(raw, int | float | str) else _what(raw)
    return None, f"{shown}, not a boolean"


def _outside(value: object, bounds: tuple[tuple[str, int], ...]) -> str | None:
    if not isinstance(value, int):  # bounds are read for int fields only
        return None
    for op, bound in bounds:
        ok = {"ge": value >= bound, "gt": value > bound, "le": value <= bound, "lt": value < bound}
        if not ok[op]:
            word = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[op]
            return f"not {word} {bound}"
    return None


def _validator(name: str | None, value: object) -> str | None:
    if name == "_publish_host_sane":
        host = str(value).strip()
        if not host:
            return "is blank"
        if any(c.isspace() for c in host) or ":" in host or "/" in host:
            return f"{host!r} is not a bare IPv4 address or host name"
    if name == "_network_mode_known" and str(value).strip() not in {"", "host"}:
        return f"{str(value).strip()!r} is not '' or 'host'"
    return None


def _what(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", list: "an array"}.get(
        type(value), "a table" if isinstance(value, dict) else f"a {type(value).__name__}"
    )
