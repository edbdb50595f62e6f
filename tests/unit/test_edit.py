"""slots.edit: set one slot's device label, byte-minimal, checked by re-parsing."""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hal0_reconciler import errors
from hal0_reconciler.model import Device, DeviceSource
from hal0_reconciler.slots import document, edit
from helpers.hosts import SHARED

FIXTURES = SHARED / "fixtures/hal0/slots"
OWN_DATA = Path(__file__).parent.parent / "data" / "slots_edit"
DEVICES = [device.value for device in Device]


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


@pytest.mark.parametrize(
    ("text", "table", "note"),
    [
        pytest.param(
            'slot = { name = "a", device = "gpu-vulkan" }\n',
            ("slot",),
            "no header",
            id="inline-table",
        ),
        pytest.param('device = """gpu-vulkan"""\n', (), "multi-line", id="multi-line-device"),
        pytest.param(
            "device = '''\ngpu-vulkan'''\n", (), "multi-line", id="multi-line-literal-device"
        ),
        pytest.param("device = 1 # odd\n", (), "not written as a string", id="non-string-device"),
        pytest.param("[slot.sub]\nx = 1\n", ("slot",), "no header", id="implicit-slot-table"),
    ],
)
def test_unrewritable_layouts_fall_back_to_a_full_rewrite(
    text: str, table: tuple[str, ...], note: str
) -> None:
    """When the label cannot be edited in place, the document is re-serialised and says why."""
    result = edit.set_device(text, table=table, new="gpu-rocm")
    assert (False, True) == (result.byte_minimal, note in (result.note or ""))
    assert expected_after(text, table, "gpu-rocm") == tomllib.loads(result.text)


@pytest.mark.parametrize(
    ("written", "slipped"),
    [
        pytest.param('"a"', '"b"', id="other-value"),
        pytest.param("8081", "8081.0", id="integer-became-float"),
        pytest.param("1", "true", id="integer-became-boolean"),
        pytest.param("nan", "0.0", id="nan-became-number"),
        pytest.param("-0.0", "0.0", id="sign-of-zero"),
    ],
)
def test_a_rewrite_that_does_not_verify_is_not_returned(
    monkeypatch: pytest.MonkeyPatch, written: str, slipped: str
) -> None:
    """A byte-minimal candidate that re-parses to anything else is replaced by a full rewrite."""
    text = f'# keep\nkept = {written}\ndevice = "gpu-vulkan"\n'
    monkeypatch.setattr(
        edit,
        "_rewrite",
        lambda text, *_: text.replace("gpu-vulkan", "gpu-rocm").replace(written, slipped),
    )
    result = edit.set_device(text, table=(), new="gpu-rocm")
    assert (False, f'kept = {written}\ndevice = "gpu-rocm"\n') == (result.byte_minimal, result.text)
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
    result = edit.set_device('device = "gpu-vulkan"\n', table=(), new="cpu")
    assert (False, {"device": "cpu"}) == (result.byte_minimal, tomllib.loads(result.text))


def test_a_document_tomli_w_cannot_write_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """When neither rewrite can be verified, set_device refuses instead of guessing."""

    def broken(data: object) -> str:
        raise TypeError("cannot")

    monkeypatch.setattr(edit.tomli_w, "dumps", broken)
    with pytest.raises(errors.EditRefused, match="tomli_w"):
        edit.set_device('slot = { device = "gpu-vulkan" }\n', table=("slot",), new="cpu")


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
    ],
)
def test_new_values_are_quoted_safely(written: str, new: str, expected: str) -> None:
    """Any value is written as a valid single-line string, in the old quote style when it fits."""
    result = edit.set_device(f"device = {written}\n", table=(), new=new)
    assert (f"device = {expected}\n", {"device": new}) == (result.text, tomllib.loads(result.text))


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
        '  "--device",  # device = "gpu-vulkan"',
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
    assert (new, DeviceSource.DEVICE, None, slot.table) == (
        doc.device,
        doc.device_source,
        doc.backend,
        doc.table,
    )

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
