"""slots.document: TOML text -> SlotDoc, read the way hal0 reads a slot file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hal0_reconciler import errors
from hal0_reconciler.model import DeviceSource
from hal0_reconciler.slots import document, limits
from helpers.hosts import SHARED

FIXTURES = SHARED / "fixtures/hal0/slots"


# --- the authoritative table ------------------------------------------------------------------


def test_flat_file_reads_its_top_level_keys() -> None:
    """A flat file's top-level keys are the slot's fields."""
    doc = document.parse_slot(
        'name = "chat"\ntype = "llm"\ndevice = "gpu-vulkan"\nprofile = "vulkan"\n'
        'provider = "llamacpp"\nport = 8081\n\n[model]\ndefault = "m"\n',
        stem="file-stem",
    )
    assert () == doc.table
    assert "chat" == doc.name
    assert "llm" == doc.type
    assert "gpu-vulkan" == doc.device
    assert DeviceSource.DEVICE == doc.device_source
    assert "vulkan" == doc.profile
    assert "llamacpp" == doc.provider
    assert {"default": "m"} == doc.data["model"]


def test_nested_file_overlays_slot_on_the_top_level_per_key() -> None:
    """hal0's launch path: [slot].key when present, else the top-level key."""
    doc = document.parse_slot(
        'device = "gpu-vulkan"\nname = "stale"\ntype = "tts"\nimage_pin = "x/y:1"\n\n'
        '[slot]\nname = "chat"\ndevice = "gpu-rocm"\n',
        stem="x",
    )
    assert ("slot",) == doc.table
    assert ("chat", "gpu-rocm", "gpu-rocm") == (doc.name, doc.device, doc.raw_device)
    assert ("tts", "x/y:1") == (doc.type, doc.image_pin)  # [slot] lacks them: top-level's
    assert doc.also is None


def test_a_root_device_applies_when_slot_has_none_and_is_the_one_written() -> None:
    doc = document.parse_slot('device = "gpu-vulkan"\n[slot]\nname = "a"\n', stem="a")
    assert ("gpu-vulkan", DeviceSource.DEVICE, ()) == (doc.device, doc.device_source, doc.table)
    assert doc.vulkan_candidate


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('slot = "not a table"\ndevice = "cpu"\n', id="scalar-slot"),
        pytest.param('device = "cpu"\n[[slot]]\ndevice = "npu"\n', id="array-of-slot-tables"),
    ],
)
def test_a_slot_key_that_is_not_a_table_leaves_the_root_authoritative(text: str) -> None:
    """Only a `slot` table makes a file nested."""
    doc = document.parse_slot(text, stem="s")
    assert ((), "cpu") == (doc.table, doc.device)


def test_name_defaults_to_the_file_stem() -> None:
    """Without a (string) `name`, the slot's name is the file stem."""
    assert "coder" == document.parse_slot('type = "llm"\n', stem="coder").name
    assert "coder" == document.parse_slot("name = 3\n", stem="coder").name


# --- device and legacy backend ----------------------------------------------------------------

BACKEND_ROWS = [
    ("", "gpu-rocm"),
    ("rocm", "gpu-rocm"),
    ("ROCm ", "gpu-rocm"),
    ("vulkan", "gpu-vulkan"),
    (" Vulkan", "gpu-vulkan"),
    ("cuda", "gpu-cuda"),
    ("cpu", "cpu"),
    ("flm", "npu"),
    ("moonshine", "cpu"),
    ("kokoro", "cpu"),
    ("gpu-rocm", "gpu-rocm"),
    ("gpu-vulkan", "gpu-vulkan"),
    ("GPU-CUDA", "gpu-cuda"),
    ("npu", "npu"),
    ("metal", "cpu"),
    ("llamacpp", "cpu"),
]


@pytest.mark.parametrize(("backend", "expected"), BACKEND_ROWS)
def test_device_from_backend_follows_hal0s_table(backend: str, expected: str) -> None:
    """A legacy backend maps case-insensitively; unknown values fall to cpu."""
    assert expected == document.device_from_backend(backend)


@pytest.mark.parametrize(("backend", "expected"), BACKEND_ROWS)
def test_a_file_with_only_a_backend_gets_the_mapped_device(backend: str, expected: str) -> None:
    """`backend` is consulted when `device` is absent, and is kept as written."""
    doc = document.parse_slot(f'name = "a"\nbackend = "{backend}"\n', stem="a")
    assert (expected, DeviceSource.LEGACY_BACKEND) == (doc.device, doc.device_source)
    assert backend == doc.backend
    assert doc.raw_device is None


