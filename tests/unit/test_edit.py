"""slots.edit: set one slot's device label, byte-minimal, checked by re-parsing."""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hal0_reconciler import errors
from hal0_reconciler.model import Device, DeviceSource
from hal0_reconciler.slots import _tomlscan, document, edit
from helpers.hosts import SHARED

FIXTURES = SHARED / "fixtures/hal0/slots"
OWN_DATA = Path(__file__).parent.parent / "data" / "slots_edit"
DEVICES = [device.value for device in Device]


def canonical(data: Any) -> str:
    """Parsed TOML as text that tells nan from 1.0 from 1 from true, whatever the key order."""
    if isinstance(data, dict):
        return "{" + ", ".join(f"{k!r}: {canonical(v)}" for k, v in sorted(data.items())) + "}"
    if isinstance(data, list):
        return "[" + ", ".join(canonical(item) for item in data) + "]"
    return f"{type(data).__name__}({data!r})"


def expected_after(text: str, table: tuple[str, ...], new: str) -> dict[str, Any]:
    """The old document with device set in `table` and backend dropped from it."""
    data = copy.deepcopy(tomllib.loads(text))
    target = data
    for key in table:
        target = target[key]
    target["device"] = new
    target.pop("backend", None)
    return data


# --- hand-picked cases ------------------------------------------------------------------------

CASES = [
    pytest.param(
        'name = "a"\ndevice = "gpu-vulkan"\nport = 1\n',
        (),
        'name = "a"\ndevice = "gpu-rocm"\nport = 1\n',
        id="flat",
    ),
    pytest.param(
        "name = 'a'\r\ndevice='gpu-vulkan'   # lane\r\n\r\n[model]\r\ndefault = ''\r\n",
        (),
        "name = 'a'\r\ndevice='gpu-rocm'   # lane\r\n\r\n[model]\r\ndefault = ''\r\n",
        id="crlf-literal",
    ),
    pytest.param(
        '"device" = "gpu-vulkan"',
        (),
        '"device" = "gpu-rocm"',
        id="quoted-key-no-final-newline",
    ),
    pytest.param(
        'device = "gpu-vulkan"\n\n[ "slot" ]  # here\nname = "a"\ndevice = "gpu-vulkan"\n',
        ("slot",),
        'device = "gpu-vulkan"\n\n[ "slot" ]  # here\nname = "a"\ndevice = "gpu-rocm"\n',
        id="nested-root-shadow",
    ),
    pytest.param(
        '[slot.sub]\ndevice = "gpu-vulkan"\n[slot]\nname = "a"\n',
        ("slot",),
        '[slot.sub]\ndevice = "gpu-vulkan"\n[slot]\ndevice = "gpu-rocm"\nname = "a"\n',
        id="subtable-is-not-slot",
    ),
    pytest.param(
        'name = "a"\ndevice = "gpu-vulkan"\nbackend = "vulkan"\nport = 1\n',
        (),
        'name = "a"\ndevice = "gpu-rocm"\nport = 1\n',
        id="backend-line-deleted",
    ),
    pytest.param(
        'device = "gpu-vulkan"\r\nbackend = "vulkan"',
        (),
        'device = "gpu-rocm"',
        id="last-backend-line-deleted-unterminated",
    ),
    pytest.param(
        "[slot]\n  backend = 'vulkan'  # old\nport = 1\n",
        ("slot",),
        "[slot]\n  device = 'gpu-rocm'  # old\nport = 1\n",
        id="backend-replaced-in-place",
    ),
    pytest.param(
        '# seed\nname = "a"\n\n[model]\ndefault = "m"\n',
        (),
        '# seed\nname = "a"\ndevice = "gpu-rocm"\n\n[model]\ndefault = "m"\n',
        id="insert-after-last-root-key",
    ),
    pytest.param(
        "# only tables\r\n[model]\r\n",
        (),
        '# only tables\r\ndevice = "gpu-rocm"\r\n[model]\r\n',
        id="insert-before-first-header",
    ),
    pytest.param(
        "# nothing", (), '# nothing\ndevice = "gpu-rocm"', id="insert-at-unterminated-end"
    ),
    pytest.param(
        '[slot] # s\n\tname = "a"\n',
        ("slot",),
        '[slot] # s\n\tdevice = "gpu-rocm"\n\tname = "a"\n',
        id="insert-after-header-with-indent",
    ),
    pytest.param(
        'notes = """\ndevice = "gpu-vulkan"\n[slot]\n"""\ndevice = "gpu-vulkan"\n',
        (),
        'notes = """\ndevice = "gpu-vulkan"\n[slot]\n"""\ndevice = "gpu-rocm"\n',
        id="multi-line-string-decoy",
    ),
    pytest.param(
        'args = [\n  \'device = "gpu-vulkan"\', # device = \'x\'\n  "]",\n]\ndevice = "gpu-vulkan"\n',
        (),
        'args = [\n  \'device = "gpu-vulkan"\', # device = \'x\'\n  "]",\n]\ndevice = "gpu-rocm"\n',
        id="multi-line-array-decoy",
    ),
    pytest.param(
        'a = ["""x\n]""", \'\'\'\n]\'\'\', "\\"]"]\ndevice = "gpu-vulkan"\n',
        (),
        'a = ["""x\n]""", \'\'\'\n]\'\'\', "\\"]"]\ndevice = "gpu-rocm"\n',
        id="strings-in-an-array-decoy",
    ),
    pytest.param(
        'when = 1979-05-27 07:32:00Z\nenv = { device = "gpu-vulkan" }\nslot . device = "gpu-vulkan"\n',
        ("slot",),
        'when = 1979-05-27 07:32:00Z\nenv = { device = "gpu-vulkan" }\nslot . device = "gpu-rocm"\n',
        id="dotted-key-datetime-inline-decoy",
    ),
    pytest.param(
        'q = """a\\"""b""""\nk = \'\'\'x\'\'\'\'\'\ndevice = "gpu-vulkan"\n',
        (),
        'q = """a\\"""b""""\nk = \'\'\'x\'\'\'\'\'\ndevice = "gpu-rocm"\n',
        id="quotes-at-string-ends",
    ),
    pytest.param(
        "a = 1 # \u2028 comment with a line separator\ndevice = 'gpu-vulkan'\n",
        (),
        "a = 1 # \u2028 comment with a line separator\ndevice = 'gpu-rocm'\n",
        id="unicode-line-separator",
    ),
]


@pytest.mark.parametrize(("text", "table", "expected"), CASES)
def test_set_device_rewrites_only_the_label(
    text: str, table: tuple[str, ...], expected: str
) -> None:
    """Only the device value (and a legacy backend line) change; every other byte stays."""
    result = edit.set_device(text, table=table, new="gpu-rocm")
    assert (expected, True, None) == (result.text, result.byte_minimal, result.note)
    assert expected_after(text, table, "gpu-rocm") == tomllib.loads(result.text)


