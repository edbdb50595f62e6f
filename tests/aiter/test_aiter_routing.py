"""Routing data: table + libtype → module, shipped as TOML."""

from __future__ import annotations

import re

import pytest
from aiter_support import BPS, BPS_CK, BPS_CKTILE, route_of

from hal0_reconciler.aiter.rules import routing


def test_blockscale_bpreshuffle_cktile_rows_go_to_their_own_module(rules):
    """Since aiter #2069 the cktile rows compile into *_bpreshuffle_cktile, not *_blockscale_cktile."""
    route = route_of(rules, BPS)
    assert route.module_for("cktile", "a8w8_blockscale_cktile_x") == BPS_CKTILE
    assert route.module_for("ck", "a8w8_blockscale_x") == BPS_CK


@pytest.mark.parametrize(
    ("libtype", "name"),
    [
        ("asm", "_ZN5aiter42fp8gemm"),
        ("triton", "t"),
        ("flydsl", "f"),
        ("opus", "o"),
        ("gluon", "g"),
        ("torch", "x"),
        ("skinny", "s"),
    ],
)
def test_libtypes_outside_modules_are_skipped(rules, libtype, name):
    """Only ck and cktile rows are compiled into a module_*.so."""
    assert None is route_of(rules, BPS).module_for(libtype, name)


def test_tables_without_libtype_skip_asm_names(rules):
    """Without a libtype column, a `_ZN` name is an asm kernel; other names go to the module."""
    route = route_of(rules, "a4w4_blockscale_tuned_gemm")
    assert None is route.module_for(None, "_ZN5aiter41f4gemm_bf16")
    assert route.module_for(None, "a4w4_kernel") == "module_gemm_a4w4_blockscale"


def test_keying_decides_severity(rules):
    """Blockscale tables are name-keyed (crash); a8w8/bpreshuffle/batched are shape-keyed."""
    assert route_of(rules, BPS).keyed == routing.Keyed.NAME
    assert route_of(rules, "a8w8_bpreshuffle_tuned_gemm").keyed == routing.Keyed.SHAPE
    assert not route_of(rules, "tuned_fmoe").compiled


def test_unknown_version_is_an_error_naming_the_known_ones():
    """Asking for a version the data does not hold names the versions it does."""
    text = 'default = "v1"\n[versions.v1.tables.t]\nvariable = "AITER_CONFIG_T"\n'
    with pytest.raises(routing.RoutingError, match="v1"):
        routing.parse_routing(text, version="v2")


def test_operator_routing_overrides_modules():
    """Operator data can route a table anywhere (module names must start with module_)."""
    text = (
        'default = "x"\n[versions.x.tables.s]\nvariable = "AITER_CONFIG_S"\nkeyed = "name"\n'
        'modules = { ck = "module_other" }\n'
    )
    assert routing.parse_routing(text).tables[0].module_for("ck", "k") == "module_other"
    with pytest.raises(routing.RoutingError, match="modules"):
        routing.parse_routing(text.replace("module_other", "other"))


_BASE = 'default = "x"\n[versions.x.tables.s]\nvariable = "AITER_CONFIG_S"\n'


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[versions.x.registries.opus]\nlibtype = "opus"\ncolumns = ["id"]\n', "module_"),
        ('[versions.x.registries.module_o]\ncolumns = ["id"]\n', "libtype"),
        ('[versions.x.registries.module_o]\nlibtype = "opus"\n', "columns"),
        (
            (
                '[versions.x.registries.module_o]\nlibtype = "opus"\ncolumns = ["id"]\n'
                'tables = ["nope"]\n'
            ),
            "not a table",
        ),
        (
            (
                '[versions.x.registries.module_o]\nlibtype = "opus"\ncolumns = ["id"]\n'
                'files = ["../../etc/x.csv"]\n'
            ),
            "relative to configs",
        ),
        (
            (
                '[versions.x.registries.module_o]\nlibtype = "opus"\ncolumns = ["id"]\n'
                'sidecar = "/etc/shadow"\n'
            ),
            "relative to the JIT folder",
        ),
        ('[versions.x.prefixes]\n"a_" = ["other"]\n', "prefixes"),
        ('[versions.x.tables.t]\nvariable = "AITER_CONFIG_T"\nkeyed = "id"\n', "registries"),
    ],
)
def test_malformed_registries_and_prefixes_name_the_key(extra, key):
    """Operator routing data for id-keyed modules and name prefixes is checked, never trusted."""
    with pytest.raises(routing.RoutingError, match=key):
        routing.parse_routing(_BASE + extra)


