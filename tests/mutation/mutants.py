"""Single-line mutants of one Python module, made from its AST and applied to its source text.

Each mutant replaces one source segment (a comparison, a boolean operator, a condition, a
statement, a returned value or a number) and leaves every other byte of the file as it was.
Kinds:

- ``compare``: a comparison operator flipped to its negation (``<`` to ``>=``, ``in`` to
  ``not in``, ``is`` to ``is not``, ...);
- ``boolop``: ``and`` swapped for ``or`` and back;
- ``negate``: an ``if``/``while``/conditional-expression/comprehension condition negated (a
  condition that is a single comparison is left to ``compare``);
- ``remove``: a statement removed (a call, ``raise``, an assignment to an attribute or an item,
  ``+=`` and friends, ``del``, ``break``, ``continue``);
- ``return``: ``return X`` made ``return None`` (``return True``/``False`` flipped instead);
- ``constant``: a number changed (``n`` to ``n + 1``) or ``True``/``False`` flipped.

Never mutated: docstrings, annotations, decorators, anything inside an f-string (its positions are not
reliable before Python 3.12), ``assert`` statements (they only restate what the code checks).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_DESCRIPTION_WIDTH = 110


@dataclass(frozen=True)
class Mutant:
    """One change to one module's source."""

    module: str  # path relative to the package folder, e.g. ``daemon/watch.py``
    kind: str
    line: int  # 1-based line of the mutated segment's start
    source_line: str  # that line, stripped: the key (with ``description``) for exclusions
    line_above: str  # the line before it, stripped (tells apart two identical lines)
    description: str
    start: int  # byte offsets of the replaced segment in the module's UTF-8 source
    end: int
    replacement: str

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode("utf-8") + source[self.end :]

    @property
    def where(self) -> str:
        return f"{self.module}:{self.line}"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _DESCRIPTION_WIDTH else text[: _DESCRIPTION_WIDTH - 3] + "..."


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, source: bytes) -> None:
        self.module = module
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.found: list[Mutant] = []

    # -- positions -------------------------------------------------------------------------------
    def _span(self, node: ast.AST) -> tuple[int, int]:
        start = self.starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = self.starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return start, end

    def _add(self, node: ast.AST, kind: str, description: str, replacement: str) -> None:
        start, end = self._span(node)
        line = node.lineno  # type: ignore[attr-defined]
        text, above = (
            self.lines[n].decode("utf-8", errors="replace").strip() if n >= 0 else ""
            for n in (line - 1, line - 2)
        )
        description = _short(description)
        same = sum(
            1 for m in self.found if (m.line, m.description.split(" #")[0]) == (line, description)
        )
        if same:  # the same change twice on one line (two `True`s): number the later ones
            description += f" #{same + 1}"
        self.found.append(
            Mutant(self.module, kind, line, text, above, description, start, end, replacement)
        )

    # -- what is never mutated -------------------------------------------------------------------
    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # f-string internals: positions unreliable, and only message text anyway

    def visit_Assert(self, node: ast.Assert) -> None:
        return

    def visit_arg(self, node: ast.arg) -> None:
        return  # annotations

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._maybe_remove(node, any_target=[node.target])
            self.visit(node.value)

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        first = body[0] if body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            return body[1:]  # the docstring
        return body

    def visit_Module(self, node: ast.Module) -> None:
        for stmt in self._body(node.body):
            self.visit(stmt)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        for stmt in self._body(node.body):
            self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._visit_function(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for stmt in self._body(node.body):
            self.visit(stmt)

    # -- operators and conditions ----------------------------------------------------------------
    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            flipped = _FLIP[type(op)]()
            ops = [*node.ops[:i], flipped, *node.ops[i + 1 :]]
            new = ast.Compare(left=node.left, ops=ops, comparators=node.comparators)
            text = f"({ast.unparse(new)})"
            self._add(node, "compare", f"{ast.unparse(node)}  ->  {ast.unparse(new)}", text)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        new = ast.BoolOp(op=other, values=node.values)
        self._add(
            node, "boolop", f"{ast.unparse(node)}  ->  {ast.unparse(new)}", f"({ast.unparse(new)})"
        )
        self.generic_visit(node)

    def _negate(self, test: ast.expr) -> None:
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            return  # the flipped comparison is the same mutant
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            new = test.operand
        else:
            new = ast.UnaryOp(op=ast.Not(), operand=test)
        self._add(
            test, "negate", f"{ast.unparse(test)}  ->  {ast.unparse(new)}", f"({ast.unparse(new)})"
        )

    def visit_If(self, node: ast.If) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        for test in node.ifs:
            self._negate(test)
        self.generic_visit(node)

    # -- statements ------------------------------------------------------------------------------
    def _remove(self, node: ast.stmt) -> None:
        first = ast.unparse(node).splitlines()[0]
        self._add(node, "remove", f"remove `{first}`", "pass")

    def _maybe_remove(self, node: ast.stmt, *, any_target: list[ast.expr]) -> None:
        if any(isinstance(t, ast.Attribute | ast.Subscript) for t in any_target):
            self._remove(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call | ast.Await | ast.Yield | ast.YieldFrom):
            self._remove(node)
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self._remove(node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._maybe_remove(node, any_target=node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._remove(node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._remove(node)
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self._remove(node)

    def visit_Continue(self, node: ast.Continue) -> None:
        self._remove(node)

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            return
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            self.generic_visit(node)  # the constant flip is the mutant
            return
        self._add(node, "return", f"return {ast.unparse(value)}  ->  return None", "return None")
        self.generic_visit(node)

    # -- constants -------------------------------------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            new = repr(not value)
        elif isinstance(value, int | float):
            new = repr(value + 1)
        else:
            return
        self._add(node, "constant", f"{value!r}  ->  {new}", f"({new})")


def mutants_of(module: str, source: bytes) -> Iterator[Mutant]:
    """Every mutant of ``source`` that compiles and changes the module's AST, each once."""
    tree = ast.parse(source)
    original = ast.dump(tree)
    collector = _Collector(module, source)
    collector.visit(tree)
    seen = {original}
    for mutant in collector.found:
        try:
            dumped = ast.dump(ast.parse(mutant.apply(source)))
        except SyntaxError:
            continue
        if dumped in seen:
            continue
        seen.add(dumped)
        yield mutant