# --- every shape: a decision table of exact bytes ------------------------------------------
# (text, table, expected) with new = "gpu-rocm". Each row names the shape that holds the label
# (flat root, [slot] table, inline table, nested inline table, dotted key) and what the table
# holds (device, device + legacy backend, backend only, neither), and the value's style.

SHAPES = [
    # flat root
    pytest.param(
        'device = "gpu-vulkan"\nbackend = "vulkan"  # old\nport = 1\n',
        (),
        'device = "gpu-rocm"\nport = 1\n',
        id="flat/device+backend",
    ),
    pytest.param(
        "name = 'a'\nbackend = 'vulkan' # legacy\n",
        (),
        "name = 'a'\ndevice = 'gpu-rocm' # legacy\n",
        id="flat/backend-only",
    ),
    pytest.param(
        'device = "gpu-rocm"\nbackend = "vulkan"\n',
        (),
        'device = "gpu-rocm"\n',
        id="flat/right-label-but-a-backend-left",
    ),
    # [slot] table
    pytest.param(
        '[slot]\r\nbackend = "vulkan"\r\n  device = "gpu-vulkan" # d\r\n',
        ("slot",),
        '[slot]\r\n  device = "gpu-rocm" # d\r\n',
        id="table/device+backend-crlf",
    ),
    # inline table at the top level
    pytest.param(
        '# c\nslot = { name = "a", device = "gpu-vulkan", port = 1 }  # the slot\n',
        ("slot",),
        '# c\nslot = { name = "a", device = "gpu-rocm", port = 1 }  # the slot\n',
        id="inline/device",
    ),
    pytest.param(
        "slot = {name = 'a',backend = 'vulkan'}",
        ("slot",),
        "slot = {name = 'a',device = 'gpu-rocm'}",
        id="inline/backend-only-no-final-newline",
    ),
    pytest.param(
        'slot = { backend = "vulkan", device = "gpu-vulkan", port = 1 }\n',
        ("slot",),
        'slot = { device = "gpu-rocm", port = 1 }\n',
        id="inline/backend-first-removed-with-its-comma",
    ),
    pytest.param(
        'slot = { device = "gpu-vulkan" ,  backend = "vulkan" } # x\r\n',
        ("slot",),
        'slot = { device = "gpu-rocm" } # x\r\n',
        id="inline/backend-last-removed-with-the-comma-before",
    ),
    pytest.param(
        'slot = { name = "a" } # no device yet\n',
        ("slot",),
        'slot = { name = "a", device = "gpu-rocm" } # no device yet\n',
        id="inline/neither-appended",
    ),
    pytest.param(
        'slot = { name = "a", env = { x = 1 }, port = 1 }\n',
        ("slot",),
        'slot = { name = "a", env = { x = 1 }, port = 1, device = "gpu-rocm" }\n',
        id="inline/neither-after-the-last-pair",
    ),
    pytest.param("slot = {}\n", ("slot",), 'slot = {device = "gpu-rocm"}\n', id="inline/empty"),
    pytest.param(
        "slot = {  }\n", ("slot",), 'slot = {  device = "gpu-rocm"  }\n', id="inline/empty-spaced"
    ),
    pytest.param(
        'slot = { env = { device = "gpu-vulkan" }, args = [{ device = "x" }], device = "gpu-vulkan" }\n',
        ("slot",),
        'slot = { env = { device = "gpu-vulkan" }, args = [{ device = "x" }], device = "gpu-rocm" }\n',
        id="inline/inner-tables-are-decoys",
    ),
    pytest.param(
        'slot = { env = { device = "gpu-vulkan" } }\n',
        ("slot",),
        'slot = { env = { device = "gpu-vulkan" }, device = "gpu-rocm" }\n',
        id="inline/neither-after-an-inner-table",
    ),
    # inline table nested in another inline table, or under a header
    pytest.param(
        "outer = { a = 1, slot = { device = \"gpu-vulkan\", backend = 'vulkan' }, b = 2 }\n",
        ("outer", "slot"),
        'outer = { a = 1, slot = { device = "gpu-rocm" }, b = 2 }\n',
        id="nested-inline/device+backend",
    ),
    pytest.param(
        'outer = { slot = { backend = "vulkan" } }\n',
        ("outer", "slot"),
        'outer = { slot = { device = "gpu-rocm" } }\n',
        id="nested-inline/backend-only",
    ),
    pytest.param(
        '[hosts]\nslot = { name = "a" }\n',
        ("hosts", "slot"),
        '[hosts]\nslot = { name = "a", device = "gpu-rocm" }\n',
        id="inline-under-header/neither",
    ),
    # dotted keys
    pytest.param(
        'slot.device = "gpu-vulkan"  # lane\nslot.name = "a"\n[model]\n',
        ("slot",),
        'slot.device = "gpu-rocm"  # lane\nslot.name = "a"\n[model]\n',
        id="dotted/device",
    ),
    pytest.param(
        "slot.name = 'a'\n  slot . backend = 'vulkan'\n",
        ("slot",),
        "slot.name = 'a'\n  slot . device = 'gpu-rocm'\n",
        id="dotted/backend-only",
    ),
    pytest.param(
        'slot.device = "gpu-vulkan"\r\nslot.backend = "vulkan"',
        ("slot",),
        'slot.device = "gpu-rocm"',
        id="dotted/device+backend-crlf-unterminated",
    ),
    pytest.param(
        '"slot" . name = "a" # n\n\n[model]\n',
        ("slot",),
        '"slot" . name = "a" # n\n"slot" . device = "gpu-rocm"\n\n[model]\n',
        id="dotted/neither-beside-the-last-dotted-key",
    ),
    pytest.param(
        "slot.name = 'a'\n 'slot' .port = 1\nx = 2\n",
        ("slot",),
        "slot.name = 'a'\n 'slot' .port = 1\n 'slot' .device = \"gpu-rocm\"\nx = 2\n",
        id="dotted/neither-beside-the-last-of-two",
    ),
    pytest.param(
        "slot.server.port = 1\n",
        ("slot",),
        'slot.server.port = 1\nslot.device = "gpu-rocm"\n',
        id="dotted/neither-deeper-key-makes-the-table",
    ),
    pytest.param(
        '[outer]\n\tslot.name = "a"\n',
        ("outer", "slot"),
        '[outer]\n\tslot.name = "a"\n\tslot.device = "gpu-rocm"\n',
        id="dotted-under-header/neither",
    ),
    pytest.param(
        'outer = { slot.name = "a", b = 2 }\n',
        ("outer", "slot"),
        'outer = { slot.name = "a", slot.device = "gpu-rocm", b = 2 }\n',
        id="dotted-in-inline/neither",
    ),
    pytest.param(
        'outer = { slot.backend = "vulkan", slot.device = "gpu-vulkan" }\n',
        ("outer", "slot"),
        'outer = { slot.device = "gpu-rocm" }\n',
        id="dotted-in-inline/device+backend",
    ),
    pytest.param(
        '"slot.device" = "gpu-vulkan"\n[slot]\ndevice = "gpu-vulkan"\n',
        ("slot",),
        '"slot.device" = "gpu-vulkan"\n[slot]\ndevice = "gpu-rocm"\n',
        id="dotted/a-quoted-dot-is-not-a-dotted-key",
    ),
    pytest.param(
        'slot = { env.device = "gpu-vulkan", device = "gpu-vulkan" }\n',
        ("slot",),
        'slot = { env.device = "gpu-vulkan", device = "gpu-rocm" }\n',
        id="inline/dotted-decoy",
    ),
    # a table only made by a sub-table header
    pytest.param(
        "# x\r\n[slot.sub]\r\nx = 1\r\n",
        ("slot",),
        '# x\r\n[slot]\r\ndevice = "gpu-rocm"\r\n[slot.sub]\r\nx = 1\r\n',
        id="sub-header-only/neither",
    ),
    pytest.param(
        '[hal0."the slot".sub]\n',
        ("hal0", "the slot"),
        '[hal0."the slot"]\ndevice = "gpu-rocm"\n[hal0."the slot".sub]\n',
        id="sub-header-only/quoted-key",
    ),
    # the value's style
    pytest.param(
        'device = """gpu-vulkan"""\n', (), 'device = """gpu-rocm"""\n', id="style/multi-line-basic"
    ),
    pytest.param(
        'device = """\r\ngpu-vulkan""" # c\r\n',
        (),
        'device = """\r\ngpu-rocm""" # c\r\n',
        id="style/multi-line-basic-trimmed-newline-crlf",
    ),
    pytest.param(
        'device = """gpu-\\\n     vulkan"""\nport = 1\n',
        (),
        'device = """gpu-rocm"""\nport = 1\n',
        id="style/multi-line-basic-line-ending-backslash",
    ),
    pytest.param(
        "device = '''gpu-vulkan'''\n",
        (),
        "device = '''gpu-rocm'''\n",
        id="style/multi-line-literal",
    ),
    pytest.param(
        "slot = { device = '''\ngpu-vulkan''', port = 1 }\n",
        ("slot",),
        "slot = { device = '''\ngpu-rocm''', port = 1 }\n",
        id="style/multi-line-literal-in-inline",
    ),
    pytest.param(
        "[slot]\nbackend = '''vulkan'''\n",
        ("slot",),
        "[slot]\ndevice = '''gpu-rocm'''\n",
        id="style/multi-line-literal-backend-only",
    ),
    pytest.param('device = "gpu\\u002Dvulkan"\n', (), 'device = "gpu-rocm"\n', id="style/escapes"),
    pytest.param(
        '"dev\\u0069ce" = "gpu-vulkan"\n',
        (),
        '"dev\\u0069ce" = "gpu-rocm"\n',
        id="style/escaped-key",
    ),
    pytest.param(
        '"back\\u0065nd" = "vulkan"\n', (), 'device = "gpu-rocm"\n', id="style/escaped-backend-key"
    ),
    pytest.param("device = 1 # odd\n", (), 'device = "gpu-rocm" # odd\n', id="style/integer"),
    pytest.param(
        'slot = { device = ["gpu-vulkan"] }\n',
        ("slot",),
        'slot = { device = "gpu-rocm" }\n',
        id="style/array",
    ),
    pytest.param(
        'device = { lane = "vulkan" }\n', (), 'device = "gpu-rocm"\n', id="style/inline-table"
    ),
    # unicode around the edit
    pytest.param(
        "slot = { name = \"Grüße ✓\", device = 'gpu-vulkan' } # ünïcode \u2028 sep\n",
        ("slot",),
        "slot = { name = \"Grüße ✓\", device = 'gpu-rocm' } # ünïcode \u2028 sep\n",
        id="unicode/inline",
    ),
]


