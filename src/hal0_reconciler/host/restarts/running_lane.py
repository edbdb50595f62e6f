"""Which lane a running slot's container was started for, and whether its label is applied.  [pure]

hal0 bakes a slot's devices and image into ``/etc/containers/systemd/hal0-slot@<token>.container``
when it loads the slot (its Quadlet renderer). From hal0's source: a ``cpu`` slot gets no device
lines; every GPU-class slot (``gpu-vulkan`` and ``gpu-rocm`` alike) gets the same ``AddDevice=``
set (``/dev/kfd`` when it exists, then each node of ``/dev/dri``); the two GPU lanes differ only
in ``Image=`` (the runner picked for the device) and, with ``gpu_index``, in a visibility
variable. So the running lane is read from the device lines (GPU or not) and, for a GPU unit,
from the image: the lane whose launch image (as the installed hal0 resolves it) equals
``Image=``. When both GPU lanes launch the same image (a pin, a ``binary``, one runner for both)
or neither matches, which GPU lane runs cannot be told.

From hal0 1.5.0 the llama.cpp argv in the unit's ``Exec=`` line carries ``--device Vulkan0``,
``--device ROCm0`` or ``--device none`` (hal0's ``_LANE_DEVICE``): on such a release that marker
alone tells the lanes apart, whatever the images.

Whose change is applied (the restart goes through the idle-then-restart path): a label this
daemon wrote, and hal0's own relabel pass (running ``gpu-vulkan``, labelled ``gpu-rocm`` or
``cpu`` now). Any other change is reported "label not applied" unless ``apply_others_labels``.
With ``HAL0_ALLOW_VULKAN_FALLBACK`` set nothing Vulkan-related is applied.
"""

from __future__ import annotations

import enum
import hashlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

CPU = "cpu"
GPU_VULKAN = "gpu-vulkan"
GPU_ROCM = "gpu-rocm"
LANES = frozenset({CPU, GPU_VULKAN, GPU_ROCM})
GPU_LANES = (GPU_VULKAN, GPU_ROCM)
HAL0_RELABEL_TARGETS = frozenset({GPU_ROCM, CPU})  # what hal0's relabel writes over gpu-vulkan
_GPU_NODES = ("/dev/kfd", "/dev/dri")
DEVICE_MARKERS = {"Vulkan0": GPU_VULKAN, "ROCm0": GPU_ROCM, "none": CPU}  # 1.5+'s --device


@dataclass(frozen=True)
class RenderedUnit:
    """What a rendered ``.container`` file says about the lane it was started for."""

    image: str | None  # the ``Image=`` value (None: no such line)
    devices: tuple[str, ...]  # the host paths of the ``AddDevice=`` lines, in order
    device_flag: str | None = None  # the last ``--device`` value of ``Exec=`` (1.5+)

    @property
    def gpu(self) -> bool:
        """A GPU node is passed in (``/dev/kfd`` or anything of ``/dev/dri``)."""
        return any(d == n or d.startswith(n + "/") for d in self.devices for n in _GPU_NODES)

    def fingerprint(self) -> str:
        """Short digest of the image and devices: a change of either is a new rendering."""
        flag = [self.device_flag] if self.device_flag is not None else []
        text = "\n".join([self.image or "", *self.devices, *flag])
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def parse_container(text: str) -> RenderedUnit:
    """The ``[Container]`` section's ``Image=`` (last wins) and ``AddDevice=`` lines.

    Quadlet's syntax is systemd's: ``#``/``;`` comments, ``Key=value``; an ``AddDevice=`` value
    is ``[-]host[:container[:perms]]`` (a leading ``-`` makes it optional).
    """
    section = ""
    image: str | None = None
    devices: list[str] = []
    flag: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section != "Container" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if key == "Image":
            image = value or None
        elif key == "AddDevice" and value:
            host = value.removeprefix("-").split(":", 1)[0]
            if host:
                devices.append(host)
        elif key == "Exec":
            flag = _device_flag(value)
    return RenderedUnit(image, tuple(devices), flag)


def _device_flag(argv: str) -> str | None:
    """The value of the last ``--device`` (or ``--device=``) of an ``Exec=`` argv."""
    try:
        words = shlex.split(argv)
    except ValueError:
        return None
    found: str | None = None
    for i, word in enumerate(words):
        if word == "--device" and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith("--device="):
            found = word.partition("=")[2]
    return found


