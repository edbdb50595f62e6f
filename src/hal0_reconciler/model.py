"""Shared vocabulary: keys, closed sets and the records that cross module boundaries."""

from __future__ import annotations

import enum
from collections.abc import Mapping
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
    VULKAN_CAPABLE_IMAGE = "image-vulkan-capable"
    NOT_CAPABLE_ROCM_USABLE = "image-not-vulkan-capable-rocm-usable"
    NOT_CAPABLE_ROCM_UNUSABLE = "image-not-vulkan-capable-rocm-unusable"
    DEMOTION_GRACE = "rocm-unusable-within-grace"
    LANE_UNKNOWN = "rocm-lane-unknown-probe-failed"
    RESTORE_OWN_DEMOTION = "rocm-usable-again-restore-own-demotion"
    PRE_RULE = "hal0-era-without-vulkan-rule"  # the installed hal0 runs gpu-vulkan as normal
    HAL0_NOT_PLACEABLE = "hal0-not-placeable-nothing-moved"  # no known release's shape
    NO_HAL0 = "no-hal0-installed-nothing-moved"  # nothing to judge against
    MANIFEST_UNUSABLE = "hal0-manifest-unusable-nothing-moved"  # 1.4+: no valid runner pins


class LaneState(enum.StrEnum):
    """The ROCm lane as the policy sees it."""

    USABLE = "usable"
    UNUSABLE = "unusable"
    UNSETTLED = "unsettled"  # unusable, but not yet for the whole demotion grace
    UNKNOWN = "unknown"  # the probe itself could not run (no such user, interpreter gone...)

    @property
    def shown(self) -> str:
        """The name an operator reads (text, JSON, metrics): a lane within its demotion grace
        is ``unusable``; the inner ``unsettled`` never shows."""
        return LaneState.UNUSABLE.value if self is LaneState.UNSETTLED else self.value


class FailureKind(enum.StrEnum):
    """Why one device node could not be opened by the service user."""

    MISSING = "missing"  # ENOENT / ENXIO / ENODEV
    PERMISSION = "permission"  # EACCES: mode, owner, group
    POLICY = "policy"  # EPERM: device cgroup, sandbox, LSM
    NOT_CHAR_DEVICE = "not-char-device"
    OTHER = "other"


@dataclass(frozen=True)
class NodeFailure:
    """A device node the service user could not open, and why."""

    path: str
    kind: FailureKind
    errno: int | None
    message: str


@dataclass(frozen=True)
class Credentials:
    """Who the probe runs as, and why that identity (the slot services' own, or a setting)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    why: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """The ROCm-lane verdict for the service user."""

    usable: bool
    credentials: Credentials | None
    kfd_ok: bool
    render_node: str | None  # the render node that opened, if any
    failures: tuple[NodeFailure, ...] = ()
    error: str | None = None  # the probe itself could not run
    kfd_path: str | None = None  # the KFD node probed (named with the render node)

    @property
    def reason(self) -> str:
        """One short line: why the lane is (un)usable."""
        if self.error is not None:
            return f"probe failed: {self.error}"
        if self.usable:
            kfd = self.kfd_path or "the KFD node"
            return f"{kfd} and {self.render_node} open read-write as the service user"
        return "; ".join(f"{f.path}: {f.kind} ({f.message})" for f in self.failures) or "unusable"


@dataclass(frozen=True)
class HostFacts:
    """A snapshot of what the host offers, as the policy needs it."""

    amd: bool
    lane: LaneState
    probe: ProbeResult | None = None

    @property
    def lane_reason(self) -> str:
        if self.probe is not None:
            return self.probe.reason
        return self.lane.shown


class Hal0Rule(enum.StrEnum):
    """Which Vulkan-lane rule the installed hal0 release applies (its era)."""

    PRE_RULE = "pre-rule"  # 0.9.8, 1.0.0a2: no rule at all, gpu-vulkan is hal0's normal lane
    ALLOWLIST = "allowlist"  # 1.0.0-1.3.0: capable when in schema.py's VULKAN_CAPABLE_IMAGE_REFS
    PINS = "pins"  # 1.4.0+: capable when a gated spelling of the manifest's runner pins
    NOT_PLACEABLE = "not-placeable"  # a hal0 of no known release's shape: nothing is moved
    NO_HAL0 = "no-hal0"  # none installed: nothing to judge against, nothing is moved


class Rung(enum.StrEnum):
    """Where hal0 takes a slot's image from: the first rung that gives one wins."""

    IMAGE_PIN = "image_pin"  # the slot's `image_pin`, verbatim
    DEFAULT_IMAGES = "default_images"  # [slots].default_images[<runner>] in hal0.toml
    ENVIRONMENT = "environment"  # HAL0_TOOLBOX_IMAGE_<KEY> (1.4+: HAL0_RUNNER_IMAGE_<KEY>)
    MANIFEST = "manifest"  # the manifest's ref for the runner (1.4+: its pin)
    BUNDLED = "bundled"  # the runner's image in the installed hal0's code
    UNRESOLVED = "unresolved"  # no image could be computed: not capable (fail closed)