@pytest.mark.parametrize(("text", "table", "expected"), SHAPES)
def test_every_shape_is_edited_in_place(text: str, table: tuple[str, ...], expected: str) -> None:
    """Whatever shape holds the label, only its value (and a legacy backend) change."""
    result = edit.set_device(text, table=table, new="gpu-rocm")
    assert (expected, True, None) == (result.text, result.byte_minimal, result.note)
    assert expected_after(text, table, "gpu-rocm") == tomllib.loads(result.text)
    assert tomllib.loads(result.text) == result.data, "the edit's parse is not what it wrote"
    assert edit.EditResult(expected, True, None) == edit.set_device(
        expected, table=table, new="gpu-rocm"
    )


@pytest.mark.parametrize(
    ("text", "table"),
    [
        pytest.param(
            '[slot]\nname = "a"\n[slot.device]\nlane = "vulkan"\n',
            ("slot",),
            id="device-is-a-header-table",
        ),
        pytest.param('slot.device.lane = "vulkan"\n', ("slot",), id="device-is-a-dotted-table"),
        pytest.param("[[device]]\nx = 1\n", (), id="device-is-an-array-of-tables"),
        pytest.param(
            '[slot]\ndevice = "gpu-vulkan"\n[slot.backend]\nlane = "vulkan"\n',
            ("slot",),
            id="backend-is-a-header-table",
        ),
        pytest.param(
            'slot = { device = "gpu-vulkan", backend.lane = "vulkan" }\n',
            ("slot",),
            id="backend-is-a-dotted-table-in-inline",
        ),
    ],
)
def test_only_a_label_that_is_a_table_of_its_own_falls_back(
    text: str, table: tuple[str, ...]
) -> None:
    """A device/backend made of several statements has no one span: re-serialised, and said."""
    result = edit.set_device(text, table=table, new="gpu-rocm")
    assert (False, True) == (result.byte_minimal, "is a table of its own" in (result.note or ""))
    assert expected_after(text, table, "gpu-rocm") == tomllib.loads(result.text)


@pytest.mark.parametrize(
    ("written", "slipped"),
    [
        pytest.param('"a"', '"b"', id="other-value"),
        pytest.param("8081", "8081.0", id="integer-became-float"),
        pytest.param("1", "true", id="integer-became-boolean"),
        pytest.param("nan", "0.0", id="nan-became-number"),
        pytest.param("-0.0", "0.0", id="sign-of-zero"),
        pytest.param("[1, [2]]", "[1, [3]]", id="list-item"),
    ],
)
def test_a_rewrite_that_does_not_verify_is_not_returned(
    monkeypatch: pytest.MonkeyPatch, written: str, slipped: str
) -> None:
    """A byte-minimal candidate that re-parses to anything else is replaced by a full rewrite."""
    text = f'# keep\nkept = {written}\ndevice = "gpu-vulkan"\n'

    def slipping(text: str, *_: object) -> str:
        return text.replace("gpu-vulkan", "gpu-rocm").replace(written, slipped)

    monkeypatch.setattr(edit, "_rewrite", slipping)
    monkeypatch.setattr(edit, "_rewrite_plain", slipping)  # the shortcut is checked as well
    result = edit.set_device(text, table=(), new="gpu-rocm")
    expected = tomllib.loads(f'kept = {written}\ndevice = "gpu-rocm"\n')
    assert (False, canonical(expected)) == (
        result.byte_minimal,
        canonical(tomllib.loads(result.text)),
    )
    assert "did not re-parse" in (result.note or "")