@pytest.mark.parametrize(
    ("text", "device", "source"),
    [
        pytest.param(
            'device = "cpu"\nbackend = "vulkan"\n', "cpu", DeviceSource.DEVICE, id="device-wins"
        ),
        pytest.param(
            'device = "  "\nbackend = "vulkan"\n',
            "gpu-vulkan",
            DeviceSource.LEGACY_BACKEND,
            id="blank-device",
        ),
        pytest.param('device = ""\n', "gpu-rocm", DeviceSource.DEFAULT, id="empty-device"),
        pytest.param('device = " gpu-vulkan "\n', "gpu-vulkan", DeviceSource.DEVICE, id="stripped"),
        pytest.param('name = "a"\n', "gpu-rocm", DeviceSource.DEFAULT, id="nothing"),
        pytest.param("backend = 7\n", "gpu-rocm", DeviceSource.DEFAULT, id="non-string-backend"),
    ],
)
def test_effective_device(text: str, device: str, source: DeviceSource) -> None:
    """device when non-blank, else the mapped backend, else gpu-rocm."""
    doc = document.parse_slot(text, stem="a")
    assert (device, source) == (doc.device, doc.device_source)


def test_raw_device_and_backend_are_kept_as_written() -> None:
    """raw_device and backend carry the text of the file, not the normalised label."""
    doc = document.parse_slot('device = " GPU-Vulkan "\nbackend = "Vulkan"\n', stem="a")
    assert (" GPU-Vulkan ", "Vulkan") == (doc.raw_device, doc.backend)


@pytest.mark.parametrize("value", ["1", "true", '["gpu-rocm"]', '{ name = "gpu-rocm" }'])
def test_a_non_string_device_is_a_parse_error(value: str) -> None:
    """A device that is not a string is refused with a clear message, not guessed at."""
    with pytest.raises(errors.SlotParseError, match="device must be a string"):
        document.parse_slot(f"[slot]\ndevice = {value}\n", stem="a")


def test_a_non_string_root_device_of_a_nested_file_is_ignored() -> None:
    """The device check applies to the authoritative table only."""
    assert "cpu" == document.parse_slot('device = 1\n[slot]\ndevice = "cpu"\n', stem="a").device


# --- other fields -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected_id", "expected_token"),
    [
        pytest.param('id = "0007"\nname = "chat"\n', "0007", "0007", id="string-id"),
        pytest.param('id = 7\nname = "chat"\n', "7", "7", id="integer-id"),
        pytest.param('name = "chat"\n', None, "chat", id="no-id"),
        pytest.param('id = true\nname = "chat"\n', None, "chat", id="boolean-id-ignored"),
        pytest.param('id = 1.5\nname = "chat"\n', None, "chat", id="float-id-ignored"),
    ],
)
def test_id_keyed_files(text: str, expected_id: str | None, expected_token: str) -> None:
    """`id` is read as text; the unit token is the id when set, else the name."""
    doc = document.parse_slot(text, stem="7")
    assert (expected_id, expected_token) == (doc.id, doc.token)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('image_pin = "ghcr.io/a:1"\nimage = "ghcr.io/b:2"\n', "ghcr.io/a:1", id="pin"),
        pytest.param('image = "ghcr.io/b:2"\n', None, id="legacy-string-no-longer-counts"),
        pytest.param('name = "img"\n[image]\nidle_restore_minutes = 60\n', None, id="image-table"),
        pytest.param("image_pin = 3\n", None, id="non-string-pin"),
        pytest.param('image_pin = ""\n', "", id="empty-pin-as-written"),
        pytest.param("name = 'x'\n", None, id="none"),
    ],
)
def test_image_pin(text: str, expected: str | None) -> None:
    """`image_pin` as written; the legacy `image` string is no longer read (hal0 ignores it)."""
    assert expected == document.parse_slot(text, stem="x").image_pin


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param('name = "chat-2"\n', None, id="good-name"),
        pytest.param('name = "Chat"\n', "name 'Chat' breaks", id="upper-case"),
        pytest.param('name = "-x"\n', "name '-x' breaks", id="leading-dash"),
        pytest.param(f'name = "{"a" * 33}"\n', "breaks", id="too-long"),
        pytest.param('name = "a/../b"\n', "breaks", id="path"),
        pytest.param('name = "ok"\nid = 42\n', None, id="numeric-id"),
        pytest.param('name = "ok"\nid = "x y"\n', "id 'x y' breaks", id="id-with-space"),
        pytest.param('name = "ok"\nid = "a;rm"\n', "id 'a;rm' breaks", id="id-shell"),
    ],
)
def test_unit_problem(text: str, problem: str | None) -> None:
    """Names and ids outside hal0's patterns are named, so they never reach systemctl or the API."""
    found = document.parse_slot(text, stem="x").unit_problem
    assert (problem is None) == (found is None), found
    if problem is not None:
        assert problem in (found or "")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '[server]\nenv = { A = "1", B = 2, C = "x" }\n', {"A": "1", "C": "x"}, id="inline"
        ),
        pytest.param(
            '[server.env]\nHIP_VISIBLE_DEVICES = "0"\n', {"HIP_VISIBLE_DEVICES": "0"}, id="table"
        ),
        pytest.param('server = "oops"\n', {}, id="server-not-a-table"),
        pytest.param('[server]\nenv = ["A=1"]\n', {}, id="env-not-a-table"),
        pytest.param('[server]\nextra_args = "--x"\n', {}, id="no-env"),
    ],
)
def test_server_env_keeps_string_entries(text: str, expected: dict[str, str]) -> None:
    """[server].env is a string-to-string map; anything else in it is ignored."""
    assert expected == dict(document.parse_slot(text, stem="x").server_env)


