"""Reading hal0's constants out of its source with ast: what is understood, and what is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.host.hal0 import pysource as hal0_code
from helpers.hal0_tree import ERAS, RUNNERS_TEXT, schema_text

WANTED = ("DEFAULT_ROCMFPX_IMAGE", "VULKAN_CAPABLE_IMAGE_REFS", "STALE_ROCMFPX_IMAGE_REFS")


def values(text: str) -> dict[str, str | frozenset[str]]:
    found, errors = hal0_code.module_values(text, wanted=WANTED)
    assert {} == errors
    return found


@pytest.mark.parametrize("era", list(ERAS))
def test_each_era_reads_back_as_written(era: str) -> None:
    """Every era's schema gives its default, capable set (names resolved) and stale set."""
    spec = ERAS[era]
    found = values(schema_text(spec))
    assert spec.default == found["DEFAULT_ROCMFPX_IMAGE"]
    assert frozenset({spec.fixed, *spec.extra_capable}) == found["VULKAN_CAPABLE_IMAGE_REFS"]
    assert frozenset(spec.stale) == found["STALE_ROCMFPX_IMAGE_REFS"]


SHAPES = {
    "literal": ('A = "x"', "A", "x"),
    "annotated": ('A: str = "x"', "A", "x"),
    "name": ('B = "x"\nA = B', "A", "x"),
    "f-string": ('G = "ghcr.io/h"\nA = f"{G}/img:1"', "A", "ghcr.io/h/img:1"),
    "concatenation": ('G = "ghcr.io/h"\nA = G + "/img:1"', "A", "ghcr.io/h/img:1"),
    "implicit concatenation": ('A = ("ghcr.io/h" "/img:1")', "A", "ghcr.io/h/img:1"),
    "frozenset of a set": ('B = "y"\nS = frozenset({"x", B})', "S", frozenset({"x", "y"})),
    "frozenset of a list": ('S = frozenset(["x"])', "S", frozenset({"x"})),
    "frozenset of a tuple": ('S = frozenset(("x",))', "S", frozenset({"x"})),
    "empty frozenset": ("S = frozenset()", "S", frozenset()),
    "set literal": ('S = {"x"}', "S", frozenset({"x"})),
    "union": ('T = frozenset({"x"})\nS = T | frozenset({"y"})', "S", frozenset({"x", "y"})),
    "frozenset of a name": ('T = frozenset({"x"})\nS = frozenset(T)', "S", frozenset({"x"})),
    "last assignment wins": ('A = "x"\nA = "y"', "A", "y"),
}


@pytest.mark.parametrize(("text", "name", "expected"), list(SHAPES.values()), ids=list(SHAPES))
def test_understood_shapes(text: str, name: str, expected: object) -> None:
    """Strings and sets in the shapes hal0 writes them are read exactly."""
    found, errors = hal0_code.module_values(text, wanted=(name,))
    assert {} == errors
    assert expected == found[name]


REFUSED = {
    "a call": ("A = build()", "call `build()`"),
    "a member that is a call": ('S = frozenset({"x", make()})', "call `make()`"),
    "an undefined name": ("S = frozenset({NOWHERE})", "name `NOWHERE`"),
    "a number": ("A = 3", "constant `3`"),
    "a formatted f-string": ('B = "x"\nA = f"{B!r}"', "joinedstr"),
    "a dict": ('A = {"a": "b"}', "dict"),
    "a name of something not understood": ("B = build()\nA = B", "name `B`"),
    "reassigned to something not understood": ('A = "x"\nA = build()', "call `build()`"),
}


@pytest.mark.parametrize(("text", "shown"), list(REFUSED.values()), ids=list(REFUSED))
def test_shapes_not_understood_are_named_never_guessed(text: str, shown: str) -> None:
    """A wanted value in a shape the parser does not know is a specific error (line and text)."""
    name = text.splitlines()[-1].split("=")[0].strip()
    found, errors = hal0_code.module_values(text, wanted=(name,))
    assert name not in found
    assert f"line {len(text.splitlines())}: {name}:" in errors[name]
    assert shown in errors[name]


def test_unwanted_names_that_are_not_understood_are_ignored() -> None:
    """Only the constants asked for must be understood; hal0's other code is none of ours."""
    found, errors = hal0_code.module_values('X = build()\nA = "a"', wanted=("A",))
    assert ({"A": "a"}, {}) == (found, errors)


@pytest.mark.parametrize("text", ["A = (", "\x00", "def f(:\n  pass"])
def test_text_that_is_not_python_raises_a_clear_error(text: str) -> None:
    """A file that is not Python is one error for the whole file, not a traceback."""
    with pytest.raises(hal0_code.Hal0CodeError, match="not"):
        hal0_code.module_values(text)


def test_a_deeply_nested_expression_is_refused_not_a_crash() -> None:
    """Nesting that would exhaust the parser's recursion is an error, never a crash."""
    text = "A = " + "(" * 5000 + '"x"' + ")" * 5000
    try:
        found, _ = hal0_code.module_values(text, wanted=("A",))
    except hal0_code.Hal0CodeError:
        return
    assert "x" == found["A"]


