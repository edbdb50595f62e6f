"""Read constants out of hal0's Python source without importing it.  [pure]

hal0 keeps its image sets in code (``hal0/config/schema.py``) and its runner table in
``hal0/runners/__init__.py``. Importing hal0 would run its code (and need its dependencies), so
the module is parsed with :mod:`ast` and only these shapes are understood, at module level:

- a string: a literal, a name of a string defined earlier, an f-string or ``+`` of those;
- a set: ``frozenset({...})`` / ``frozenset([...])`` / ``frozenset((...))`` / ``frozenset()``,
  a set literal, a name of a set defined earlier, or ``|`` of those, each element a string;
- the runner table: ``RUNNER_IMAGES = {"key": Runner("key", <image>, ..., <manifest_key>)}``
  (image second, manifest key seventh, or as keywords), and ``RUNNER_ALIASES = {"a": "b"}``.

- 1.4+'s runner table: the keys of ``RUNNER_IMAGES`` and each ``Runner``'s
  ``supported_backends`` (a keyword, or the sixth argument), a tuple or list of literals.

Anything else in a value that is asked for raises :class:`Hal0CodeError` naming the line and
what was found: never a guess. A text with more structure than hal0's real modules have (more
than :data:`MAX_STRUCTURE` newlines, separators and operators: ~10x the largest) is refused
before it is parsed, so a hostile 4 MiB module costs one linear count, not gigabytes of tree.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from dataclasses import dataclass

_RUNNER_IMAGE_ARG = 1  # Runner(key, image, family, supports, device_class, backend, manifest_key)
_RUNNER_MANIFEST_ARG = 6
_RUNNER_BACKENDS_ARG = 5  # 1.4+: Runner(key, family, supports, device_class, backend, supported)
MAX_STRUCTURE = 100_000  # hal0's largest module (updater.py, ~200 KB) has ~22k
_STRUCTURE = "\n;,()[]{}=+-*/%|&^<>.:@~"


class Hal0CodeError(Exception):
    """A part of hal0's source that this parser does not understand (the message says which)."""


@dataclass(frozen=True)
class Runners:
    """The runner table read from hal0's code: bundled images, manifest keys, aliases."""

    images: dict[str, str]  # runner key -> bundled image
    manifest_keys: dict[str, str]  # runner key -> manifest key (runners that have one)
    aliases: dict[str, str]
    problems: tuple[str, ...] = ()  # entries that were not understood (and are left out)


def module_values(
    text: str, *, wanted: tuple[str, ...] = (), imported: Mapping[str, str] | None = None
) -> tuple[dict[str, str | frozenset[str]], dict[str, str]]:
    """The module-level strings and sets of ``text``, and why each name of ``wanted`` that is
    assigned but not understood was not (its line and what was found there).

    ``imported`` gives values for names the module imports from elsewhere (the runner table
    names images defined in ``schema.py``). Raises Hal0CodeError when ``text`` is not Python.
    """
    tree = _parse(text)
    values: dict[str, str | frozenset[str]] = dict(imported or {})
    errors: dict[str, str] = {}
    for node in tree.body:
        target, value = _assignment(node)
        if target is None or value is None:
            continue
        try:
            values[target] = _value(value, values)
        except Hal0CodeError as exc:
            values.pop(target, None)  # a later use of it is then "not understood", not stale
            if target in wanted:
                errors[target] = f"line {node.lineno}: {target}: {exc}"
        else:
            errors.pop(target, None)
    return values, errors