def test_server_env_is_read_from_the_document_root_in_a_nested_file() -> None:
    """[server] is a sibling of [slot], not inside it."""
    doc = document.parse_slot('[slot]\nname = "a"\n[server.env]\nA = "1"\n', stem="a")
    assert {"A": "1"} == dict(doc.server_env)


def test_wrongly_typed_strings_count_as_absent() -> None:
    """A number where a string belongs does not crash the reader."""
    doc = document.parse_slot("type = 1\nprofile = []\nprovider = {}\n", stem="a")
    assert (None, None, None) == (doc.type, doc.profile, doc.provider)


# --- errors -----------------------------------------------------------------------------------


def test_invalid_toml_is_a_parse_error_with_the_position() -> None:
    """The parser's message, with line and column, reaches the operator."""
    with pytest.raises(errors.SlotParseError, match=r"line 2"):
        document.parse_slot('name = "a"\ndevice = \n', stem="a")


def test_absurd_nesting_is_a_parse_error() -> None:
    """Deeply nested arrays are refused, not a crash."""
    with pytest.raises(errors.SlotParseError):
        document.parse_slot("a = " + "[" * 100_000, stem="a")


TOMLISH = st.text(
    alphabet=st.sampled_from(list("[]{}=\"'#.,\n\r\t -_01aedivcslotbkn")), max_size=80
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=80), TOMLISH))
def test_parse_slot_raises_only_slot_parse_error(text: str) -> None:
    """Whatever the text, parse_slot returns a SlotDoc or raises SlotParseError."""
    try:
        doc = document.parse_slot(text, stem="s")
    except errors.SlotParseError:
        return
    assert isinstance(doc.device, str)


# --- hal0's own seed files --------------------------------------------------------------------


def _fixture_files() -> list[Path]:
    if not FIXTURES.is_dir():
        pytest.skip(f"hal0 slot fixtures not present at {FIXTURES}")
    files = sorted(FIXTURES.glob("*.toml"))
    assert files, f"{FIXTURES} holds no slot files: the seed-file checks would check nothing"
    return files


def test_hal0_seed_files_parse_as_flat_slots_named_after_their_stem() -> None:
    """Every installer seed is flat, names itself after its file and carries a device."""
    for path in _fixture_files():
        doc = document.parse_slot(path.read_text(encoding="utf-8"), stem=path.stem)
        assert ((), path.stem, DeviceSource.DEVICE) == (doc.table, doc.name, doc.device_source)


def test_a_known_parse_is_held_to_the_same_limits_as_a_parse() -> None:
    """The editor's verified parse of what it wrote stands in for a parse only within limits."""
    text = 'name = "a"\ndevice = "cpu"\n'
    data = tomllib.loads(text)
    assert document.parse_slot(text, stem="a") == document.from_checked_parse(text, data, stem="a")
    tight = limits.Limits(max_bytes=len(text) - 1)
    with pytest.raises(errors.OverLimit):
        document.from_checked_parse(text, data, stem="a", limits=tight)
    shallow = limits.Limits(max_depth=1)
    nested = {"slot": {"a": {"b": {"c": 1}}}}
    with pytest.raises(errors.OverLimit):
        document.from_checked_parse('name = "a"\n', nested, stem="a", limits=shallow)