def test_special_floats_do_not_defeat_the_re_parse_check() -> None:
    """nan equals nan for the check, so a file holding it still gets the minimal edit."""
    text = "limit = nan\nscale = -0.0\nr = [inf, nan]\ndevice = 'gpu-vulkan'\n"
    result = edit.set_device(text, table=(), new="cpu")
    expected = "limit = nan\nscale = -0.0\nr = [inf, nan]\ndevice = 'cpu'\n"
    assert (expected, True) == (result.text, result.byte_minimal)
    assert result == edit.set_device(result.text, table=(), new="cpu")


def test_a_rewrite_that_does_not_parse_is_not_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte-minimal candidate that is not TOML is replaced by a full rewrite."""
    monkeypatch.setattr(edit, "_rewrite", lambda text, *_: text + "= oops")
    monkeypatch.setattr(edit, "_rewrite_plain", lambda text, *_: text + "= oops")
    result = edit.set_device('device = "gpu-vulkan"\n', table=(), new="cpu")
    assert (False, {"device": "cpu"}) == (result.byte_minimal, tomllib.loads(result.text))


def test_a_document_tomli_w_cannot_write_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """When neither rewrite can be verified, set_device refuses instead of guessing."""

    def broken(data: object) -> str:
        raise TypeError("cannot")

    monkeypatch.setattr(edit.tomli_w, "dumps", broken)
    with pytest.raises(errors.EditRefused, match="tomli_w"):
        edit.set_device('slot.device.lane = "vulkan"\n', table=("slot",), new="cpu")


def test_nesting_as_deep_as_tomllib_reads_is_still_edited_in_place() -> None:
    """The scanner loops over a stack, so depth costs no fallback (450 arrays, 300 tables)."""
    arrays, tables = "[" * 450 + "]" * 450, "{ a = " * 300 + "1" + " }" * 300
    text = f"# deep\nx = {arrays}\nslot = {{ t = {tables}, device = 'gpu-vulkan' }}\n"
    result = edit.set_device(text, table=("slot",), new="cpu")
    assert (text.replace("'gpu-vulkan'", "'cpu'"), True) == (result.text, result.byte_minimal)


def test_a_document_too_deep_for_tomli_w_is_refused_not_crashed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fallback tomli_w cannot write for depth is a refusal (EditRefused), not a crash."""

    def too_deep(data: object) -> str:
        raise RecursionError

    monkeypatch.setattr(edit.tomli_w, "dumps", too_deep)
    with pytest.raises(errors.EditRefused, match="tomli_w"):
        edit.set_device('slot.device.lane = "x"\n', table=("slot",), new="cpu")


@pytest.mark.parametrize(
    ("text", "table"),
    [
        pytest.param('name = "a"\n', ("slot",), id="missing-table"),
        pytest.param('[[slot]]\nname = "a"\n', ("slot",), id="array-of-tables"),
        pytest.param('slot = "x"\n', ("slot",), id="scalar"),
        pytest.param('name = "a"\ndevice = \n', (), id="not-toml"),
    ],
)
def test_set_device_refuses_a_table_it_cannot_find(text: str, table: tuple[str, ...]) -> None:
    """The target table must exist as a table in valid TOML."""
    with pytest.raises(errors.EditRefused):
        edit.set_device(text, table=table, new="cpu")


def test_text_already_carrying_the_label_is_returned_unchanged() -> None:
    """No change needed means the same text back, whatever its layout."""
    text = 'device = """cpu"""  # odd but correct\n'
    assert edit.EditResult(text, True, None) == edit.set_device(text, table=(), new="cpu")


@pytest.mark.parametrize(
    ("written", "new", "expected"),
    [
        pytest.param("'x'", "it's", '"it\'s"', id="apostrophe-leaves-literal-style"),
        pytest.param('"x"', 'a"b\\c', '"a\\"b\\\\c"', id="escapes"),
        pytest.param("'x'", "tab\there", "'tab\there'", id="tab-in-literal"),
        pytest.param('"x"', "line\nbreak\x7f", '"line\\nbreak\\u007f"', id="control-characters"),
        pytest.param("'''x'''", "it's", '"""it\'s"""', id="apostrophe-leaves-multi-line-literal"),
        pytest.param("'''\nx'''", "a\tb", "'''\na\tb'''", id="tab-in-multi-line-literal"),
        pytest.param(
            '"""\r\nx"""', 'end"""\n', '"""\r\nend\\"\\"\\"\\n"""', id="escapes-in-multi-line-basic"
        ),
        pytest.param("'''x'''", "", "''''''", id="empty-multi-line-literal"),
    ],
)
def test_new_values_are_quoted_safely(written: str, new: str, expected: str) -> None:
    """Any value is written as a valid string, in place, in the old quote style when it fits."""
    result = edit.set_device(f"device = {written}  # kept\n", table=(), new=new)
    assert (f"device = {expected}  # kept\n", True) == (result.text, result.byte_minimal)
    assert {"device": new} == tomllib.loads(result.text)


# --- real and hand-written slot files ---------------------------------------------------------


def test_hal0_vulkan_seeds_change_exactly_the_device_value() -> None:
    """On hal0's own seed files, the relabel is the one-word change and every comment stays."""
    if not FIXTURES.is_dir():
        pytest.skip(f"hal0 slot fixtures not present at {FIXTURES}")
    vulkan = [
        p
        for p in sorted(FIXTURES.glob("*.toml"))
        if 'device = "gpu-vulkan"' in p.read_text("utf-8")
    ]
    assert vulkan, "expected at least one gpu-vulkan seed"
    for path in vulkan:
        old = path.read_bytes().decode("utf-8")
        result = edit.set_device(old, table=(), new="gpu-rocm")
        expected = old.replace('device = "gpu-vulkan"', 'device = "gpu-rocm"', 1)
        assert (path.name, expected, True) == (path.name, result.text, result.byte_minimal)


def test_hand_written_nested_legacy_file_keeps_its_comments() -> None:
    """In a nested legacy file, only [slot]'s backend line becomes a device line."""
    old = (OWN_DATA / "nested_legacy.toml").read_text("utf-8")
    result = edit.set_device(old, table=("slot",), new="gpu-rocm")
    expected = old.replace(
        "  backend = 'vulkan'    # legacy", "  device = 'gpu-rocm'    # legacy", 1
    )
    assert (expected, True) == (result.text, result.byte_minimal)
    doc = document.parse_slot(result.text, stem="chat")
    assert ("gpu-rocm", DeviceSource.DEVICE, None) == (doc.device, doc.device_source, doc.backend)


# --- generated slot files ---------------------------------------------------------------------


@dataclass(frozen=True)
class KeyLine:
    """One generated `key = "value"` line, kept in parts so the test can predict its edit."""

    indent: str
    key: str
    spacing: str
    quote: str
    value: str
    suffix: str

    def render(self, *, key: str | None = None, value: str | None = None) -> str:
        written = self.value if value is None else value
        return f"{self.indent}{key or self.key}{self.spacing}{self.quote}{written}{self.quote}{self.suffix}"


