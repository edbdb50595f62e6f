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
    image: str | None = None,
) -> SlotDoc:
    """A flat slot named ``s`` with these fields (``kind`` is hal0's ``type``)."""
    return SlotDoc(
        data={},
        table=(),
        name="s",
        id=None,
        type=kind,
        device=device,
        device_source=DeviceSource.DEVICE,
        raw_device=device,
        backend=None,
        profile=profile,
        provider=provider,
        image=image,
    )
