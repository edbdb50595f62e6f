"""The build target: KFD topology, GPU_ARCHS / CU_NUM, explicit settings."""

from __future__ import annotations

import pytest

from hal0_reconciler.aiter import target
from hal0_reconciler.aiter.tables import Target


@pytest.mark.parametrize(
    ("version", "gfx"),
    [(90402, "gfx942"), (110501, "gfx1151"), (90010, "gfx90a"), (90500, "gfx950")],
)
def test_gfx_name_from_kfd_version(version, gfx):
    """gfx_target_version: major, minor and stepping (hex) digits."""
    assert gfx == target.gfx_name(version)


@pytest.fixture
def kfd(tmp_path):
    nodes = tmp_path / "nodes"
    for i, props in enumerate(
        [
            "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n",
            "simd_count 1216\nsimd_per_cu 4\ngfx_target_version 90402\n",
        ]
    ):
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "properties").write_text(props)
    return nodes


def test_kfd_topology_gives_gfx_and_cus(kfd):
    """CUs = simd_count / simd_per_cu; CPU nodes are skipped."""
    assert (frozenset({Target("gfx942", 304)}), None) == target.read_kfd(kfd)


@pytest.mark.parametrize(
    ("setting", "env", "expected"),
    [
        ("auto", {}, {Target("gfx942", 304)}),
        ("auto", {"CU_NUM": "80"}, {Target("gfx942", 80)}),
        ("auto", {"GPU_ARCHS": "gfx950", "CU_NUM": "256"}, {Target("gfx950", 256)}),
        ("auto", {"GPU_ARCHS": "gfx942"}, {Target("gfx942", 304)}),
        ("gfx1151:40", {"GPU_ARCHS": "gfx950"}, {Target("gfx1151", 40)}),
    ],
)
def test_target_choice(kfd, setting, env, expected):
    """Explicit setting wins; else GPU_ARCHS / CU_NUM over the KFD reading."""
    assert (
        frozenset(expected) == target.choose_target(setting, env, kfd=target.read_kfd(kfd)).targets
    )


def test_no_gpu_is_an_error_not_a_guess(tmp_path):
    """Without a KFD GPU and without overrides the target is unknown (nothing is healed)."""
    choice = target.choose_target("auto", {}, kfd=target.read_kfd(tmp_path / "absent"))
    assert (frozenset(), True) == (choice.targets, choice.error is not None)