@dataclass(frozen=True)
class SlotFile:
    lines: list[str]  # without line endings
    eol: str
    final_eol: bool
    table: tuple[str, ...]
    device: int | None  # index of the target table's device line
    backend: int | None
    parts: dict[int, KeyLine]

    @property
    def text(self) -> str:
        return self.eol.join(self.lines) + (self.eol if self.final_eol else "")


COMMENT_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufeff"),
    max_size=12,
)
SUFFIX = st.one_of(
    st.sampled_from(["", "", "  ", ' # device = "gpu-vulkan"', "\t# [slot]"]),
    COMMENT_TEXT.map(lambda text: "  #" + text),
)
DECOY_BLOCKS = [
    ['notes = """', 'device = "gpu-vulkan"', "backend = 'vulkan'", "[slot]", '"""'],
    ["memo = '''", "device = 'gpu-vulkan'", "[[slot]]", "'''"],
    [
        "args = [",
        '  "--device",  # ] device = "gpu-vulkan"',
        '  "device = \\"gpu-vulkan\\"",',
        "  [ 'x' ],",
        "]",
    ],
    ['inline = { device = "gpu-vulkan", backend = "vulkan" }'],
    ["when = 1979-05-27 07:32:00Z # device = 'x'"],
]
PLAIN = [
    'name = "chat"',
    "type = 'llm'",
    "port = 8081",
    "enabled = true",
    "n_gpu_layers = -1",
    'profile = "vulkan"',
    "ratio = 0.5",
]


@st.composite
def key_lines(draw: st.DrawFn, key: str, values: list[str]) -> KeyLine:
    return KeyLine(
        indent=draw(st.sampled_from(["", "", "  ", "\t"])),
        key=draw(st.sampled_from([key, f'"{key}"', f"'{key}'"])),
        spacing=draw(st.sampled_from([" = ", "=", "  =\t", "\t= "])),
        quote=draw(st.sampled_from(['"', "'"])),
        value=draw(st.sampled_from(values)),
        suffix=draw(SUFFIX),
    )


@st.composite
def body(draw: st.DrawFn, *, decoys: bool) -> list[list[str]]:
    """Plain keys, blank lines, comments and (optionally) multi-line values that mention device."""
    chunks: list[list[str]] = [
        [line] for line in draw(st.lists(st.sampled_from(PLAIN), unique=True, max_size=4))
    ]
    chunks += [[""] for _ in range(draw(st.integers(0, 2)))]
    chunks += [["#" + text] for text in draw(st.lists(COMMENT_TEXT, max_size=2))]
    if decoys:
        chunks += draw(
            st.lists(st.sampled_from(DECOY_BLOCKS), unique_by=lambda block: block[0], max_size=3)
        )
    return list(draw(st.permutations(chunks)))


def flat(chunks: list[list[str]]) -> list[str]:
    return [line for chunk in chunks for line in chunk]


@st.composite
def slot_files(draw: st.DrawFn) -> SlotFile:
    """Flat and nested slot files with a target table holding device and/or backend, or neither."""
    nested = draw(st.booleans())
    table: tuple[str, ...] = ("slot",) if nested else ()
    target = draw(body(decoys=True))
    specials: dict[str, KeyLine] = {}
    if draw(st.booleans()):
        specials["\0device"] = draw(
            key_lines("device", [*DEVICES, "", " gpu-vulkan ", "GPU-Vulkan"])
        )
    if draw(st.booleans()):
        specials["\0backend"] = draw(key_lines("backend", ["vulkan", "rocm", ""]))
    for placeholder in specials:
        target.insert(draw(st.integers(0, len(target))), [placeholder])

    tables: list[list[str]] = [
        ["[model]", *flat(draw(body(decoys=False)))],
        [
            draw(st.sampled_from(["[server]", "[ server ] # runtime"])),
            'extra_args = "--x"',
            'env = { HIP_VISIBLE_DEVICES = "0", device = "gpu-vulkan" }',
        ],
    ]
    if draw(st.booleans()):
        tables.append(["[[extras]]", 'device = "gpu-vulkan"'])
    root: list[str] = ["# " + draw(COMMENT_TEXT)]
    if nested:
        header = draw(
            st.sampled_from(["[slot]", "[ slot ]", '["slot"]', "  [ 'slot' ]  # the slot"])
        )
        tables.append([header, *flat(target)])
        if draw(st.booleans()):
            tables.append(["[slot.sub]", "device = 'gpu-vulkan'", 'backend = "vulkan"'])
        root += draw(
            st.lists(
                st.sampled_from(['device = "gpu-vulkan"', 'backend = "vulkan"', 'name = "stale"']),
                unique=True,
            )
        )
    else:
        root += flat(target)
    lines = root + [line for block in draw(st.permutations(tables)) for line in block]

    device = backend = None
    rendered: dict[int, KeyLine] = {}
    for index, line in enumerate(lines):
        if line in specials:
            lines[index] = specials[line].render()
            rendered[index] = specials[line]
            if line == "\0device":
                device = index
            else:
                backend = index
    return SlotFile(
        lines=lines,
        eol=draw(st.sampled_from(["\n", "\r\n"])),
        final_eol=draw(st.booleans()),
        table=table,
        device=device,
        backend=backend,
        parts=rendered,
    )


def expected_lines(slot: SlotFile, new: str) -> list[str] | None:
    """The exact lines after the edit, or None for an insertion (its place is checked apart)."""
    lines = list(slot.lines)
    if slot.device is not None:
        lines[slot.device] = slot.parts[slot.device].render(value=new)
        if slot.backend is not None:
            del lines[slot.backend]
        return lines
    if slot.backend is not None:
        lines[slot.backend] = slot.parts[slot.backend].render(key="device", value=new)
        return lines
    return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slot=slot_files(), new=st.sampled_from(DEVICES))
def test_generated_files_change_only_the_device_line(slot: SlotFile, new: str) -> None:
    """On any layout, set_device yields old data + the intended change, touching one line."""
    old = slot.text
    result = edit.set_device(old, table=slot.table, new=new)

    assert expected_after(old, slot.table, new) == tomllib.loads(result.text)
    assert tomllib.loads(result.text) == result.data  # what the daemon remembers it wrote
    assert (True, None) == (result.byte_minimal, result.note)
    new_lines = result.text.split(slot.eol)
    if slot.eol == "\r\n":
        assert [] == [line for line in new_lines if "\n" in line]
    predicted = expected_lines(slot, new)
    if predicted is not None:
        assert slot.eol.join(predicted) + (slot.eol if slot.final_eol else "") == result.text
    else:
        old_lines = old.split(slot.eol)
        assert len(old_lines) + 1 == len(new_lines)
        inserted = [
            i for i in range(len(new_lines)) if new_lines[:i] + new_lines[i + 1 :] == old_lines
        ]
        assert inserted, "the edit is not one inserted line"
        assert re.fullmatch(rf'[ \t]*device = "{new}"', new_lines[inserted[0]])

    doc = document.parse_slot(result.text, stem="s")
    assert (new, DeviceSource.DEVICE, slot.table) == (doc.device, doc.device_source, doc.table)
    assert "backend" not in (result.data or {}).get("slot", result.data or {})

    again = edit.set_device(result.text, table=slot.table, new=new)
    assert edit.EditResult(result.text, True, None) == again


