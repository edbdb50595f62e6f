"""hal0's Vulkan opt-in as a pass reads it (``reconcile.vulkan``), from a real api.env."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog.testing

from hal0_reconciler.reconcile.vulkan import VulkanOptIn


@pytest.mark.parametrize(
    ("text", "paused"),
    [
        pytest.param("HAL0_ALLOW_VULKAN_FALLBACK=1\n", True, id="1"),
        pytest.param("HAL0_ALLOW_VULKAN_FALLBACK=yes\n", True, id="yes"),
        pytest.param("HAL0_ALLOW_VULKAN_FALLBACK=0\n", False, id="0"),
        pytest.param("OTHER=1\n", False, id="not set"),
        pytest.param(None, False, id="no api.env"),
        pytest.param(b"\xff\xfe=1\n", False, id="not UTF-8"),
    ],
)
def test_the_opt_in_is_read_as_hal0_reads_it(
    tmp_path: Path, text: str | bytes | None, paused: bool
) -> None:
    """Set exactly as hal0 takes it; no file, or one that cannot be read, is not set."""
    env = tmp_path / "api.env"
    if isinstance(text, str):
        env.write_text(text)
    elif text is not None:
        env.write_bytes(text)
    opt_in = VulkanOptIn()
    assert paused == opt_in.refresh(env)
    assert paused == opt_in.paused


def test_the_opt_in_is_said_when_it_is_set_and_when_it_is_cleared(tmp_path: Path) -> None:
    """A warning once when it becomes set (not at every pass), an info when it goes."""
    env = tmp_path / "api.env"
    opt_in = VulkanOptIn()
    with structlog.testing.capture_logs() as logs:
        opt_in.refresh(env)
        env.write_text("HAL0_ALLOW_VULKAN_FALLBACK=true\n")
        opt_in.refresh(env)
        opt_in.refresh(env)
        env.write_text("")
        opt_in.refresh(env)
        opt_in.refresh(env)
    assert [
        ("slot.vulkan_relabels_paused", "warning"),
        ("slot.vulkan_relabels_resumed", "info"),
    ] == [(e["event"], e["log_level"]) for e in logs]
    assert str(env) == logs[0]["path"]
