"""The man pages say the defaults the code has: each ``\\fBkey\\fR = value`` of
hal0-reconciler.toml(5) is the setting's real default, and the prose of hal0-reconciler(8) and
the README about a default (restarts, demotions) says what this release does."""

from __future__ import annotations

import dataclasses
import enum
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler import settings as settings_mod
from helpers.hosts import REPO

MAN8 = REPO / "packaging/man/hal0-reconciler.8"
MAN5 = REPO / "packaging/man/hal0-reconciler.toml.5"
README = REPO / "README.md"
SECTIONS = {
    "TOP-LEVEL KEYS": settings_mod.Settings,
    "[aiter]": settings_mod.AiterSettings,
    "[[aiter.trees]]": settings_mod.AiterTree,
}


def plain(roff: str) -> str:
    """A roff fragment as the reader sees it."""
    text = re.sub(r"\\f[BIRP]", "", roff).replace("\\-", "-").replace("\\&", "")
    return text.strip()


def stated_defaults() -> dict[tuple[str, str], str]:
    """(section, key) -> the default the settings page states, as written."""
    found: dict[tuple[str, str], str] = {}
    for part in re.split(r"^\.SH ", MAN5.read_text(), flags=re.MULTILINE):
        head, _, body = part.partition("\n")
        head = head.strip().strip('"')
        if head in SECTIONS:
            for key, value in re.findall(r"^\\fB(\w+)\\fR = (.*)$", body, re.MULTILINE):
                found[(head, key)] = plain(value)
    return found


UNSET = "(unset)"  # a default of None: the page shows it empty ("", []) or says it in words


def as_toml(value: object) -> object:
    """A field's default as it reads in a TOML file."""
    if value is None:
        return UNSET
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [as_toml(v) for v in value]
    if isinstance(value, frozenset):  # a list in the file, read into a set (hands_off)
        return sorted(as_toml(v) for v in value)
    return value


def agrees(text: str, value: object) -> bool:
    """Whether the page's ``text`` states ``value``."""
    if value == "(required)":
        return text == value
    if value == UNSET and text.startswith("("):
        return True  # e.g. "(the installed hal0 release's budget)"
    try:
        parsed = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return False
    return parsed in ("", []) if value == UNSET else parsed == value


def real_defaults() -> dict[tuple[str, str], object]:
    found: dict[tuple[str, str], object] = {}
    for head, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name in {"aiter", "trees"}:
                continue
            if f.default is not dataclasses.MISSING:
                value: Any = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = "(required)"
            found[(head, f.name)] = as_toml(value)
    return found


@pytest.fixture(autouse=True)
def _no_hal0_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page states the defaults of a host without HAL0_HOME."""
    monkeypatch.delenv("HAL0_HOME", raising=False)


def test_every_default_the_settings_page_states_is_the_settings_real_default() -> None:
    stated = stated_defaults()
    real = real_defaults()
    assert set(real) <= set(stated), sorted(set(real) - set(stated))
    wrong = {w: (stated[w], v) for w, v in real.items() if not agrees(stated[w], v)}
    assert {} == wrong, "(page, code)"


def test_the_check_reads_a_changed_default() -> None:
    """The comparison is not vacuous: another value, or a stated value for an unset default,
    is caught."""
    stated = stated_defaults()
    fallback = stated[("TOP-LEVEL KEYS", "restart_fallback")]
    assert agrees(fallback, "none")
    assert not agrees(fallback, "stop")
    assert not agrees('"/x"', UNSET)
    assert agrees('""', UNSET)
    assert agrees("[]", UNSET)
    assert not agrees("= nonsense", 1.0)


def _sentences(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if not ln.startswith('.\\"')]
    flat = " ".join(plain(line).replace("`", "") for line in lines)
    return re.split(r"(?<=[.;])\s+", flat)


INSTALLED_DOCS = [MAN8, MAN5, README, *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", INSTALLED_DOCS, ids=lambda p: p.name)
def test_a_sentence_about_stopping_a_slot_says_the_restart_fallbacks_real_default(
    doc: Path,
) -> None:
    """Restarts as this release does them: a sentence saying a slot's unit is stopped when
    hal0's API cannot restart it names ``restart_fallback``, and names the other value only as
    the operator's choice ("only with", "unless", "or") or next to the default: 0.1.0's "or
    stopped when the API cannot be reached" was the page's claim after 0.2.0 stopped doing it."""
    default = settings_mod.Settings().restart_fallback.value
    for sentence in _sentences(doc.read_text()):
        about = re.search(
            r"\b(unit|slot) is stopped\b|\bor stopped\b|\bis the (slot's )?unit stopped", sentence
        )
        if not about:
            continue
        assert "restart_fallback" in sentence, sentence
        names_default = f'restart_fallback = "{default}"' in sentence or f"({default})" in sentence
        conditional = re.search(r"\bonly with\b|\bunless\b|\bchose\b", sentence)
        assert names_default or conditional, sentence


def test_the_command_page_says_the_restart_fallbacks_real_default() -> None:
    """hal0-reconciler(8)'s description names the default restart_fallback."""
    default = settings_mod.Settings().restart_fallback.value
    assert f'restart_fallback = "{default}"' in plain(MAN8.read_text())


@pytest.mark.parametrize(
    ("key", "pattern"),
    [
        ("demote_grace", r"`demote_grace` \((\d+) s\)"),
        ("busy_bound", r"`busy_bound` \((\d+) min\)"),
    ],
)
def test_the_readmes_defaults_are_the_settings_defaults(key: str, pattern: str) -> None:
    """The README's "(60 s)", "(30 min)" next to a setting are its defaults."""
    readme = README.read_text()
    stated = [float(v) for v in re.findall(pattern, readme)]
    assert stated, f"the README no longer states {key}'s default"
    real = float(getattr(settings_mod.Settings(), key))
    scale = 60.0 if "min" in pattern else 1.0
    assert {real} == {v * scale for v in stated}
    fallback = re.findall(r'`restart_fallback = "(\w+)"`', readme)
    assert {settings_mod.Settings().restart_fallback.value} == set(fallback)