@settings(max_examples=100, deadline=None)
@given(
    data=st.dictionaries(
        st.text(max_size=5),
        st.one_of(
            st.integers(),
            st.text(max_size=8),
            st.booleans(),
            st.floats(),
            st.lists(st.integers(), max_size=3),
        ),
        max_size=5,
    ),
    new=st.text(max_size=10),
)
def test_any_document_and_any_label_round_trip(data: dict[str, Any], new: str) -> None:
    """Whatever keys, values (nan included) and label, the result re-parses as intended."""
    import tomli_w

    text = tomli_w.dumps({**data, "slot": {"device": "gpu-vulkan", "backend": "vulkan"}})
    result = edit.set_device(text, table=("slot",), new=new)
    assert edit.EditResult(result.text, True, None) == edit.set_device(
        result.text, table=("slot",), new=new
    )
    doc = document.parse_slot(result.text, stem="s")
    assert (new, None) == (doc.raw_device, doc.backend)


TOML_SCALARS = st.one_of(
    st.integers(),
    st.text(max_size=8),
    st.booleans(),
    st.floats(),
    st.datetimes(),
    st.dates(),
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _toml_inline(value: Any) -> str:
    """`value` written on one pair's right-hand side (tables as inline tables)."""
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{_toml_key(k)} = {_toml_inline(v)}" for k, v in value.items()) + " }"
        )
    if isinstance(value, list):
        return "[" + ", ".join(_toml_inline(item) for item in value) + "]"
    return tomli_w.dumps({"v": value})[len("v = ") :].rstrip("\n")


def _toml_key(key: str) -> str:
    return tomli_w.dumps({key: 1})[: -len(" = 1\n")]


@settings(
    max_examples=150,
    deadline=None,
    # some drawn documents do not parse (a key of `others` clashing with the slot table):
    # skipped by assume, which may filter more than hypothesis's health check likes
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    others=st.dictionaries(st.text(max_size=5), TOML_VALUES, max_size=4),
    fields=st.dictionaries(
        st.text(max_size=5).filter(lambda key: key not in {"device", "backend"}),
        TOML_VALUES,
        max_size=3,
    ),
    label=st.sampled_from([{"device": "gpu-vulkan"}, {"backend": "vulkan"}, {}])
    | st.fixed_dictionaries({"device": TOML_VALUES, "backend": TOML_VALUES}),
    shape=st.sampled_from(["table", "inline", "dotted"]),
    new=st.text(max_size=10),
)
def test_any_document_in_any_shape_and_any_label_is_edited_in_place(
    others: dict[str, Any], fields: dict[str, Any], label: dict[str, Any], shape: str, new: str
) -> None:
    """Whatever values (any nesting, nan, dates, odd keys) surround it, and whatever the label,
    the slot table is edited in place, and nothing before or after its text changes."""
    others.pop("slot", None)
    rest = tomli_w.dumps(others)
    tables = re.search(r"^\[", rest, re.MULTILINE)
    head, tail = (rest[: tables.start()], rest[tables.start() :]) if tables else (rest, "")
    if shape == "table":  # tomli_w writes the fields (sub-tables too), the label goes first
        written = tomli_w.dumps({"slot": fields}).removeprefix("[slot]\n")
        slot = "[slot]\n" + "".join(f"{k} = {_toml_inline(v)}\n" for k, v in label.items())
        slot += written + "\n"
    elif shape == "inline":
        slot = f"slot = {_toml_inline({**fields, **label})}\n"
    else:
        pairs_ = {**fields, **label}.items()
        slot = "".join(f"slot.{_toml_key(k)} = {_toml_inline(v)}\n" for k, v in pairs_)
        slot = slot or "slot = {}\n"
    text = head + slot + tail
    assume(_parses(text))

    result = edit.set_device(text, table=("slot",), new=new)
    assert (True, None) == (result.byte_minimal, result.note)
    assert canonical(expected_after(text, ("slot",), new)) == canonical(tomllib.loads(result.text))
    start, end, _ = _changed_span(text, result.text)
    assert len(head) <= start <= end <= len(head) + len(slot)
    assert edit.EditResult(result.text, True, None) == edit.set_device(
        result.text, table=("slot",), new=new
    )


def _parses(text: str) -> bool:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False
    return True


# --- generated files in every shape ---------------------------------------------------------
# The generator writes markers into the document where the edit must act, so the test knows the
# exact expected bytes: [D0, D1) the device value (replaced in its style), [R0, R1) a legacy
# backend pair with its line or comma (deleted), [K0, K1) a backend key (renamed to device).

D0, D1, R0, R1, K0, K1 = "\ue000", "\ue001", "\ue002", "\ue003", "\ue004", "\ue005"
MARKS = re.compile("[\ue000-\ue005]")

# (written, its replacement): {v} is the old text, {n} the new label, {eol} the document's
VALUE_STYLES = [
    ('"{v}"', '"{n}"'),
    ("'{v}'", "'{n}'"),
    ('"""{v}"""', '"""{n}"""'),
    ('"""{eol}{v}"""', '"""{eol}{n}"""'),
    ("'''{v}'''", "'''{n}'''"),
    ("'''{eol}{v}'''", "'''{eol}{n}'''"),
    ('"\\u0067pu-vulkan"', '"{n}"'),
    ('"""gpu-\\{eol}    vulkan"""', '"""{n}"""'),
    ("8081", '"{n}"'),
    ('["gpu-vulkan", { device = "x" }]', '"{n}"'),
    ('{ lane = "vulkan", device = "gpu-vulkan" }', '"{n}"'),
]
DOTTED_PREFIXES = ["slot.", "slot . ", '"slot".', "'slot' ."]


@dataclass(frozen=True)
class Pair:
    """A target `device` or `backend` pair, and its role in the edit."""

    role: str  # "device", "remove" (a backend beside a device), "rename" (a backend alone)
    key: str
    equals: str
    written: str
    replaced: str

    def render(self, *, prefix: str, eol: str) -> str:
        value = self.written.replace("{eol}", eol)
        if self.role == "device":
            return f"{prefix}{self.key}{self.equals}{D0}{value}{D1}"
        if self.role == "rename":
            return f"{prefix}{K0}{self.key}{K1}{self.equals}{D0}{value}{D1}"
        return f"{prefix}{self.key}{self.equals}{value}"


@st.composite
def pairs(draw: st.DrawFn, key: str, contents: list[str], role: str) -> Pair:
    written, replaced = draw(st.sampled_from(VALUE_STYLES))
    content = draw(st.sampled_from(contents))
    return Pair(
        role=role,
        key=draw(st.sampled_from([key, f'"{key}"', f"'{key}'"])),
        equals=draw(st.sampled_from([" = ", "=", "  =\t", "\t= "])),
        written=written.replace("{v}", content),
        replaced=replaced,
    )


