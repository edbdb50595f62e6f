"""Properties of reading a rendered Quadlet unit: any text is read without an error, and the
``[Container]`` section's device and image lines are exactly what is reported."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.host.restarts import running_lane

_PATH = st.from_regex(r"/dev/[a-z]{1,6}(/[a-zA-Z0-9]{1,8}){0,2}", fullmatch=True)
_IMAGE = st.from_regex(r"[a-z0-9.]{1,12}/[a-z0-9-]{1,12}:[a-z0-9.]{1,8}", fullmatch=True)
_OTHER = st.sampled_from(["Environment=A=1", "Exec=llama-server", "# AddDevice=/dev/kfd", "; x"])


def _device_line(path: str, optional: bool, container: bool) -> str:
    value = ("-" if optional else "") + path + (f":{path}:rwm" if container else "")
    return f"AddDevice={value}"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_any_text_is_read_without_an_error(text: str) -> None:
    """Whatever a unit file holds, reading it gives a unit, never an exception."""
    unit = running_lane.parse_container(text)
    assert isinstance(unit.devices, tuple)
    assert unit.image is None or "\n" not in unit.image


@settings(max_examples=200, deadline=None)
@given(
    devices=st.lists(st.tuples(_PATH, st.booleans(), st.booleans()), max_size=6),
    image=_IMAGE,
    noise=st.lists(_OTHER, max_size=4),
    decoys=st.lists(_PATH, max_size=3),
)
def test_the_container_sections_devices_and_image_are_what_is_reported(
    devices: list[tuple[str, bool, bool]], image: str, noise: list[str], decoys: list[str]
) -> None:
    """Each ``AddDevice=`` host path of ``[Container]`` is reported in order (an optional ``-``
    and a container path dropped), its last ``Image=`` wins, and lines of other sections or
    comments count for nothing."""
    lines = ["[Unit]", *(f"AddDevice={d}" for d in decoys), "Image=decoy/unit:1", "[Container]"]
    lines += ["Image=first/image:0", *noise]
    lines += [_device_line(p, o, c) for p, o, c in devices]
    lines += [f"Image={image}", "[Service]", *(f"AddDevice={d}" for d in decoys), "Image=x/y:z"]
    unit = running_lane.parse_container("\n".join(lines) + "\n")
    assert (image, tuple(p for p, _, _ in devices)) == (unit.image, unit.devices)


@pytest.mark.parametrize(
    ("exec_line", "marker", "lanes"),
    [
        ("/app/llama-server --port 8081 --device Vulkan0", True, {"gpu-vulkan"}),
        ("/app/llama-server --device=ROCm0 -ngl 99", True, {"gpu-rocm"}),
        ("/app/llama-server --device none", True, {"cpu"}),
        ("/app/llama-server --device Vulkan0", False, {"gpu-vulkan", "gpu-rocm"}),  # 1.4.0
        ("/app/llama-server --device 'unclosed", True, {"gpu-vulkan", "gpu-rocm"}),
        ("/app/llama-server --device CUDA0", True, {"gpu-vulkan", "gpu-rocm"}),
    ],
)
def test_the_device_marker_of_1_5_tells_the_gpu_lanes_apart(
    exec_line: str, marker: bool, lanes: set[str]
) -> None:
    """From hal0 1.5.0 the rendered Exec= carries --device Vulkan0|ROCm0|none: with the
    marker, that alone is the lane; without (1.4.0), one image for both lanes tells nothing."""
    text = (
        "[Container]\nImage=registry.example/runner:1\nAddDevice=/dev/kfd\n"
        f"AddDevice=/dev/dri/renderD128\nExec={exec_line}\n"
    )
    unit = running_lane.parse_container(text)
    images = {"gpu-vulkan": "registry.example/runner:1", "gpu-rocm": "registry.example/runner:1"}
    assert lanes == set(running_lane.running_lanes(unit, images, marker=marker).lanes)
