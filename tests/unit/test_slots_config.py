"""``[slots]`` judged as the installed release's ``SlotsConfig``: decision tables.

The schema texts are written here in the shape hal0's ``schema.py`` uses (a pydantic model with
``Field(...)`` bounds and named validators); the lax coercions are the ones pydantic 2 gives
(measured against the pydantic installed with hal0 1.0-1.7)."""

from __future__ import annotations

import ast
import datetime as dt
import math
from typing import TYPE_CHECKING

import pytest

from hal0_reconciler.host.hal0 import operator_files, slotsconfig
from hal0_reconciler.host.hal0.sources import FactProblem

if TYPE_CHECKING:
    from pathlib import Path

SCHEMA = """
from pydantic import BaseModel, Field, field_validator, model_validator
_PORT_MIN = 8081
_PORT_END = 8099
_TEXT = "8"
class SlotsConfig(BaseModel):
    model_config = {"populate_by_name": True, "extra": "forbid"}
    max_slots: int = Field(default=0, ge=0, description="x")
    port_range_start: int = Field(default=_PORT_MIN, ge=1024, le=65535)
    port_range_end: int = Field(default=_PORT_END, ge=1024, le=65535)
    spare: int = Field(default=5, gt=-2, lt=10)
    preload_evict_enabled: bool = Field(default=True)
    publish_host: str = Field(default="127.0.0.1")
    network_mode: str = Field(default="")
    default_images: dict[str, str] = Field(default_factory=dict)

    @field_validator("default_images", mode="before")
    @classmethod
    def _default_images_known_families(cls, v): return v

    @field_validator("publish_host")
    @classmethod
    def _publish_host_sane(cls, v): return v

    @field_validator("network_mode")
    @classmethod
    def _network_mode_known(cls, v): return v

    @model_validator(mode="after")
    def port_range_sane(self): return self
"""
RULES = slotsconfig.read(ast.parse(SCHEMA))


def _rules(text: str) -> slotsconfig.Rules:
    rules = slotsconfig.read(ast.parse(text))
    assert rules is not None
    return rules


@pytest.mark.parametrize(
    ("kind", "raw", "value"),
    [
        (slotsconfig.Kind.INT, 7, 7),
        (slotsconfig.Kind.INT, True, 1),
        (slotsconfig.Kind.INT, 2.0, 2),
        (slotsconfig.Kind.INT, -0.0, 0),
        (slotsconfig.Kind.INT, " +1_000 ", 1000),
        (slotsconfig.Kind.INT, "8.00", 8),
        (slotsconfig.Kind.INT, "-1.0", -1),
        (slotsconfig.Kind.INT, "\t0007\n", 7),
        (slotsconfig.Kind.INT, 2**70, 2**70),
        (slotsconfig.Kind.BOOL, True, True),
        (slotsconfig.Kind.BOOL, 0, False),
        (slotsconfig.Kind.BOOL, 1.0, True),
        (slotsconfig.Kind.BOOL, "Yes", True),
        (slotsconfig.Kind.BOOL, "OFF", False),
        (slotsconfig.Kind.BOOL, "f", False),
        (slotsconfig.Kind.BOOL, "1", True),
        (slotsconfig.Kind.STR, "", ""),
        (slotsconfig.Kind.STR, " a ", " a "),
    ],
)
def test_lax_coercion_accepts(kind: slotsconfig.Kind, raw: object, value: object) -> None:
    assert slotsconfig.coerce(kind, raw) == (value, None)


@pytest.mark.parametrize(
    ("kind", "raw"),
    [
        (slotsconfig.Kind.INT, 1.5),
        (slotsconfig.Kind.INT, math.inf),
        (slotsconfig.Kind.INT, math.nan),
        (slotsconfig.Kind.INT, "1e3"),
        (slotsconfig.Kind.INT, "0x10"),
        (slotsconfig.Kind.INT, "1."),
        (slotsconfig.Kind.INT, ".0"),
        (slotsconfig.Kind.INT, "1.5"),
        (slotsconfig.Kind.INT, "_1"),
        (slotsconfig.Kind.INT, "1__0"),
        (slotsconfig.Kind.INT, "\u0663"),  # an Arabic-Indic digit: not ASCII
        (slotsconfig.Kind.INT, ""),
        (slotsconfig.Kind.INT, "true"),
        (slotsconfig.Kind.INT, dt.date(2026, 1, 1)),
        (slotsconfig.Kind.INT, [1]),
        (slotsconfig.Kind.INT, {}),
        (slotsconfig.Kind.BOOL, 2),
        (slotsconfig.Kind.BOOL, -1),
        (slotsconfig.Kind.BOOL, 0.5),
        (slotsconfig.Kind.BOOL, " true "),
        (slotsconfig.Kind.BOOL, "maybe"),
        (slotsconfig.Kind.BOOL, ""),
        (slotsconfig.Kind.BOOL, []),
        (slotsconfig.Kind.STR, 80),
        (slotsconfig.Kind.STR, True),
        (slotsconfig.Kind.STR, 1.0),
        (slotsconfig.Kind.STR, dt.time(1, 2)),
    ],
)
def test_lax_coercion_refuses(kind: slotsconfig.Kind, raw: object) -> None:
    value, why = slotsconfig.coerce(kind, raw)
    assert value is None
    assert why


