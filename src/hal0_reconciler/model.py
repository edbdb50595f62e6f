"""Shared vocabulary: keys, closed sets and the records that cross module boundaries."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

SlotKey = NewType("SlotKey", str)
"""Identifies one slot file: its absolute path as a string."""


class Device(enum.StrEnum):
    """The device labels hal0 accepts."""

    GPU_ROCM = "gpu-rocm"
    GPU_VULKAN = "gpu-vulkan"
    GPU_CUDA = "gpu-cuda"
    CPU = "cpu"
    NPU = "npu"


class Runtime(enum.StrEnum):
    """What hal0 runs for a slot (the first matching row of hal0's runtime table)."""

    FLM = "flm"
    QWEN3TTS = "qwen3tts"
    KOKORO = "kokoro"
    STT = "stt"
    COMFYUI = "comfyui"
    LLAMA_SERVER = "llama-server"
    UNRESOLVED = "unresolved"


class DeviceSource(enum.StrEnum):
    """Where a slot's effective device label came from."""

    DEVICE = "device"
    LEGACY_BACKEND = "backend"
    DEFAULT = "default"


class Action(enum.StrEnum):
    KEEP = "keep"
    RELABEL = "relabel"
    SKIP = "skip"


class Reason(enum.StrEnum):
    """Why the policy decided what it decided. Stable strings: they appear in logs and JSON."""

    NOT_AMD_HOST = "not-amd-host"
    NOT_LLAMA_CPP = "runtime-not-llama-cpp"
    RUNTIME_UNRESOLVED = "runtime-unresolved"
    NOT_VULKAN = "device-not-gpu-vulkan"
    VULKAN_VALIDATED_IMAGE = "image-vulkan-validated"
    VULKAN_RETIRED_ROCM_USABLE = "vulkan-retired-rocm-usable"
    VULKAN_RETIRED_ROCM_UNUSABLE = "vulkan-retired-rocm-unusable"
    DEMOTION_GRACE = "rocm-unusable-within-grace"
    LANE_UNKNOWN = "rocm-lane-unknown-probe-failed"
    RESTORE_OWN_DEMOTION = "rocm-usable-again-restore-own-demotion"


class LaneState(enum.StrEnum):
    """The ROCm lane as the policy sees it."""

    USABLE = "usable"
    UNUSABLE = "unusable"
    UNSETTLED = "unsettled"  # unusable, but not yet for the whole demotion grace
    UNKNOWN = "unknown"  # the probe itself could not run (no such user, interpreter gone...)


class FailureKind(enum.StrEnum):
    """Why one device node could not be opened by the service user."""

    MISSING = "missing"  # ENOENT / ENXIO / ENODEV
    PERMISSION = "permission"  # EACCES: mode, owner, group
    POLICY = "policy"  # EPERM: device cgroup, sandbox, LSM
    NOT_CHAR_DEVICE = "not-char-device"
    OTHER = "other"


@dataclass(frozen=True)
class NodeFailure:
    path: str
    kind: FailureKind
    errno: int | None
    message: str


@dataclass(frozen=True)
class Credentials:
    """Who the probe runs as."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class ProbeResult:
    """The ROCm-lane verdict for the service user."""

    usable: bool
    credentials: Credentials | None
    kfd_ok: bool
    render_node: str | None  # the render node that opened, if any
    failures: tuple[NodeFailure, ...] = ()
    error: str | None = None  # the probe itself could not run

    @property
    def reason(self) -> str:
        """One short line: why the lane is (un)usable."""
        if self.error is not None:
            return f"probe failed: {self.error}"
        if self.usable:
            return f"the KFD node and {self.render_node} open read-write as the service user"
        return "; ".join(f"{f.path}: {f.kind} ({f.message})" for f in self.failures) or "unusable"


@dataclass(frozen=True)
class HostFacts:
    """A snapshot of what the host offers, as the policy needs it."""

    amd: bool
    lane: LaneState
    probe: ProbeResult | None = None

    @property
    def lane_reason(self) -> str:
        return self.probe.reason if self.probe is not None else self.lane.value


@dataclass(frozen=True)
class Verdict:
    """What the policy decided for one slot, and why."""

    action: Action
    reason: Reason
    runtime: Runtime
    old: str
    new: str | None = None

    @property
    def changes(self) -> bool:
        return self.action is Action.RELABEL


@dataclass(frozen=True)
class ProfileInfo:
    """What hal0's profile catalog says about one profile."""

    name: str
    runtime_family: str | None
    image: str | None = None
    backend: str | None = None
    device_class: str | None = None


@dataclass(frozen=True)
class Catalog:
    """hal0's profile catalog: built-in profiles overlaid by the profiles file."""

    profiles: dict[str, ProfileInfo] = field(default_factory=dict)
    error: str | None = (
        None  # the profiles file could not be read: every profiled slot is unresolved
    )