def test_the_runner_table_with_imported_names_positional_and_keyword_fields() -> None:
    """Images are the second field or image=; manifest keys the seventh or manifest_key=."""
    imported = {
        "DEFAULT_ROCMFPX_IMAGE": "ghcr.io/hal0ai/hal0-combined:0826",
        "FALLBACK_CUDA_IMAGE": "cuda:1",
    }
    names = hal0_code.imported_names(RUNNERS_TEXT, "hal0.config.schema")
    assert ("DEFAULT_ROCMFPX_IMAGE", "FALLBACK_CUDA_IMAGE") == names
    table = hal0_code.runners(RUNNERS_TEXT, imported=imported)
    assert {
        "rocmfpx": "ghcr.io/hal0ai/hal0-combined:0826",
        "cuda": "cuda:1",
        "cpu": "ghcr.io/hal0ai/hal0-toolbox-cpu:v1",
        "flm": "ghcr.io/hal0ai/hal0-toolbox-flm:0.9.44",
    } == table.images
    assert {"cpu": "cpu", "flm": "flm"} == table.manifest_keys
    assert {"vulkanfpx": "rocmfpx"} == table.aliases
    assert () == table.problems


def test_a_runner_entry_not_understood_is_left_out_and_named() -> None:
    """One odd entry does not lose the whole table; it is named, the others are read."""
    text = 'RUNNER_IMAGES = {"a": Runner("a", "img:1"), "b": Runner("b", pick())}\n'
    table = hal0_code.runners(text, imported={})
    assert {"a": "img:1"} == table.images
    assert 1 == len(table.problems)
    assert "RUNNER_IMAGES['b']" in table.problems[0]
    assert "call `pick()`" in table.problems[0]
    keyed = hal0_code.runners(
        'RUNNER_IMAGES = {"c": Runner("c", "i:1", manifest_key=k())}\n', imported={}
    )
    assert ({}, 1) == (keyed.images, len(keyed.problems))
    assert "RUNNER_IMAGES['c']: its manifest key is call `k()`" in keyed.problems[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("X = 1\n", "RUNNER_IMAGES is not defined"),
        ("RUNNER_IMAGES = make()\n", "RUNNER_IMAGES is call"),
    ],
)
def test_a_runner_table_not_understood_raises(text: str, message: str) -> None:
    with pytest.raises(hal0_code.Hal0CodeError, match=message):
        hal0_code.runners(text, imported={})


def test_runner_backends_by_keyword_by_position_or_the_default() -> None:
    """1.4+: ``supported_backends`` as a keyword or the sixth argument; absent, the dataclass
    default (backend-agnostic): an empty tuple, not nothing."""
    text = (
        "RUNNER_IMAGES = {\n"
        '    "standard": Runner("standard", "fam", (), "gpu", "b", ("vulkan", "rocm")),\n'
        '    "cpu": Runner("cpu", supported_backends=["cpu"]),\n'
        '    "npu": Runner("npu"),\n'
        "}\n"
    )
    assert {"standard": ("vulkan", "rocm"), "cpu": ("cpu",), "npu": ()} == (
        hal0_code.runner_backends(text)
    )


@pytest.mark.parametrize(
    ("entry", "shown"),
    [('"img:1"', "constant `'img:1'`"), ('kinds.Runner("a", "img:1")', "call `kinds.Runner(")],
)
def test_an_entry_that_is_not_a_runner_call_is_named(entry: str, shown: str) -> None:
    """A value that is not a call of a plain name is not guessed at, in either table reader."""
    text = f'RUNNER_IMAGES = {{"a": {entry}}}\n'
    table = hal0_code.runners(text, imported={})
    assert {} == table.images
    assert 1 == len(table.problems)
    assert shown in table.problems[0]
    assert "not Runner(...)" in table.problems[0]
    with pytest.raises(hal0_code.Hal0CodeError, match=r"RUNNER_IMAGES\['a'\] is .*not Runner"):
        hal0_code.runner_backends(text)


IMAGE_REFS = st.text(
    alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="./:-_@"),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(default=IMAGE_REFS, capable=st.frozensets(IMAGE_REFS, max_size=5))
def test_generated_schemas_read_back_exactly(default: str, capable: frozenset[str]) -> None:
    """Whatever refs a schema names, they read back exactly (escaped as Python writes them)."""
    members = "".join(f"    {ref!r},\n" for ref in sorted(capable))
    text = (
        f"DEFAULT_ROCMFPX_IMAGE = {default!r}\n"
        f"VULKAN_CAPABLE_IMAGE_REFS = frozenset({{\n    DEFAULT_ROCMFPX_IMAGE,\n{members}}})\n"
        "STALE_ROCMFPX_IMAGE_REFS = frozenset()\n"
    )
    found = values(text)
    assert default == found["DEFAULT_ROCMFPX_IMAGE"]
    assert capable | {default} == found["VULKAN_CAPABLE_IMAGE_REFS"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes(text: str) -> None:
    """Any text gives values or a Hal0CodeError: never another exception."""
    try:
        hal0_code.module_values(text, wanted=WANTED)
        hal0_code.runners(text, imported={})
    except hal0_code.Hal0CodeError:
        pass
