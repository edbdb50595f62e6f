"""A parsed slot, built directly: the pure decisions are tested without parsing TOML."""

from __future__ import annotations

from hal0_reconciler.model import DeviceSource
from hal0_reconciler.slots.document import SlotDoc


def slot_doc(
    *,
    kind: str | None = "llm",
    device: str = "gpu-vulkan",
    profile: str | None = None,
    provider: str | None = None,
    image_pin: str | None = None,
    binary: str | None = None,
    raw_device: str | None = "",
    backend: str | None = None,
    name: str = "s",
    slot_id: str | None = None,
) -> SlotDoc:
    """A flat slot with these fields (``kind`` is hal0's ``type``; ``raw_device`` "" means
    "as ``device``")."""
    return SlotDoc(
        data={},
        table=(),
        name=name,
        id=slot_id,
        type=kind,
        device=device,
        device_source=DeviceSource.DEVICE,
        raw_device=device if raw_device == "" else raw_device,
        backend=backend,
        profile=profile,
        provider=provider,
        image_pin=image_pin,
        binary=binary,
    )