@dataclass(frozen=True)
class Running:
    """The lanes a rendered unit may have been started for (one: known), and why."""

    lanes: frozenset[str]
    why: str

    def shown(self) -> str:
        if len(self.lanes) == 1:
            return next(iter(self.lanes))
        return "a GPU lane (which one cannot be told)" if self.lanes else "cannot tell"


def running_lanes(
    unit: RenderedUnit, launch_images: Mapping[str, str | None], *, marker: bool = False
) -> Running:
    """The lane(s) ``unit`` may run: with ``marker`` (hal0 1.5+) its ``--device`` value;
    else no GPU node -> cpu; GPU nodes -> the GPU lane(s) whose launch image
    (``launch_images[lane]``, as hal0 resolves it now) equals ``Image=``."""
    lane = DEVICE_MARKERS.get(unit.device_flag or "") if marker else None
    if lane is not None:
        return Running(frozenset({lane}), f"--device {unit.device_flag} in the rendered Exec=")
    if not unit.gpu:
        return Running(frozenset({CPU}), "no GPU device in the rendered unit")
    matching = frozenset(
        lane for lane in GPU_LANES if unit.image and launch_images.get(lane) == unit.image
    )
    if len(matching) == 1:
        return Running(matching, f"GPU devices and the {next(iter(matching))} image")
    if matching:
        why = "GPU devices; gpu-vulkan and gpu-rocm launch the same image"
    else:
        why = f"GPU devices; image {unit.image or '(none)'} is neither lane's launch image"
    return Running(frozenset(GPU_LANES), why)


class LabelState(enum.StrEnum):
    """How a running slot's label stands (``not-applied`` and ``cannot-tell`` are reported)."""

    APPLIED = "applied"  # the running container was started for its label
    APPLY = "apply"  # not applied, and ours to apply: restarted by the idle-then-restart path
    TRIED = "tried"  # not applied; a restart was made for this very change already
    NOT_APPLIED = "not-applied"  # not applied, and not ours to apply (reported)
    CANNOT_TELL = "cannot-tell"  # what runs cannot be told from the rendered unit (reported)


@dataclass(frozen=True)
class LabelCheck:
    """One running slot: its label, what runs, the state and the reason in words."""

    label: str
    running: str
    state: LabelState
    reason: str


@dataclass(frozen=True)
class Intent:
    """Who wrote the label, and what the operator allowed (the facts ``judge`` weighs)."""

    ours: bool = False  # this daemon wrote the label now in the file
    tried: bool = False  # a restart was already made for this label and this rendering
    apply_others: bool = False  # the ``apply_others_labels`` setting
    vulkan_paused: bool = False  # HAL0_ALLOW_VULKAN_FALLBACK is set in hal0's environment


def judge(label: str, running: Running, intent: Intent) -> LabelCheck:
    """Whether ``label`` is what runs, and if not, whether this daemon applies it."""
    shown = running.shown()

    def check(state: LabelState, reason: str) -> LabelCheck:
        return LabelCheck(label, shown, state, reason)

    if running.lanes == {label}:
        return check(LabelState.APPLIED, running.why)
    if label in running.lanes:
        return check(LabelState.CANNOT_TELL, f"{running.why}: whether {label} runs cannot be told")
    if intent.vulkan_paused and (label == GPU_VULKAN or GPU_VULKAN in running.lanes):
        return check(
            LabelState.NOT_APPLIED,
            "HAL0_ALLOW_VULKAN_FALLBACK is set: nothing Vulkan-related is applied",
        )
    hal0s = running.lanes == {GPU_VULKAN} and label in HAL0_RELABEL_TARGETS
    if intent.ours or hal0s or intent.apply_others:
        if intent.tried:
            return check(LabelState.TRIED, "a restart for this change was made already")
        if intent.ours:
            return check(LabelState.APPLY, "label written by hal0-reconciler")
        if hal0s:
            return check(LabelState.APPLY, "label written by hal0's relabel pass")
        return check(LabelState.APPLY, "apply_others_labels = true")
    if len(running.lanes) != 1:
        return check(
            LabelState.NOT_APPLIED,
            f"{running.why}; not written by hal0-reconciler, and whether hal0's relabel pass "
            "wrote it cannot be told",
        )
    return check(
        LabelState.NOT_APPLIED,
        "changed by another writer (not hal0-reconciler, not hal0's relabel pass); "
        "apply_others_labels = true applies such changes",
    )


def cannot_read(label: str, why: str) -> LabelCheck:
    """A rendered unit that could not be read: reported, nothing applied."""
    return LabelCheck(label, "cannot tell", LabelState.CANNOT_TELL, why)
