"""hal0-api's environment as systemd's EnvironmentFile= gives it (the image overrides)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hal0_reconciler.host import envfile

IMG = "ghcr.io/hal0ai/hal0-llama:b1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"K={IMG}\n", {"K": IMG}),
        (f"export K={IMG}\n", {}),  # not a variable name: systemd skips the line
        (f"# K={IMG}\n; K=x\n", {}),
        (f"K={IMG} # the pin\n", {"K": f"{IMG} # the pin"}),  # no comment after a value
        (f"K = '{IMG}'  \n", {"K": IMG}),
        (f'K="{IMG}"\nK=other\n', {"K": "other"}),  # the last line wins
        (f'K=other\nK="{IMG}"\n', {"K": IMG}),
        (f"K=  {IMG}\t \r\n", {"K": IMG}),
        ("K=a\\\nb\n", {"K": "ab"}),  # a trailing backslash joins the next line
        ('K="a\\"b\\\\c\\x"\n', {"K": 'a"b\\c\\x'}),
        ("K='a\\\"b'\n", {"K": 'a\\"b'}),
        ("K=x'y'\n", {"K": "x'y'"}),  # a quote after the first character is kept
        ('K="two\nlines"\nL=1\n', {"K": "two\nlines", "L": "1"}),
        ("K=\nL\nM=1", {"K": "", "M": "1"}),
        ("# a comment \\\nK=joined to it\n", {}),
        ("1K=x\nK-1=y\n", {}),
    ],
)
def test_systemd_rules(text: str, expected: dict[str, str]) -> None:
    assert envfile.unit_environment(text) == expected


def test_the_file_is_read_as_systemd_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "api.env"
    assert envfile.read_unit_environment(path) == {}
    path.write_text(f"export A={IMG}\nB={IMG} # x\n", encoding="utf-8")
    assert envfile.read_unit_environment(path) == {"B": f"{IMG} # x"}
    path.write_bytes(b"A=\xff\n")
    with pytest.raises(envfile.EnvFileRefused, match="not UTF-8"):
        envfile.read_unit_environment(path)


_NAMES = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
_BARE = st.text(
    st.characters(blacklist_characters="\\\n'\"\r\t ", blacklist_categories=("Cs",)), min_size=1
)


@given(st.lists(st.tuples(_NAMES, _BARE), max_size=8))
def test_plain_lines_are_read_back(lines: list[tuple[str, str]]) -> None:
    text = "".join(f"{k}={v}\n" for k, v in lines)
    expected = dict(lines)  # the last line of a name wins
    assert envfile.unit_environment(text) == expected


@given(st.text(max_size=200))
def test_any_text_gives_names_only(text: str) -> None:
    values = envfile.unit_environment(text)
    assert all(envfile._NAME.fullmatch(k) for k in values)
