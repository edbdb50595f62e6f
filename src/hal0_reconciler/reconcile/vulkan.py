"""hal0's Vulkan opt-in (``HAL0_ALLOW_VULKAN_FALLBACK`` in its api.env), as hal0 reads it:
while set, no gpu-vulkan slot is relabelled; said once (loudly) when it becomes set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal0_reconciler import fsio
from hal0_reconciler._log import get_logger
from hal0_reconciler.host.envfile import read_env_file
from hal0_reconciler.host.restarts import rules as restart_rules

if TYPE_CHECKING:
    from pathlib import Path

_log = get_logger("hal0_reconciler.reconcile")


class VulkanOptIn:
    """Whether the operator runs Vulkan on purpose, as of the last look."""

    def __init__(self) -> None:
        self.paused = False
        self._read: tuple[object, ...] | None = None  # the file as last read (path, identity)
        self._environment: dict[str, str] = {}

    def refresh(self, api_env_file: Path) -> bool:
        """hal0's api.env as it is now (read again only when its identity changed); True while
        the opt-in is set."""
        try:
            st = api_env_file.stat()
            seen: tuple[object, ...] = (api_env_file, fsio.identity_of(st), st.st_ctime_ns)
        except OSError:
            seen = (api_env_file, None)
        if seen != self._read:
            try:
                self._environment = read_env_file(api_env_file)
            except (OSError, UnicodeDecodeError):
                self._environment = {}
            self._read = seen
        paused = restart_rules.vulkan_fallback_allowed(self._environment)
        if paused and not self.paused:
            _log.warning(
                "slot.vulkan_relabels_paused",
                variable=restart_rules.VULKAN_FALLBACK_VARIABLE,
                path=str(api_env_file),
                detail="the operator is running Vulkan on purpose: no gpu-vulkan slot is "
                "relabelled or restarted while it is set. hal0's own boot pass ignores this "
                "variable and still relabels unvalidated gpu-vulkan slots at every hal0-api start",
            )
        elif self.paused and not paused:
            _log.info(
                "slot.vulkan_relabels_resumed", variable=restart_rules.VULKAN_FALLBACK_VARIABLE
            )
        self.paused = paused
        return paused