@pytest.mark.parametrize(
    ("table", "refused"),
    [
        ({}, None),
        ({"default_images": {"x": "y"}}, None),  # judged by defaults.validate, not here
        ({"max_slots": 0, "port_range_start": "9000", "port_range_end": 9100}, None),
        ({"max_slots": -1}, "[slots].max_slots = -1 is not >= 0"),
        ({"max_slots": "-1"}, "[slots].max_slots = -1 is not >= 0"),
        ({"nosuch": 1}, "[slots] key 'nosuch' is not one hal0 knows"),
        ({"port_range_start": 80}, "[slots].port_range_start = 80 is not >= 1024"),
        ({"port_range_end": 65536}, "[slots].port_range_end = 65536 is not <= 65535"),
        ({"port_range_start": "x"}, "[slots].port_range_start is 'x', not a whole number"),
        ({"port_range_start": 8100}, "[slots].port_range_end (8099) is below port_range_start"),
        ({"port_range_start": 8099}, None),  # the default end, inclusive
        ({"port_range_start": 9000, "port_range_end": 8999}, "is below port_range_start"),
        ({"spare": -2}, "[slots].spare = -2 is not > -2"),
        ({"spare": -1}, None),
        ({"spare": 10}, "[slots].spare = 10 is not < 10"),
        ({"spare": 9}, None),
        ({"preload_evict_enabled": "maybe"}, "[slots].preload_evict_enabled is 'maybe', not"),
        ({"preload_evict_enabled": "no"}, None),
        ({"publish_host": 80}, "[slots].publish_host is an integer, not a string"),
        ({"publish_host": "  "}, "[slots].publish_host is blank"),
        ({"publish_host": "::1"}, "'::1' is not a bare IPv4"),
        ({"publish_host": "a b"}, "is not a bare IPv4"),
        ({"publish_host": "10.0.0.0/8"}, "is not a bare IPv4"),
        ({"publish_host": " 0.0.0.0 "}, None),
        ({"network_mode": "bridge"}, "[slots].network_mode 'bridge' is not '' or 'host'"),
        ({"network_mode": " host "}, None),
        ({"network_mode": ""}, None),
        ({"max_slots": {}}, "[slots].max_slots is a table, not a whole number"),
        ({"max_slots": [1]}, "[slots].max_slots is an array, not a whole number"),
    ],
)
def test_refusal_decision_table(table: dict[str, object], refused: str | None) -> None:
    assert RULES is not None
    why = slotsconfig.refusal(table, RULES)
    if refused is None:
        assert why is None
    else:
        assert why is not None
        assert refused in why


def test_extra_keys_are_ignored_without_forbid() -> None:
    rules = _rules(SCHEMA.replace('"extra": "forbid"', '"extra": "ignore"'))
    assert slotsconfig.refusal({"nosuch": 1}, rules) is None
    rules = _rules(
        SCHEMA.replace('model_config = {"populate_by_name": True, "extra": "forbid"}', "")
    )
    assert slotsconfig.refusal({"nosuch": 1}, rules) is None
    rules = _rules(
        SCHEMA.replace(
            '{"populate_by_name": True, "extra": "forbid"}', 'ConfigDict(extra="forbid")'
        )
    )
    assert slotsconfig.refusal({"nosuch": 1}, rules) is not None


def test_model_config_spellings() -> None:
    for config, forbids in (
        ('ConfigDict(extra="ignore")', False),
        ("ConfigDict(frozen=True)", False),
        ("BASE_CONFIG", False),
        ('{"extra": "allow"}', False),
        ('{"extra": "forbid"}', True),
    ):
        text = SCHEMA.replace('{"populate_by_name": True, "extra": "forbid"}', config)
        assert (slotsconfig.refusal({"nosuch": 1}, _rules(text)) is not None) == forbids, config


