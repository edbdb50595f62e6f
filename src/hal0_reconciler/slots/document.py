"""TOML text -> SlotDoc: each key as hal0 launches it, device/backend normalisation.  [pure]

hal0's launch path (``_load_slot_config``, every release) keeps every top-level key and then
overlays the ``[slot]`` table: a key's effective value is ``[slot].key`` when present, else the
top-level ``key``. A relabel edits the table the effective ``device`` came from, and the
top-level ``device`` too when it says the same (hal0's own relabel pass checks that one first).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hal0_reconciler import errors, model
from hal0_reconciler.slots import limits as limits_


@dataclass(frozen=True)
class SlotDoc:
    """One parsed slot file, as hal0 reads it."""

    data: Mapping[str, Any]  # the whole parsed document
    table: tuple[str, ...]  # the table the effective device comes from: () root, ("slot",)
    name: str  # `name`, else the file stem
    id: str | None
    type: str | None
    device: str  # the effective device label (device, else mapped legacy backend, else gpu-rocm)
    device_source: model.DeviceSource
    raw_device: str | None  # the `device` value as written (None when absent)
    backend: str | None  # the legacy `backend` value as written (None when absent)
    profile: str | None
    provider: str | None
    image_pin: str | None  # `image_pin` as written (None when absent or not a string)
    binary: str | None  # the runner key, as written
    server_env: Mapping[str, str] = field(default_factory=dict)  # [server].env
    also: tuple[str, ...] | None = None  # a second table whose `device` says the same

    @property
    def write_tables(self) -> tuple[tuple[str, ...], ...]:
        """The tables a relabel writes `device` into (one write)."""
        return (self.table,) if self.also is None else (self.table, self.also)

    @property
    def token(self) -> str:
        """The systemd unit token: `id` when set, else `name` (hal0-slot@<token>.service)."""
        return self.id or self.name

    @property
    def vulkan_candidate(self) -> bool:
        """Matched exactly as hal0 matches it: ``device`` is literally ``"gpu-vulkan"``, or
        there is no (or an empty) ``device`` and the legacy ``backend`` is literally
        ``"vulkan"``. ``"Vulkan"`` or ``" gpu-vulkan "`` are not candidates: hal0 cannot load
        such a device, and maps such a backend to ``cpu``."""
        if self.raw_device:
            return self.raw_device == model.Device.GPU_VULKAN
        return self.backend == "vulkan"

    @property
    def unit_problem(self) -> str | None:
        """Why hal0 could not run this slot under its name or id (None: it could).

        Such a slot is never named to ``systemctl`` or in an API path."""
        if not _NAME.fullmatch(self.name):
            return f"name {self.name!r} breaks hal0's pattern {_NAME.pattern}"
        if self.id is not None and not _ID.fullmatch(self.id):
            return f"id {self.id!r} breaks hal0's pattern {_ID.pattern}"
        return None


_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
"""hal0's slot names."""
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""The ids hal0's privileged unit helper accepts."""


_BACKEND_TO_DEVICE: Mapping[str, str] = {
    "": model.Device.GPU_ROCM.value,
    "rocm": model.Device.GPU_ROCM.value,
    "vulkan": model.Device.GPU_VULKAN.value,
    "cuda": model.Device.GPU_CUDA.value,
    "cpu": model.Device.CPU.value,
    "flm": model.Device.NPU.value,
    "moonshine": model.Device.CPU.value,
    "kokoro": model.Device.CPU.value,
    **{device.value: device.value for device in model.Device},
}
"""hal0's legacy `backend` table; keys are lower-case and stripped. Unknown values map to cpu."""


def parse_slot(text: str, *, stem: str, limits: limits_.Limits = limits_.DEFAULT) -> SlotDoc:
    """Parse a slot file's text. Raises SlotParseError with the parser's message.

    Each key is `[slot].key` when the document has a `slot` table holding it, else the
    top-level key (hal0's launch path). A value of the wrong type where a string is expected
    counts as absent, except the effective `device`, which must be a string.
    Text over one of ``limits`` raises OverLimit (a SlotParseError) and is not parsed.
    """
    limits_.check_text(text, limits)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise errors.SlotParseError(f"not valid TOML: {exc}") from exc
    except RecursionError as exc:  # absurdly deep nesting of arrays / inline tables
        raise errors.SlotParseError("not valid TOML: nesting too deep") from exc
    except ValueError as exc:  # e.g. Python's limit on the digits of an integer
        raise errors.SlotParseError(f"not a usable value: {exc}") from exc
    limits_.check_depth(data, limits)
    return from_data(data, stem=stem)


def from_checked_parse(
    text: str, data: dict[str, Any], *, stem: str, limits: limits_.Limits = limits_.DEFAULT
) -> SlotDoc:
    """``parse_slot(text)`` for a text whose parse is already known to be ``data`` (the editor's
    verifying re-parse of what it wrote): the same limits, no parser."""
    limits_.check_text(text, limits)
    limits_.check_depth(data, limits)
    return from_data(data, stem=stem)


def from_data(data: dict[str, Any], *, stem: str) -> SlotDoc:
    """The slot document of an already parsed (and limit-checked) slot file. Raises
    SlotParseError when ``device`` is not a string."""
    slot = data.get("slot")
    table: tuple[str, ...] = ()
    also: tuple[str, ...] | None = None
    fields: Mapping[str, Any] = data
    if isinstance(slot, dict):
        fields = {**{k: v for k, v in data.items() if k != "slot"}, **slot}
        holder = "device" if "device" in slot or "device" in data else "backend"
        if holder in slot or holder not in data:
            table = ("slot",)
            if holder == "device" and data.get("device") == slot.get("device"):
                also = ()  # both tables say it: the launcher reads one, hal0's pass the other

    raw_device = fields.get("device")
    if raw_device is not None and not isinstance(raw_device, str):
        where = "[slot].device" if table else "device"
        raise errors.SlotParseError(f"{where} must be a string, not {type(raw_device).__name__}")
    # the string fields (None when absent or of another type), looked up once each
    name, kind, backend, profile, provider, image_pin, binary = (
        value if isinstance(value := fields.get(key), str) else None for key in _STRING_FIELDS
    )

    device: str
    if raw_device is not None and raw_device.strip():
        device, source = raw_device.strip(), model.DeviceSource.DEVICE
    elif backend is not None:
        device, source = device_from_backend(backend), model.DeviceSource.LEGACY_BACKEND
    else:
        device, source = model.Device.GPU_ROCM.value, model.DeviceSource.DEFAULT

    return SlotDoc(
        data=data,
        table=table,
        name=name or stem,
        id=_identifier(fields.get("id")),
        type=kind,
        device=device,
        device_source=source,
        raw_device=raw_device,
        backend=backend,
        profile=profile,
        provider=provider,
        image_pin=image_pin,
        binary=binary,
        server_env=_server_env(data),
        also=also,
    )


_STRING_FIELDS = ("name", "type", "backend", "profile", "provider", "image_pin", "binary")


def device_from_backend(backend: str) -> str:
    """hal0's load-time mapping of a legacy `backend` value to a device label."""
    return _BACKEND_TO_DEVICE.get(backend.strip().lower(), model.Device.CPU.value)


def _identifier(value: Any) -> str | None:
    """A slot `id` as text: strings as written, integers (not booleans) in decimal."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _server_env(data: Mapping[str, Any]) -> dict[str, str]:
    """`[server].env`, keeping only string-to-string entries."""
    server = data.get("server")
    env = server.get("env") if isinstance(server, dict) else None
    if not isinstance(env, dict):
        return {}
    return {key: value for key, value in env.items() if isinstance(value, str)}
