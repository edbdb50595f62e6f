"""The prefix-grouped name search answers exactly what the registry rule says: a name is
registered when its bytes followed by a NUL occur in the module."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.aiter.registry import cache as registry
from hal0_reconciler.aiter.registry import names as namescan
from hal0_reconciler.aiter.registry import scan as modulescan

ALPHABET = st.sampled_from(list(b"ab_x0\x00\x01 ~\xff"))
NAME_CHARS = st.sampled_from(list("ab_x0 ~\x01é"))


def _rule(data: bytes, name: str) -> bool:
    raw = name.encode("utf-8", "surrogateescape")
    return bool(raw) and (raw + b"\x00") in data


@settings(max_examples=400, deadline=None)
@given(
    data=st.lists(ALPHABET, max_size=200).map(bytes),
    names=st.sets(st.text(NAME_CHARS, max_size=12), max_size=8),
    plant=st.integers(0, 7),
)
def test_matches_the_rule(data: bytes, names: set[str], plant: int) -> None:
    ordered = sorted(names)
    if ordered:  # plant one name, often as the tail of a longer string
        data += b"zz" + ordered[plant % len(ordered)].encode() + b"\x00"
    answer = registry.registered_in(data, names)
    assert {n: _rule(data, n) for n in names} == answer
    assert answer == registry.registered_in_runs(data, names)


def test_many_unrelated_names_take_the_single_pass() -> None:
    names = {f"{i:02d}_name_{i}" for i in range(40)}  # 40 prefixes: more than the groups cap
    data = b"\x00".join(n.encode() for n in sorted(names)[::2]) + b"\x00"
    calls: list[int] = []

    def fallback(d: bytes, wanted: set[str]) -> dict[str, bool]:
        calls.append(len(wanted))
        return registry.registered_in_runs(d, wanted)

    answer = namescan.registered_in(data, names, fallback=fallback)
    assert [40] == calls
    assert {n: _rule(data, n) for n in names} == answer


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 4096, 1 << 20])
def test_over_a_file_read_in_chunks(tmp_path: Path, chunk: int) -> None:
    """A name on a chunk boundary is found: each chunk carries the longest name's bytes over."""
    path = tmp_path / "m.so"
    path.write_bytes(b"\x00" * 4093 + b"xkernel_a_1\x00kernel_a_12\x00" + b"\x7f" * 100)
    names = {"kernel_a_1", "kernel_a_12", "kernel_a", "el_a_1"}
    fd = os.open(path, os.O_RDONLY)
    try:
        got = modulescan.scan_fd(fd, names, max_bytes=1 << 20, chunk=chunk)
    finally:
        os.close(fd)
    assert modulescan.Outcome.SCANNED is got.outcome
    assert {"kernel_a_1", "kernel_a_12", "el_a_1"} == got.found


def test_an_occurrence_overlapping_an_earlier_prefix_hit_is_found() -> None:
    """ "kk_kk_1" in "kk_kk_kk_1": the prefix hits at 0, 3 and 6; only 3 ends at the NUL."""
    data = b"\x00kk_kk_kk_1\x00"
    assert {"kk_kk_1": True} == registry.registered_in(data, {"kk_kk_1"})
    assert {"aa": True} == registry.registered_in(b"aaa\x00", {"aa"})


@settings(max_examples=200, deadline=None)
@given(
    content=st.lists(ALPHABET, max_size=300).map(bytes),
    names=st.sets(st.text(NAME_CHARS, max_size=6), max_size=6),
    chunk=st.integers(1, 64),
)
def test_chunked_reads_answer_what_the_whole_file_does(
    content: bytes, names: set[str], chunk: int
) -> None:
    """``modulescan`` over a file read ``chunk`` bytes at a time finds exactly the names the
    rule finds over the whole content."""
    with tempfile.TemporaryFile() as fh:
        fh.write(content)
        fh.flush()
        got = modulescan.scan_fd(fh.fileno(), names, max_bytes=1 << 20, chunk=chunk)
    assert modulescan.Outcome.SCANNED is got.outcome
    assert {n for n in names if _rule(content, n)} == got.found


def test_a_name_holding_a_nul_is_searched_for_as_it_is() -> None:
    """A name that is no C string (a NUL inside) is looked for with its own bytes and a NUL."""
    data = b"zz" + b"ab\x00cd\x00" + b"zz"
    assert {"ab\x00cd": True, "ab\x00ce": False} == namescan.registered_in(
        data, ["ab\x00cd", "ab\x00ce"]
    )


def test_names_of_one_group_are_each_found_past_their_common_prefix() -> None:
    """Names sharing their first bytes are searched by what they all share, not by one of them:
    the group's other members are found too."""
    names = ["module_fmha_bwd", "module_fmha_fwd_one", "module_fmha_fwd_two"]
    data = b"\x00module_fmha_fwd_two\x00 module_fmha_bwd\x00"
    assert {
        "module_fmha_bwd": True,
        "module_fmha_fwd_one": False,
        "module_fmha_fwd_two": True,
    } == namescan.registered_in(data, names)


def test_a_name_holding_a_nul_keeps_its_answer_beside_names_sharing_its_start() -> None:
    """A name with a NUL after eight shared bytes is answered by its own search only: the
    group of the names it shares them with never answers for it."""
    data = b"zz" + b"abcdefgh\x00x\x00" + b"zz"
    assert {"abcdefgh\x00x": True, "abcdefgh1": False} == namescan.registered_in(
        data, ["abcdefgh\x00x", "abcdefgh1"]
    )
