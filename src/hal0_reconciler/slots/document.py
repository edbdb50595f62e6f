"""TOML text -> SlotDoc: the authoritative table, device/backend normalisation.  [pure]"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hal0_reconciler.model import DeviceSource


@dataclass(frozen=True)
class SlotDoc:
    """One parsed slot file, as hal0 reads it."""

    data: Mapping[str, Any]  # the whole parsed document
    table: tuple[str, ...]  # () for a flat file, ("slot",) when a [slot] table exists
    name: str  # `name`, else the file stem
    id: str | None
    type: str | None
    device: str  # the effective device label (device, else mapped legacy backend, else gpu-rocm)
    device_source: DeviceSource
    raw_device: str | None  # the `device` value as written (None when absent)
    backend: str | None  # the legacy `backend` value as written (None when absent)
    profile: str | None
    provider: str | None
    image: str | None  # image_pin, else the legacy `image` string
    server_env: Mapping[str, str] = field(default_factory=dict)  # [server].env

    @property
    def token(self) -> str:
        """The systemd unit token: `id` when set, else `name` (hal0-slot@<token>.service)."""
        return self.id if self.id else self.name


def parse_slot(text: str, *, stem: str) -> SlotDoc:
    """Parse a slot file's text. Raises SlotParseError with the parser's message."""
    raise NotImplementedError  # helper A fills this in


def device_from_backend(backend: str) -> str:
    """hal0's load-time mapping of a legacy `backend` value to a device label."""
    raise NotImplementedError  # helper A fills this in
