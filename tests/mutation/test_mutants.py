"""The mutation tool's own mutants: each kind made, each a one-segment change that compiles."""

from __future__ import annotations

import ast

from mutation.mutants import mutants_of

SOURCE = b'''"""Module docstring: never mutated."""

def f(a: int, b: int = 3) -> bool:
    """Docstring."""
    if a < b and b:
        raise ValueError(f"{a} < {b}")
    log(a)
    self.x = a
    return a in (1, 2)
'''


def test_every_kind_is_made_and_each_changes_one_segment() -> None:
    """Flipped comparison, and/or, negation, removed statements, changed return and constant;
    nothing from docstrings, annotations or f-strings; every mutant parses."""
    found = list(mutants_of("m.py", SOURCE))
    kinds = {m.kind for m in found}
    assert {"compare", "boolop", "remove", "return", "constant"} <= kinds
    descriptions = {m.description for m in found}
    assert "a < b -> a >= b" in descriptions
    assert "a < b and b -> a < b or b" in descriptions
    assert "remove `log(a)`" in descriptions
    assert "remove `self.x = a`" in descriptions
    assert "3 -> 4" in descriptions  # a default value
    assert all("Docstring" not in m.description for m in found)
    assert all("{a}" not in m.replacement for m in found)  # f-string internals untouched
    for m in found:
        mutated = m.apply(SOURCE)
        ast.parse(mutated)
        assert SOURCE[: m.start] == mutated[: m.start]
        assert SOURCE[m.end :] == mutated[len(mutated) - (len(SOURCE) - m.end) :]


def test_a_condition_that_is_one_comparison_is_not_also_negated() -> None:
    """`if a < b` flipped is `a >= b`; a separate `not (a < b)` would be the same mutant."""
    found = list(mutants_of("m.py", b"if a < b:\n    g()\n"))
    assert ["compare", "remove"] == sorted(m.kind for m in found)


def test_the_equivalent_list_is_whole_entries_each_with_its_reason() -> None:
    """equivalent.toml is merged as a union of lines (.gitattributes): a merge that glued two
    entries into one (a lost ``[[equivalent]]``) no longer parses, or an entry lacks a field;
    either would silently count a mutant as killed or survived wrongly."""
    import tomllib
    from pathlib import Path

    path = Path(__file__).with_name("equivalent.toml")
    text = path.read_text(encoding="utf-8")
    entries = tomllib.loads(text)["equivalent"]
    assert text.count("[[equivalent]]") == len(entries), "an entry was glued to another"
    fields = {"module", "line", "mutation", "reason"}
    broken = [e for e in entries if not fields <= set(e) or not set(e) <= fields | {"above"}]
    assert [] == broken, f"entries without module, line, mutation and reason: {broken}"
