"""Registered names in real gcc-built shared objects, and the identity-keyed cache."""

from __future__ import annotations

import os
import shutil

import pytest

from hal0_reconciler.aiter.registry import cache as registry

NAMES = ["gemm_kernel_1", "gemm_kernel_1_aqrm", "gemm_kernel_10x", "other_kernel_256x16"]


@pytest.fixture(scope="module")
def plain_so(so_builder):
    return so_builder.build(NAMES)


@pytest.fixture(scope="module")
def merged_so(so_builder):
    """-O2 -fmerge-all-constants with -Wl,-O1: ld stores '_1_aqrm' as the tail of a longer string."""
    return so_builder.build(
        ["gemm_kernel_1_aqrm", "_1_aqrm", "kernel_b"],
        flags=("-O2", "-fmerge-all-constants", "-Wl,-O1"),
    )


def test_a_prefix_of_a_registered_name_is_not_registered(plain_so, tmp_path):
    """'gemm_kernel' and 'gemm_kernel_1_a' are prefixes of registered names, not names."""
    scan = registry.Registry(None).scan(plain_so, [*NAMES, "gemm_kernel", "gemm_kernel_1_a"])
    assert {
        **dict.fromkeys(NAMES, True),
        "gemm_kernel": False,
        "gemm_kernel_1_a": False,
    } == scan.registered


def test_exact_suffix_rule_inside_a_longer_string(so_builder):
    """'..._1' is not registered because '..._1_aqrm' is: the NUL must follow the name."""
    so = so_builder.build(["gemm_kernel_1_aqrm"])
    scan = registry.Registry(None).scan(so, ["gemm_kernel_1", "gemm_kernel_1_aqrm"])
    assert scan.registered == {"gemm_kernel_1": False, "gemm_kernel_1_aqrm": True}


def test_tail_merged_strings_are_found(merged_so):
    """A name stored only as the tail of a longer string is still registered (no NUL before it)."""
    data = merged_so.read_bytes()
    assert data.count(b"_1_aqrm\x00") == 1  # the linker really merged it into the longer string
    scan = registry.Registry(None).scan(
        merged_so, ["_1_aqrm", "gemm_kernel_1_aqrm", "kernel", "_1"]
    )
    assert scan.registered == {
        "_1_aqrm": True,
        "gemm_kernel_1_aqrm": True,
        "kernel": False,
        "_1": False,
    }


def test_rule_on_raw_bytes():
    """NUL-terminated exact suffix over bytes, including names with non-printable characters."""
    blob = b"\x01\x02abc_def\x00\xff xyz\x00tail\x00"
    assert registry.registered_in(
        blob, ["abc_def", "def", "abc", "xyz", " xyz", "tai", "q\tz"]
    ) == {
        "abc_def": True,
        "def": True,
        "abc": False,
        "xyz": True,
        " xyz": True,
        "tai": False,
        "q\tz": False,
    }


def test_unchanged_module_is_read_once_and_the_cache_survives_restarts(plain_so, tmp_path):
    """Second scan and a new process (same cache file) cost only stat calls."""
    so = tmp_path / "module_x.so"
    shutil.copyfile(plain_so, so)
    cache = tmp_path / "state" / "registry.json"
    first = registry.Registry(cache)
    first.scan(so, NAMES)
    first.scan(so, NAMES)
    first.save()
    second = registry.Registry(cache)
    scan = second.scan(so, NAMES[:2])
    assert (first.reads, second.reads, scan.read) == (1, 0, False)


def test_changed_module_or_new_names_are_read_again(plain_so, tmp_path):
    """A new mtime (identity) or a name never asked about reads the file again, once."""
    so = tmp_path / "module_x.so"
    shutil.copyfile(plain_so, so)
    reg = registry.Registry(None)
    reg.scan(so, NAMES[:1])
    reg.scan(so, NAMES[:2])
    st = so.stat()
    os.utime(so, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert reg.scan(so, NAMES[:1]).registered == {"gemm_kernel_1": True}
    assert reg.reads == 3


def test_missing_module_is_none():
    """A module that does not exist yet has no scan."""
    assert None is registry.Registry(None).scan(registry.Path("/nonexistent/module_x.so"), ["a"])


def test_corrupt_cache_reads_as_empty(plain_so, tmp_path):
    """An unreadable cache file (here a good one cut short) is ignored and said so, not fatal:
    nothing is taken from it (the module is read again), and the next save writes a good one."""
    so = tmp_path / "module_x.so"
    shutil.copyfile(plain_so, so)
    cache = tmp_path / "registry.json"
    good = registry.Registry(cache)
    good.scan(so, NAMES)
    good.save()
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    reg = registry.Registry(cache)
    assert reg.load_error is not None, "a torn cache file was not reported"
    scan = reg.scan(so, NAMES)
    assert scan is not None
    assert (1, True) == (reg.reads, scan.read), "a corrupt cache did not read as empty"
    assert all(scan.registered.values())
    reg.save()
    again = registry.Registry(cache)
    assert (None, False) == (again.load_error, again.scan(so, NAMES).read), (
        "the cache was not rewritten whole after a corrupt one"
    )


def test_a_cache_of_another_version_is_ignored(tmp_path):
    """A cache file written by another version is not trusted: it is set aside with a reason."""
    from hal0_reconciler.aiter.registry import cache as registry

    cache = tmp_path / "registry.json"
    cache.write_text(
        '{"version": 99, "modules": {"/x.so": {"identity": [1, 2, 3, 4], "names": {"k": true}}}}'
    )
    reg = registry.Registry(cache)
    assert reg.load_error is not None
    assert "version" in reg.load_error
    assert None is reg.scan(registry.Path("/x.so"), ["k"]), "another version's entry was used"


def test_a_cache_of_another_version_is_not_believed(plain_so, tmp_path):
    """Another version's answers for the very same file are not used: the module is read."""
    import json

    so = tmp_path / "module_x.so"
    shutil.copyfile(plain_so, so)
    cache = tmp_path / "registry.json"
    good = registry.Registry(cache)
    good.scan(so, NAMES)
    good.save()
    raw = json.loads(cache.read_text())
    raw["version"] += 1
    raw["modules"][str(so)]["names"] = dict.fromkeys(NAMES, False)
    cache.write_text(json.dumps(raw))
    reg = registry.Registry(cache)
    scan = reg.scan(so, NAMES)
    assert scan is not None
    assert (1, True) == (reg.reads, all(scan.registered.values())), (
        "another version's cache was believed"
    )