def runners(text: str, *, imported: Mapping[str, str]) -> Runners:
    """``RUNNER_IMAGES`` and ``RUNNER_ALIASES`` of ``hal0/runners/__init__.py``."""
    values, _ = module_values(text, imported=imported)
    tree = _parse(text)
    table: ast.expr | None = None
    aliases_node: ast.expr | None = None
    for node in tree.body:
        target, value = _assignment(node)
        if target == "RUNNER_IMAGES":
            table = value
        elif target == "RUNNER_ALIASES":
            aliases_node = value
    if table is None:
        raise Hal0CodeError("RUNNER_IMAGES is not defined")
    if not isinstance(table, ast.Dict):
        raise Hal0CodeError(f"line {table.lineno}: RUNNER_IMAGES is {_shape(table)}, not a dict")
    images: dict[str, str] = {}
    manifest_keys: dict[str, str] = {}
    problems: list[str] = []
    for key_node, entry in zip(table.keys, table.values, strict=True):
        key = _string(key_node, values) if key_node is not None else None
        if key is None:
            problems.append(f"line {entry.lineno}: RUNNER_IMAGES has a key that is not a string")
            continue
        try:
            image, manifest_key = _runner_entry(key, entry, values)
        except Hal0CodeError as exc:
            problems.append(str(exc))
            continue
        images[key] = image
        if manifest_key is not None:
            manifest_keys[key] = manifest_key
    aliases: dict[str, str] = {}
    if aliases_node is not None:
        if not isinstance(aliases_node, ast.Dict):
            what = _shape(aliases_node)
            raise Hal0CodeError(f"line {aliases_node.lineno}: RUNNER_ALIASES is {what}")
        for k, v in zip(aliases_node.keys, aliases_node.values, strict=True):
            alias = _string(k, values) if k is not None else None
            canon = _string(v, values)
            if alias is None or canon is None:
                raise Hal0CodeError(f"line {v.lineno}: RUNNER_ALIASES holds {_shape(v)}")
            aliases[alias] = canon
    return Runners(images, manifest_keys, aliases, tuple(problems))


def runner_backends(text: str) -> dict[str, tuple[str, ...]]:
    """1.4+'s ``RUNNER_IMAGES``: each runner key and its ``supported_backends``."""
    table: ast.expr | None = None
    for node in _parse(text).body:
        target, value = _assignment(node)
        if target == "RUNNER_IMAGES":
            table = value
    if table is None:
        raise Hal0CodeError("RUNNER_IMAGES is not defined")
    if not isinstance(table, ast.Dict):
        raise Hal0CodeError(f"line {table.lineno}: RUNNER_IMAGES is {_shape(table)}, not a dict")
    out: dict[str, tuple[str, ...]] = {}
    for key_node, entry in zip(table.keys, table.values, strict=True):
        key = _string(key_node, {}) if key_node is not None else None
        if key is None:
            raise Hal0CodeError(
                f"line {entry.lineno}: RUNNER_IMAGES has a key that is not a string"
            )
        out[key] = _backends(key, entry)
    return out


@dataclass(frozen=True)
class _RunnerCall:
    """One ``Runner(...)`` of the runner table, and where it stands (for messages)."""

    where: str
    call: ast.Call
    keywords: Mapping[str, ast.expr]

    def arg(self, name: str, position: int) -> ast.expr | None:
        """The argument given by keyword, else at its position (None: not given)."""
        node = self.keywords.get(name)
        if node is None and len(self.call.args) > position:
            node = self.call.args[position]
        return node


def _runner_call(key: str, entry: ast.expr) -> _RunnerCall:
    where = f"line {entry.lineno}: RUNNER_IMAGES[{key!r}]"
    if not (isinstance(entry, ast.Call) and isinstance(entry.func, ast.Name)):
        raise Hal0CodeError(f"{where} is {_shape(entry)}, not Runner(...)")
    keywords = {kw.arg: kw.value for kw in entry.keywords if kw.arg is not None}
    return _RunnerCall(where, entry, keywords)


def _backends(key: str, entry: ast.expr) -> tuple[str, ...]:
    runner = _runner_call(key, entry)
    where = runner.where
    node = runner.arg("supported_backends", _RUNNER_BACKENDS_ARG)
    if node is None:
        return ()  # the dataclass default: backend-agnostic
    if not isinstance(node, ast.Tuple | ast.List):
        raise Hal0CodeError(f"{where}: supported_backends is {_shape(node)}")
    found: list[str] = []
    for element in node.elts:
        if not (isinstance(element, ast.Constant) and isinstance(element.value, str)):
            raise Hal0CodeError(f"{where}: supported_backends holds {_shape(element)}")
        found.append(element.value)
    return tuple(found)


def top_level_functions(text: str, *, mentioning: str | None = None) -> frozenset[str]:
    """The names of the functions ``text`` defines at module level (with ``mentioning``: only
    those whose body holds that string constant)."""
    return frozenset(
        node.name
        for node in _parse(text).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (
            mentioning is None
            or any(isinstance(n, ast.Constant) and n.value == mentioning for n in ast.walk(node))
        )
    )