def test_only_field_validator_decorators_name_fields() -> None:
    text = SCHEMA.replace('@field_validator("network_mode")', '@other_decorator("network_mode")')
    assert slotsconfig.refusal({"network_mode": "bridge"}, _rules(text)) is None


def test_the_port_range_check_is_the_release_s() -> None:
    reversed_range = {"port_range_start": 9000, "port_range_end": 8999}
    without = SCHEMA.replace("def port_range_sane", "def other_check")
    assert slotsconfig.refusal(reversed_range, _rules(without)) is None
    assert slotsconfig.refusal(reversed_range, _rules(SCHEMA)) is not None


def test_the_release_s_own_fields_and_bounds_are_used() -> None:
    rules = _rules(
        SCHEMA.replace(
            "ge=1024, le=65535)\n    port_range_end", "ge=80, le=65535)\n    port_range_end"
        )
    )
    assert slotsconfig.refusal({"port_range_start": 80}, rules) is None
    rules = _rules(SCHEMA.replace("max_slots: int", "max_slotz: int"))
    assert slotsconfig.refusal({"max_slots": 1}, rules) is not None
    assert slotsconfig.refusal({"max_slotz": -1}, rules) is not None
    rules = _rules(SCHEMA.replace("_PORT_END = 8099", "_PORT_END = 9999"))
    assert slotsconfig.refusal({"port_range_start": 9000}, rules) is None


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("ge=0, description", "ge=_NOSUCH, description", "max_slots"),  # a bound, no literal
        ("ge=0, description", "ge=_TEXT, description", "max_slots"),  # a bound, not an int
        ("max_slots: int", "max_slots: float", "max_slots"),  # a type not judged here
        (
            "max_slots: int = Field(default=0,",
            "max_slots: int = Field(default=0, strict=True,",
            "max_slots",
        ),
        ("def _network_mode_known", "def _network_mode_other", "network_mode"),  # unknown name
        (
            '@field_validator("network_mode")',
            '@field_validator("network_mode", "max_slots")',
            "max_slots",
        ),  # a known validator's code does not cover another field
    ],
)
def test_an_unread_rule_is_not_guessed(old: str, new: str, key: str) -> None:
    assert old in SCHEMA
    rules = _rules(SCHEMA.replace(old, new))
    with pytest.raises(slotsconfig.Unjudged, match=key):
        slotsconfig.refusal({key: -1 if key == "max_slots" else "bridge"}, rules)
    assert slotsconfig.refusal({"nosuch": 1, key: 0}, rules) is not None  # refused anyway
    assert slotsconfig.refusal({"spare": 1}, rules) is None  # the others are judged


def test_no_slots_config_class() -> None:
    assert slotsconfig.read(ast.parse("class Other: pass\n")) is None


def _files(tmp_path: Path, toml: str, schema: str = SCHEMA) -> tuple[Path, Path]:
    config, code = tmp_path / "hal0.toml", tmp_path / "schema.py"
    config.write_text(toml)
    code.write_text(schema)
    return config, code


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        ("", True),
        ("max_slots = 3\n", True),
        ("max_slots = -1\n", False),
        ("unknown = 1\n", False),
        ('port_range_start = "x"\n', False),
        ("port_range_start = 80\n", False),
    ],
)
def test_a_refused_slots_table_gives_no_default_images(
    tmp_path: Path, extra: str, *, kept: bool
) -> None:
    config, schema = _files(tmp_path, '[slots]\ndefault_images = { cpu = "img:1" }\n' + extra)
    problems: list[FactProblem] = []
    raw = operator_files.raw_default_images(config, problems)
    images = operator_files.validated_images(config, raw, {"cpu"}, {}, problems, schema=schema)
    assert images == ({"cpu": "img:1"} if kept else {})
    assert bool(problems) != kept
    assert all("refuses" in p.why and p.path == str(config) for p in problems)


def test_an_unjudged_table_keeps_its_images_and_says_so(tmp_path: Path) -> None:
    text = SCHEMA.replace("max_slots: int", "max_slots: float")
    config, schema = _files(
        tmp_path, '[slots]\nmax_slots = 1\ndefault_images = { cpu = "i" }\n', text
    )
    problems: list[FactProblem] = []
    raw = operator_files.raw_default_images(config, problems)
    images = operator_files.validated_images(config, raw, {"cpu"}, {}, problems, schema=schema)
    assert images == {"cpu": "i"}
    assert len(problems) == 1
    assert "max_slots" in problems[0].why
    assert "used as written" in problems[0].why