@dataclass(frozen=True)
class Shaped:
    marked: str  # the document with the markers
    table: tuple[str, ...]
    eol: str
    replaced: str | None  # the device value's replacement template, when there is one

    @property
    def text(self) -> str:
        return MARKS.sub("", self.marked)

    def offset(self, marker: str) -> int:
        """Where `marker` is in the document without markers."""
        return len(MARKS.sub("", self.marked[: self.marked.index(marker)]))

    def expected(self, new: str) -> str | None:
        """The exact text after the edit, or None for an insertion (checked apart)."""
        if self.replaced is None:
            return None
        out = re.sub(f"{R0}.*?{R1}", "", self.marked, flags=re.DOTALL)
        out = re.sub(f"{K0}.*?{K1}", "device", out, flags=re.DOTALL)
        replacement = self.replaced.format(n=new, eol=self.eol)
        return re.sub(f"{D0}.*?{D1}", lambda _: replacement, out, flags=re.DOTALL)


PLAIN_PAIRS = ['name = "chat"', "port = 8081", "when = 1979-05-27 07:32:00Z", "ratio = 0.5"]
DECOY_PAIRS = [
    'env = { device = "gpu-vulkan", backend = "vulkan" }',
    'args = ["--device", { device = "gpu-vulkan" }, [ \'backend = "vulkan"\' ]]',
    'notes = """device = "gpu-vulkan"{eol}backend = \'vulkan\'"""',
    "sub.device = 'gpu-vulkan'",
    '"back end" = "vulkan"',
]
SHAPE_NAMES = [
    "flat",
    "header",
    "dotted-root",
    "dotted-header",
    "inline-root",
    "inline-header",
    "inline-nested",
    "dotted-inline",
]


def _inline(items: list[str | Pair], *, prefix: str, eol: str, pad: str, comma: str) -> str:
    """`{ a, b, c }` with the markers of a removed pair around it and one comma beside it."""
    tokens: list[str] = []
    for index, item in enumerate(items):
        if index:
            tokens.append(comma)
        tokens.append(_render(item, prefix=prefix, eol=eol))
    for index, item in enumerate(items):
        if isinstance(item, Pair) and item.role == "remove":
            at = 2 * index
            if index + 1 < len(items):
                tokens[at] = R0 + tokens[at]
                tokens[at + 1] += R1
            else:
                tokens[at - 1] = R0 + tokens[at - 1]
                tokens[at] += R1
    return "{" + pad + "".join(tokens) + pad + "}"


def _lines(items: list[str | Pair], *, dotted: bool, eol: str, draw: st.DrawFn) -> list[str]:
    out = []
    for item in items:
        prefix = draw(st.sampled_from(DOTTED_PREFIXES)) if dotted else ""
        line = draw(st.sampled_from(["", "  ", "\t"])) + _render(item, prefix=prefix, eol=eol)
        line += draw(SUFFIX)
        removed = isinstance(item, Pair) and item.role == "remove"
        out.append(R0 + line + R1 if removed else line)
    return out


def _render(item: str | Pair, *, prefix: str, eol: str) -> str:
    if isinstance(item, Pair):
        return item.render(prefix=prefix, eol=eol)
    return prefix + item.replace("{eol}", eol)


@st.composite
def targets(draw: st.DrawFn) -> list[Pair]:
    """The target table's device and/or legacy backend pair, or neither."""
    out = []
    if draw(st.booleans()):
        contents = ["gpu-vulkan", " gpu-vulkan ", "GPU-Vulkan", "cpu", "ü✓"]
        out.append(draw(pairs("device", contents, "device")))
    if draw(st.booleans()):
        out.append(draw(pairs("backend", ["vulkan", "rocm", ""], "remove" if out else "rename")))
    return out


@st.composite
def placed(
    draw: st.DrawFn, shape: str, items: list[str | Pair], eol: str
) -> tuple[list[str], list[str], tuple[str, ...]]:
    """The target table's pairs placed in `shape`: (root lines, table sections, its path)."""
    if shape.startswith("inline") or shape == "dotted-inline":
        holder = _inline(
            items,
            prefix="slot." if shape == "dotted-inline" else "",
            eol=eol,
            pad=draw(st.sampled_from(["", " ", "  "])),
            comma=draw(st.sampled_from([", ", ",", " , "])),
        )
        if shape == "inline-root":
            return ["slot = " + holder + draw(SUFFIX)], [], ("slot",)
        if shape == "inline-header":
            return [], ["[outer]", "x = 1", "slot = " + holder + draw(SUFFIX)], ("outer", "slot")
        if shape == "inline-nested":
            line = f'outer = {{ a = 1, slot = {holder}, b = [{{ device = "gpu-vulkan" }}] }}'
            return [line], [], ("outer", "slot")
        return [f"outer = {holder}"], [], ("outer", "slot")  # dotted keys in an inline table
    body = _lines(items, dotted=shape.startswith("dotted"), eol=eol, draw=draw)
    body += [""] * draw(st.integers(0, 1))
    body += ["#" + text for text in draw(st.lists(COMMENT_TEXT, max_size=1))]
    body = list(draw(st.permutations(body)))
    if shape == "flat":
        return body, [], ()
    if shape == "header":
        header = draw(st.sampled_from(["[slot]", "[ slot ] # s", "['slot']"]))
        stale = ['device = "gpu-vulkan"', 'backend = "vulkan"']
        return stale, [header, *body, "[slot.more]", "device = 'gpu-vulkan'"], ("slot",)
    if shape == "dotted-root":
        return body, [], ("slot",)
    return [], ["[outer]", *body], ("outer", "slot")


@st.composite
def shaped_files(draw: st.DrawFn) -> Shaped:
    """Slot files whose target table is held in any TOML shape, with device/backend or neither."""
    shape = draw(st.sampled_from(SHAPE_NAMES))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    wanted = draw(targets())
    plain = draw(st.lists(st.sampled_from(PLAIN_PAIRS + DECOY_PAIRS), unique=True, max_size=4))
    if shape.startswith("dotted") and 'name = "chat"' not in plain:
        plain.append('name = "chat"')  # a dotted key that makes the table
    items: list[str | Pair] = list(draw(st.permutations([*plain, *wanted])))
    root, sections, table = draw(placed(shape, items, eol))
    lines = ["# " + draw(COMMENT_TEXT), *root]
    lines += ["[model]", 'default = "m"', "[server]", 'env = { device = "gpu-vulkan" }', *sections]
    marked = eol.join(lines) + (eol if draw(st.booleans()) else "")
    # a removed line goes with its line ending, or at the unterminated end, the one before it
    if marked.endswith(R1):
        marked = marked.replace(eol + R0, R0 + eol)
    marked = marked.replace(R1 + eol, eol + R1)
    return Shaped(marked, table, eol, wanted[0].replaced if wanted else None)