def imported_names(text: str, module: str) -> tuple[str, ...]:
    """The names ``text`` imports from ``module`` (``from hal0.config.schema import ...``)."""
    names: list[str] = []
    for node in _parse(text).body:
        if isinstance(node, ast.ImportFrom) and node.module == module:
            names += [alias.asname or alias.name for alias in node.names if alias.name != "*"]
    return tuple(names)


# -- shapes ----------------------------------------------------------------------------------------
def tree(text: str) -> ast.Module:
    """The module's tree, kept like every other question's (refused as they are)."""
    return _parse(text)


def forget() -> None:
    """Drop the trees kept while one set of hal0's files is read (call when done)."""
    _parse.cache_clear()


@functools.lru_cache(maxsize=2)
def _parse(text: str) -> ast.Module:
    """The module's tree (never changed by a reader: kept for the next question about the
    same text, until :func:`forget`); refused above the structure cap."""
    structure = sum(text.count(c) for c in _STRUCTURE)
    if structure > MAX_STRUCTURE:
        raise Hal0CodeError(
            f"refused unparsed: {structure} lines, separators and operators, more than any "
            f"hal0 module has (at most {MAX_STRUCTURE} are parsed)"
        )
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise Hal0CodeError(f"not valid Python (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise Hal0CodeError(f"not readable as Python ({type(exc).__name__})") from None


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _assignment(node: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return (target.id if isinstance(target, ast.Name) else None), node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id, node.value
    return None, None


def _value(node: ast.expr, known: Mapping[str, str | frozenset[str]]) -> str | frozenset[str]:
    text = _string(node, known)
    if text is not None:
        return text
    members = _set(node, known)
    if members is not None:
        return members
    raise Hal0CodeError(f"{_shape(node)} is neither a string nor a frozenset of strings")


def _string(node: ast.expr, known: Mapping[str, str | frozenset[str]]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        value = known.get(node.id)
        return value if isinstance(value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left, known), _string(node.right, known)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts: list[str] = []
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                if part.conversion != -1 or part.format_spec is not None:
                    return None
                inner = _string(part.value, known)
            else:
                inner = _string(part, known)
            if inner is None:
                return None
            parts.append(inner)
        return "".join(parts)
    return None


def _set(node: ast.expr, known: Mapping[str, str | frozenset[str]]) -> frozenset[str] | None:
    if isinstance(node, ast.Name):
        value = known.get(node.id)
        return value if isinstance(value, frozenset) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _set(node.left, known), _set(node.right, known)
        return left | right if left is not None and right is not None else None
    if isinstance(node, ast.Set):
        return _members(node.elts, known)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "frozenset"
        and not node.keywords
    ):
        if not node.args:
            return frozenset()
        if len(node.args) == 1 and isinstance(node.args[0], ast.Set | ast.List | ast.Tuple):
            return _members(node.args[0].elts, known)
        if len(node.args) == 1:
            return _set(node.args[0], known)
    return None


def _members(
    elements: list[ast.expr], known: Mapping[str, str | frozenset[str]]
) -> frozenset[str] | None:
    members: set[str] = set()
    for element in elements:
        text = _string(element, known)
        if text is None:
            raise Hal0CodeError(f"a member at line {element.lineno} is {_shape(element)}")
        members.add(text)
    return frozenset(members)


def _runner_entry(
    key: str, entry: ast.expr, known: Mapping[str, str | frozenset[str]]
) -> tuple[str, str | None]:
    runner = _runner_call(key, entry)
    where = runner.where
    image_node = runner.arg("image", _RUNNER_IMAGE_ARG)
    image = _string(image_node, known) if image_node is not None else None
    if image is None:
        found = _shape(image_node) if image_node is not None else "nothing"
        raise Hal0CodeError(f"{where}: its image is {found}, not a string")
    manifest_node = runner.arg("manifest_key", _RUNNER_MANIFEST_ARG)
    if manifest_node is None or (
        isinstance(manifest_node, ast.Constant) and manifest_node.value is None
    ):
        return image, None
    manifest_key = _string(manifest_node, known)
    if manifest_key is None:
        raise Hal0CodeError(f"{where}: its manifest key is {_shape(manifest_node)}")
    return image, manifest_key


def _shape(node: ast.expr) -> str:
    """What a node is, for a message: its kind and (a short) source text."""
    source = ast.unparse(node)
    if len(source) > 60:
        source = source[:57] + "..."
    return f"{type(node).__name__.lower()} `{source}`"
