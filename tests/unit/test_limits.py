"""slots.limits: each limit refuses what is over it, naming the limit and its value, before
the parser runs; real slot files are far inside every limit."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.errors import OverLimit
from hal0_reconciler.slots import limits
from helpers.hosts import DATA

SMALL = limits.Limits(max_bytes=1000, max_depth=4, max_key_length=10, max_digits=5, max_items=20)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = " + "1" * 6, "number length limit: 6 digits > 5"),
        ("x = [1, 2, " + "1_2_3_4_5_6" + "]", "number length limit: 6 digits > 5"),
        ("a.b.c.d.e = 1", "nesting limit: deeper than 4"),
        ("[a.b.c.d.e]", "nesting limit: deeper than 4"),
        ("[[a.b.c.d]]", "nesting limit: deeper than 4"),
        ("[a.b]\nc.d.e = 1", "nesting limit: deeper than 4"),
        ("x = [[[[1]]]]", "nesting limit: deeper than 4"),
        ("x = {a = {b = {c = {d = 1}}}}", "nesting limit: deeper than 4"),
        ("x = [{a = [{b = 1}]}]", "nesting limit: deeper than 4"),
        ("abcdefghijk = 1", "key length limit: a key longer than 10"),
        ('"abc.defghij" = 1', "key length limit: a key longer than 10"),
        ("[abcdefghijk]", "key length limit: a table header longer than 10"),
        ("x = [" + "1," * 20 + "]", "item limit: more than 20"),
        ("".join(f"k{i} = 1\n" for i in range(21)), "item limit: more than 20"),
        ('x = "' + "a" * 1000 + '"', "size limit: 1006 bytes > 1000 bytes"),
    ],
)
def test_each_limit_names_itself_and_its_value(text: str, message: str) -> None:
    with pytest.raises(OverLimit, match=message.replace("[", r"\[")):
        limits.check_text(text, SMALL)


@pytest.mark.parametrize(
    "text",
    [
        "x = 12345\ny = 1.5e10\nz = 1979-05-27T07:32:00Z",
        'x = "' + "9" * 500 + '"',  # digits inside a string are text, not a number
        "# " + "[" * 100 + "\nx = 1",  # brackets in a comment
        'x = """\n' + "[[[[[[" + '\n"""',  # brackets in a multi-line string
        "x = '''" + "{{{{{{" + "'''",
        "a.b.c = 1\n[d]\ne = [[1], [2]]",  # depth exactly 4 at most
        '[a.b.c]\n"q.k.d" = 1',  # a quoted key with dots is one part: depth 4
        'x = "a\\"[[[[[[[[[["',  # an escaped quote does not end the string
        '"q.k.d" = 1',  # dots inside a quoted key are one part (depth 4 would say so)
    ],
)
def test_inside_the_limits(text: str) -> None:
    limits.check_text(text, SMALL)


def test_real_slot_files_are_far_inside_the_default_limits() -> None:
    for path in sorted(DATA.glob("slots*/*.toml")):
        text = path.read_text()
        limits.check_text(text)
        limits.check_depth(tomllib.loads(text))


def test_the_parsed_depth_is_checked_too() -> None:
    """A document the scanner could misjudge is still refused once parsed."""
    deep: dict[str, object] = {"v": 1}
    for _ in range(5):
        deep = {"t": deep}
    with pytest.raises(OverLimit, match="nesting limit"):
        limits.check_depth(deep, SMALL)
    limits.check_depth({"t": {"u": [1, 2]}}, SMALL)


_VALUE = st.recursive(
    st.integers(-(10**6), 10**6) | st.text(max_size=8) | st.booleans(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text("ab", min_size=1, max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text("xyz", min_size=1, max_size=3), _VALUE, max_size=4))
def test_the_scanner_never_undercounts_the_parsed_depth(doc: dict[str, object]) -> None:
    """Whatever the scanner lets through parses no deeper than the limit (TOML written by
    tomli_w: inline tables, arrays, dotted headers)."""
    import tomli_w

    text = tomli_w.dumps(doc)
    bounds = limits.Limits(max_depth=3)
    try:
        limits.check_text(text, bounds)
    except OverLimit:
        return
    limits.check_depth(tomllib.loads(text), bounds)  # the parsed data agrees


_TOMLISH = st.text(alphabet=st.sampled_from(list("ab19_.=[]{},#\"'\\ \t\n\r")), max_size=60)
_LINES = st.lists(  # lines of keys, headers, values and comments: mostly within the counts
    st.sampled_from(
        ["a = 1", "[a]", "[[a]]", "a.b = 'x'", '"a" = "1"', "a = [1, 2]", "# .", "", "ab_ = 9"]
    ),
    max_size=6,
).map("\n".join)
_TIGHT = limits.Limits(max_bytes=1000, max_depth=3, max_key_length=6, max_digits=2, max_items=4)


@settings(max_examples=500, deadline=None)
@given(_TOMLISH | _LINES | st.builds(lambda v: __import__("tomli_w").dumps({"k": v}), _VALUE))
def test_the_counting_shortcut_never_lets_through_what_the_tokenizer_refuses(text: str) -> None:
    """Counts say "within the limits" only where the tokenizer says so too (tight limits, any
    mix of TOML's punctuation, valid or not)."""
    if limits._within_by_counts(text, _TIGHT):
        limits._Scan(_TIGHT).run(text)  # raises OverLimit if the counts were wrong


@pytest.mark.parametrize(
    "text",
    [
        "a = 1\n" * 5,  # five items
        "[a.b]\nc.d = 1",  # depth 4 by the tokenizer and by the counts
        "abcdefg = 1",  # a line longer than a key may be
        "x = 123",  # a run of digits longer than a number may be
        "x = {a = 1}",  # an inline table: keys need not start a line
        'x = """\n"""',  # a multi-line string: a key could span lines
    ],
)
def test_the_counting_shortcut_leaves_the_doubtful_to_the_tokenizer(text: str) -> None:
    assert not limits._within_by_counts(text, _TIGHT)


@pytest.mark.parametrize(
    ("text", "bounds"),
    [  # exactly at one limit: within it, and refused by the tokenizer at one less
        ("[[a]]\nb = 1", {"max_depth": 3}),  # a key in an array of tables: 1 + two brackets
        ("a.b = [1]", {"max_depth": 3, "max_key_length": 9}),
        ("a = 1\nb = 2\nc = 3\nd = 4", {"max_items": 4}),
        ("abcdef", {"max_key_length": 6}),
        ("x = 12", {"max_digits": 2}),
    ],
)
def test_the_counting_shortcut_takes_what_counts_prove(text: str, bounds: dict[str, int]) -> None:
    assert limits._within_by_counts(text, dataclasses.replace(_TIGHT, **bounds))
    limits._Scan(dataclasses.replace(_TIGHT, **bounds)).run(text)
    name, value = next(iter(bounds.items()))
    with pytest.raises(OverLimit):
        limits._Scan(dataclasses.replace(_TIGHT, **{**bounds, name: value - 1})).run(text)


@pytest.mark.parametrize(
    ("text", "bounds"),
    [
        ("a={b={c={d=1}}}", {"max_depth": 3, "max_key_length": 20}),  # braces nest keys
        ('"""ab\ncd\nef"""=1', {}),  # a multi-line string as a key: longer than its lines
    ],
)
def test_what_counts_cannot_see_is_left_to_the_tokenizer(text: str, bounds: dict[str, int]) -> None:
    tight = dataclasses.replace(_TIGHT, **bounds)
    assert not limits._within_by_counts(text, tight)
    with pytest.raises(OverLimit):
        limits.check_text(text, tight)


def test_the_counting_shortcut_takes_real_slot_files() -> None:
    for path in sorted(DATA.glob("slots/*.toml")):
        assert limits._within_by_counts(path.read_text(), limits.DEFAULT), path.name