def _changed_span(old: str, new: str) -> tuple[int, int, str]:
    """The one region of `old` that differs from `new`: (start, end, what replaces it)."""
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[-1 - end] == new[-1 - end]:
        end += 1
    return start, len(old) - end, new[start : len(new) - end]


def _insertions(old: str, new: str) -> list[str]:
    """Every `x` such that `new` is `old` with `x` inserted at one place (none: not an insertion)."""
    size = len(new) - len(old)
    return [
        new[at : at + size]
        for at in range(len(old) + 1)
        if size > 0 and new[:at] == old[:at] and new[at + size :] == old[at:]
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shaped=shaped_files(), new=st.sampled_from(DEVICES))
def test_every_generated_shape_changes_only_the_value_span(shaped: Shaped, new: str) -> None:
    """In any shape, the edit replaces exactly the value's span (and a backend's), in place."""
    old = shaped.text
    result = edit.set_device(old, table=shaped.table, new=new)
    intended = expected_after(old, shaped.table, new)

    assert (True, None) == (result.byte_minimal, result.note)
    assert intended == tomllib.loads(result.text)
    if shaped.eol == "\r\n":
        assert "\n" not in result.text.replace("\r\n", "")
    expected = shaped.expected(new)
    if tomllib.loads(old) == intended:
        assert old == result.text
    elif expected is not None:
        assert expected == result.text
        if R0 not in shaped.marked:  # one region: the value's span (from the renamed key)
            start, end, _ = _changed_span(old, result.text)
            first = K0 if K0 in shaped.marked else D0
            assert shaped.offset(first) <= start <= end <= shaped.offset(D1)
    else:
        inserted = _insertions(old, result.text)
        pattern = rf'(, |\r?\n)?[ \t]*((slot|"slot"|\'slot\') ?\. ?)?device = "{new}"( *|\r?\n)'
        assert [text for text in inserted if re.fullmatch(pattern, text)], inserted

    again = edit.set_device(result.text, table=shaped.table, new=new)
    assert edit.EditResult(result.text, True, None) == again


@settings(
    max_examples=200,
    deadline=None,
    # only drawn files with one plain `device = "..."` line are kept (assume)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(slot=slot_files(), new=st.sampled_from(DEVICES))
def test_the_one_line_shortcut_edits_as_the_scanner_does(slot: SlotFile, new: str) -> None:
    """Where the regular expression finds the one `device = "..."` line and its edit re-parses
    as intended, it is the scanner's edit, byte for byte; where it finds a wrong line (one in a
    multi-line string, in another table), the re-parse says no."""
    old = slot.text
    plain = edit._rewrite_plain(old, new)
    assume(plain is not None)
    expected = expected_after(old, slot.table, new)
    try:
        scanned: str | None = edit._rewrite(old, slot.table, new)
    except _tomlscan.CannotEdit:
        scanned = None
    if slot.backend is None and tomllib.loads(plain) == expected:
        assert scanned == plain
    if slot.device is None or slot.backend is not None:  # not the right edit: refused
        assert tomllib.loads(plain) != expected


def test_a_shortcut_that_does_not_verify_falls_back_to_the_scanner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = '# keep\nkept = "a"\ndevice = "gpu-vulkan"\n'
    monkeypatch.setattr(edit, "_rewrite_plain", lambda text, *_: text.replace('"a"', '"b"'))
    result = edit.set_device(text, table=(), new="gpu-rocm")
    assert (text.replace("gpu-vulkan", "gpu-rocm"), True) == (result.text, result.byte_minimal)


def test_the_shortcut_takes_only_a_lone_plain_device_line() -> None:
    flat = '# a slot\nname = "a"\ndevice = "gpu-vulkan"  # the label\nport = 1\n'
    assert flat.replace('"gpu-vulkan"', '"gpu-rocm"') == edit._rewrite_plain(flat, "gpu-rocm")
    literal = "device = 'gpu-vulkan'\r\n"
    assert "device = 'cpu'\r\n" == edit._rewrite_plain(literal, "cpu")
    assert None is edit._rewrite_plain('device = "a"\n[x]\ndevice = "b"\n', "cpu")  # two
    assert None is edit._rewrite_plain('device = "a\\u0041"\n', "cpu")  # an escape: scanned
    assert None is edit._rewrite_plain('"device" = "a"\n', "cpu")  # a quoted key: scanned
    assert None is edit._rewrite_plain("slot.device = 'a'\n", "cpu")  # dotted: scanned
    assert None is edit._rewrite_plain('device = "a" x\n', "cpu")  # not a lone value
    # a decoy inside a multi-line string is the only such line: its edit does not verify, and
    # the scanner edits the real one
    decoy = 'notes = """\ndevice = "gpu-vulkan"\n"""\n"device" = "gpu-vulkan"\n'
    result = edit.set_device(decoy, table=(), new="gpu-rocm")
    assert 'notes = """\ndevice = "gpu-vulkan"\n"""\n"device" = "gpu-rocm"\n' == result.text
    assert result.byte_minimal


def test_the_shortcut_saves_the_scanner_and_is_not_tried_where_it_cannot_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain file costs the shortcut and one re-parse, not the scanner; a table holding
    `backend` (which the edit must drop) goes straight to the scanner: the shortcut's edit
    could not verify, and would cost a parse for nothing."""
    plain = '# keep\nname = "a"\ndevice = "gpu-vulkan"\n'
    with_backend = 'name = "a"\ndevice = "gpu-vulkan"\nbackend = "vulkan"\n'
    real_scan, real_plain = _tomlscan.scan, edit._rewrite_plain
    calls: list[str] = []

    def scan(text: str) -> _tomlscan.Scan:
        calls.append("scan")
        return real_scan(text)

    def shortcut(text: str, new: str) -> str | None:
        calls.append("shortcut")
        return real_plain(text, new)

    monkeypatch.setattr(_tomlscan, "scan", scan)
    monkeypatch.setattr(edit, "_rewrite_plain", shortcut)
    assert edit.set_device(plain, table=(), new="cpu").byte_minimal
    assert ["shortcut"] == calls
    calls.clear()
    result = edit.set_device(with_backend, table=(), new="cpu")
    assert ('name = "a"\ndevice = "cpu"\n', True) == (result.text, result.byte_minimal)
    assert ["scan"] == calls


def test_both_tables_saying_gpu_vulkan_change_in_one_byte_minimal_write() -> None:
    """The launcher reads [slot].device, hal0's own pass the top-level one: both change."""
    text = '# chat\ndevice = "gpu-vulkan"\n\n[slot]\nname = "chat"\ndevice = "gpu-vulkan"\n'
    doc = document.parse_slot(text, stem="chat")
    assert (("slot",), ()) == doc.write_tables
    result = edit.set_device_in(text, tables=doc.write_tables, new="gpu-rocm", parsed=doc.data)
    assert (True, text.replace("gpu-vulkan", "gpu-rocm")) == (result.byte_minimal, result.text)
    only_slot = 'device = "cpu"\n[slot]\ndevice = "gpu-vulkan"\n'
    assert (("slot",),) == document.parse_slot(only_slot, stem="a").write_tables