@dataclass(frozen=True)
class Hal0Facts:
    """What the installed hal0 release believes about images (read from its own files).

    ``sources`` says, per fact, where it came from: a file or a setting.
    """

    version: str | None  # as VERSION (else the dist-info) says it
    default_image: str  # 1.0-1.3: DEFAULT_ROCMFPX_IMAGE; 1.4+: the standard runner's pin
    capable: frozenset[str]  # the Vulkan-capable refs, as hal0 holds them
    stale: frozenset[str]  # 1.0-1.3: STALE_ROCMFPX_IMAGE_REFS (looked through)
    bundled: Mapping[str, str]  # 1.0-1.3: runner key -> bundled image
    manifest_keys: Mapping[str, str]  # 1.0-1.3: runner key -> its manifest toolbox_images key
    aliases: Mapping[str, str]  # 1.1-1.3: legacy runner key -> canonical key
    default_images: Mapping[str, str] = field(default_factory=dict)  # hal0.toml override
    environment: Mapping[str, str] = field(default_factory=dict)  # the image overrides of api.env
    manifest: Mapping[str, str] = field(default_factory=dict)  # key -> ref (1.4+: runner pins)
    sources: Mapping[str, str] = field(default_factory=dict)
    rule: Hal0Rule = Hal0Rule.ALLOWLIST
    rule_evidence: str = ""
    release: str | None = None  # the known release whose rules apply
    vulkan_runner: str = "rocmfpx"  # the runner gpu-vulkan resolves to
    runner_keys: frozenset[str] = frozenset()  # 1.4+: RUNNER_IMAGES keys
    pins_problem: str | None = None  # 1.4+: the manifest is missing or invalid (nothing moves)
    converts: bool = False  # 1.4+: judged as the runner-system conversion leaves each file
    # 1.4+: the profile-centric conversion's own restore marker holds, so hal0 does not set
    # ``device`` from a legacy ``backend`` before its relabel
    backend_stood_down: bool = False
    device_marker: bool = False  # 1.5+: Exec= carries --device Vulkan0|ROCm0|none


@dataclass(frozen=True)
class ImageResolution:
    """The image hal0 will really launch for a candidate slot, and how it was found."""

    image: str | None
    rung: Rung
    runner: str | None  # the runner key whose ladder gave the image (None for a pin)
    capable: bool  # in hal0's Vulkan-capable set
    stale: str | None = None  # a stale former default that was looked through
    error: str | None = None  # why no image could be computed
    note: str | None = None  # what hal0 does here that a reader might not expect

    def explain(self) -> str:
        """One line for people: the image, where it came from, and the verdict."""
        if self.image is None:
            return f"no image ({self.error}): not Vulkan-capable"
        where = self.rung.value if self.runner is None else f"{self.rung.value} of {self.runner}"
        through = f"; stale {self.stale} looked through" if self.stale is not None else ""
        verdict = "Vulkan-capable" if self.capable else "not Vulkan-capable"
        note = f" ({self.note})" if self.note is not None else ""
        return f"{self.image} ({where}{through}): {verdict}{note}"


@dataclass(frozen=True)
class Verdict:
    """What the policy decided for one slot, and why."""

    action: Action
    reason: Reason
    runtime: Runtime
    old: str
    new: str | None = None
    image: ImageResolution | None = None  # for a Vulkan candidate: what hal0 will launch

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