def test_the_shipped_opus_registry_and_prefixes(rules):
    """module_deepgemm_opus: opus rows by solidx/kernelId from the resolved blockscale-bpreshuffle
    table and the fixed bf16 tables; the cktile prefix names both cktile modules."""
    (reg,) = rules.registries
    assert (reg.module, reg.tables, reg.route.columns) == (
        "module_deepgemm_opus",
        ("a8w8_blockscale_bpreshuffle_tuned_gemm",),
        ("solidx", "kernelId"),
    )
    assert rules.modules_for_name("a8w8_blockscale_cktile_x") == (
        "module_gemm_a8w8_blockscale_cktile",
        "module_gemm_a8w8_blockscale_bpreshuffle_cktile",
    )
    assert rules.modules_for_name("a8w8_blockscale_bpreshuffle_x") == (
        "module_gemm_a8w8_blockscale_bpreshuffle",
    )
    assert rules.modules_for_name("unknown_x") == ()


_REG = '[versions.x.registries.module_o]\nlibtype = "opus"\ncolumns = ["id"]\n'


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('default = "x"\n[versions.x', "not valid TOML"),
        ('default = "x"\n[versions.x]\nother = 1\n', "lists no tables"),
        ('default = "x"\n[versions.x]\ntables = 3\n', "lists no tables"),
        (_BASE + "[versions.x]\nregistries = 3\n", "registries must be a table"),
        (_BASE + _REG + "bogus = 1\n", "unknown key 'bogus'"),
        (_BASE + _REG.replace('"opus"', '""'), "libtype must name"),
        (_BASE + _REG.replace('["id"]', '"id"'), "columns must be a list of strings"),
        (_BASE + _REG.replace('["id"]', '["id", ""]'), "columns must be a list of strings"),
        ('default = "x"\n[versions.x.tables]\ns = 3\n', "tables.s must be a table"),
        (_BASE + "bogus = 1\n", "unknown key 'bogus'"),
        (_BASE.replace('"AITER_CONFIG_S"', '"CONFIG_S"'), "variable must be an AITER_*"),
        (_BASE.replace('"AITER_CONFIG_S"', "3"), "variable must be an AITER_*"),
        (_BASE + 'keyed = "row"\n', "keyed must be 'name' or 'shape'"),
        (_BASE + "columns = []\n", "columns must be a non-empty list"),
        (_BASE + 'columns = "kernelName"\n', "columns must be a non-empty list"),
        (_BASE + 'columns = ["kernelName", 3]\n', "columns must be a non-empty list"),
    ],
    ids=[
        "torn",
        "no-tables",
        "tables-not-a-table",
        "registries-not-a-table",
        "registry-unknown-key",
        "empty-libtype",
        "registry-columns-a-string",
        "an-empty-column",
        "route-not-a-table",
        "route-unknown-key",
        "variable-not-aiters",
        "variable-not-a-string",
        "unknown-keying",
        "no-columns",
        "columns-a-string",
        "a-column-not-a-string",
    ],
)
def test_malformed_routing_data_is_refused_with_what_is_wrong(text, words):
    """Routing data (shipped or the operator's) that is not exactly what the reader knows is a
    RoutingError naming the fault, never another exception or a half-read routing."""
    with pytest.raises(routing.RoutingError, match=re.escape(words)):
        routing.parse_routing(text)


def test_a_module_is_found_by_the_routes_that_name_it():
    """``by_module``: the tables routed to a module and its id registry, nothing else."""
    text = (
        'default = "x"\n[versions.x.tables.s]\nvariable = "AITER_CONFIG_S"\n'
        'modules = { ck = "module_a" }\n' + _REG
    )
    rules = routing.parse_routing(text)
    assert ["s"] == [t.stem for t in rules.by_module("module_a")]
    assert ["module_o"] == [t.stem for t in rules.by_module("module_o")]
    assert () == rules.by_module("module_z")
