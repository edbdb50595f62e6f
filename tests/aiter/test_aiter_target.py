"""The build target: KFD topology, GPU_ARCHS / CU_NUM, explicit settings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.aiter.tables import target
from hal0_reconciler.aiter.tables.rows import Target


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


BUILD_CU = {"gfx942": 304, "gfx950": 256, "gfx1250": 256}
G942_304, G942_80 = Target("gfx942", 304), Target("gfx942", 80)


@pytest.mark.parametrize(
    ("setting", "env", "lookup", "compiled"),
    [
        pytest.param("auto", {}, {G942_304}, {G942_304}, id="live GPU"),
        pytest.param("auto", {"CU_NUM": "80"}, {G942_80}, {G942_80}, id="CU_NUM both"),
        pytest.param("auto", {"CU_NUM": "0"}, {G942_304}, {G942_304}, id="CU_NUM=0 is live"),
        pytest.param(
            "auto", {"GPU_ARCHS": "native"}, {G942_304}, {G942_304}, id="native is the live GPU"
        ),
        pytest.param(
            "auto",
            {"GPU_ARCHS": "gfx950", "CU_NUM": "256"},
            {Target("gfx942", 256)},
            {Target("gfx950", 256)},
            id="GPU_ARCHS builds, the live gfx looks up",
        ),
        pytest.param(
            "auto",
            {"GPU_ARCHS": " gfx942;gfx950 "},
            {G942_304},
            {G942_304, Target("gfx950", 256)},
            id="several arches, per-arch CUs",
        ),
        pytest.param(
            "gfx1151:40", {"GPU_ARCHS": "gfx950"}, {Target("gfx1151", 40)}, {Target("gfx1151", 40)}
        ),
    ],
)
def test_target_choice(kfd, setting, env, lookup, compiled):
    """Explicit setting wins; else the runtime looks up the live gfx with CU_NUM or the live
    CUs, and the build compiles GPU_ARCHS with CU_NUM or aiter's per-arch default."""
    choice = target.choose_target(setting, env, kfd=target.read_kfd(kfd), build_cu=BUILD_CU)
    assert (frozenset(lookup), frozenset(compiled)) == (choice.lookup, choice.compiled)


def test_gpu_archs_without_cu_num_on_a_smaller_part_compiles_other_rows(tmp_path):
    """GPU_ARCHS=gfx942 on an 80-CU gfx942 without CU_NUM: aiter compiles the cu-304 rows while
    the runtime looks up the cu-80 rows; the choice names the variables."""
    node = tmp_path / "nodes" / "1"
    node.mkdir(parents=True)
    (node / "properties").write_text("simd_count 320\nsimd_per_cu 4\ngfx_target_version 90402\n")
    choice = target.choose_target(
        "auto", {"GPU_ARCHS": "gfx942"}, kfd=target.read_kfd(tmp_path / "nodes"), build_cu=BUILD_CU
    )
    assert (frozenset({G942_80}), frozenset({G942_304})) == (choice.lookup, choice.compiled)
    assert choice.why_apart is not None
    assert "GPU_ARCHS=gfx942 with CU_NUM unset" in choice.why_apart
    assert str(choice) == "gfx942:80 (compiled for gfx942:304)"


@pytest.mark.parametrize("archs", ["gfx1151", "gfx942,gfx950", " ; "])
def test_gpu_archs_aiter_cannot_build_is_an_error(kfd, archs):
    """An arch aiter's build refuses (or a ','-separated list, which aiter reads as one name)."""
    choice = target.choose_target(
        "auto", {"GPU_ARCHS": archs}, kfd=target.read_kfd(kfd), build_cu=BUILD_CU
    )
    assert (frozenset(), True) == (choice.targets, choice.error is not None)
    assert "refuses" in str(choice.error)


def test_no_gpu_is_an_error_not_a_guess(tmp_path):
    """Without a KFD GPU and without overrides the target is unknown (nothing is healed)."""
    choice = target.choose_target(
        "auto", {}, kfd=target.read_kfd(tmp_path / "absent"), build_cu=BUILD_CU
    )
    assert (frozenset(), True) == (choice.targets, choice.error is not None)


@settings(max_examples=300, deadline=None)
@given(
    archs=st.lists(st.sampled_from([*"gfx9425 ;,:1n", "native", "gfx950"]), max_size=12).map(
        "".join
    ),
    cu=st.sampled_from(["", "0", "80", "x"]),
)
def test_any_gpu_archs_is_a_build_aiter_accepts_or_an_error(archs, cu):
    """Whatever GPU_ARCHS holds: an error, or build targets only for arches aiter builds, while
    the runtime always looks up the live GPU's gfx."""
    env = {"GPU_ARCHS": archs, "CU_NUM": cu}
    choice = target.choose_target("auto", env, kfd=(frozenset({G942_304}), None), build_cu=BUILD_CU)
    if choice.error is None:
        assert {t.gfx for t in choice.compiled} <= set(BUILD_CU)
        assert {t.gfx for t in choice.lookup} == {"gfx942"}
