"""Installed-hal0 trees of several eras, written the way hal0 lays them out on a host.

``/usr/lib/hal0/venv/lib/python3.X/site-packages/hal0/config/schema.py`` holds the image sets,
``.../hal0/runners/__init__.py`` the runner table, ``/usr/lib/hal0/current/VERSION`` the
version. The module texts below are written for these tests in the shapes hal0's real modules
use (module constants, ``frozenset({...})`` of names and literals, a ``Runner(...)`` table whose
images are names imported from ``hal0.config.schema``); they are not copies of hal0's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

G = "ghcr.io/hal0ai"
ADE07BA = f"{G}/hal0-rocmfpx:ade07ba"
C0822 = f"{G}/hal0-combined:0822"
C0824 = f"{G}/hal0-combined:0824"
C0826 = f"{G}/hal0-combined:0826"
STRIX = f"{G}/hal0-strix-vulkan:0831"
OLD_STALE = (
    f"{G}/hal0-rocmfpx:c077206",
    f"{G}/hal0-rocmfpx:vulkan-minicpm5",
    "localhost/hal0-rocmfpx:vulkan-minicpm5",
)


@dataclass(frozen=True)
class Era:
    version: str
    default: str
    fixed: str  # VULKAN_FIXED_IMAGE
    extra_capable: tuple[str, ...]
    stale: tuple[str, ...]


ERAS = {
    "ade07ba": Era("0.9.9", ADE07BA, C0822, (), OLD_STALE),
    "0822": Era("1.0.0", C0822, C0822, (), (ADE07BA, *OLD_STALE)),
    "0824": Era("1.0.1", C0824, C0824, (), (C0822, ADE07BA, *OLD_STALE)),
    "0826": Era("1.0.2", C0826, C0826, (STRIX,), (C0824, C0822, ADE07BA, *OLD_STALE)),
}


def schema_text(era: Era) -> str:
    extra = "".join(f'        "{image}",\n' for image in era.extra_capable)
    stale = "".join(f'        "{image}",\n' for image in era.stale)
    fixed = (
        "VULKAN_FIXED_IMAGE = DEFAULT_ROCMFPX_IMAGE"
        if era.fixed == era.default
        else f'VULKAN_FIXED_IMAGE = "{era.fixed}"'
    )
    return f'''"""Test stand-in for hal0's configuration schema (image constants only)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
_SLOT_PORT_MIN = 8081

#: the runner every fresh install pulls
DEFAULT_ROCMFPX_IMAGE = "{era.default}"
{fixed}
FALLBACK_CUDA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda"

#: only these refs may serve the gpu-vulkan lane
VULKAN_CAPABLE_IMAGE_REFS: frozenset[str] = frozenset(
    {{
        VULKAN_FIXED_IMAGE,
{extra}    }}
)

#: former defaults the updater retags to the current one
STALE_ROCMFPX_IMAGE_REFS = frozenset(
    {{
{stale}    }}
)


def resolve_default_image(backend: str | None) -> str:
    return DEFAULT_ROCMFPX_IMAGE
'''


RUNNERS_TEXT = '''"""Test stand-in for hal0's runner-image registry."""

from __future__ import annotations

from dataclasses import dataclass

from hal0.config.schema import (
    DEFAULT_ROCMFPX_IMAGE,
    FALLBACK_CUDA_IMAGE,
)

_CPU_IMAGE = "ghcr.io/hal0ai/hal0-toolbox-cpu:v1"
_FLM_IMAGE = "ghcr.io/hal0ai/hal0-toolbox-flm:0.9.44"


@dataclass(frozen=True)
class Runner:
    key: str
    image: str
    runtime_family: str
    supports: object
    device_class: str
    backend: str | None = None
    manifest_key: str | None = None


RUNNER_IMAGES: dict[str, Runner] = {
    "rocmfpx": Runner("rocmfpx", DEFAULT_ROCMFPX_IMAGE, "llama-server", None, "gpu", "rocm", None),
    "cuda": Runner("cuda", FALLBACK_CUDA_IMAGE, "llama-server", None, "gpu", "cuda", None),
    "cpu": Runner(
        "cpu",
        _CPU_IMAGE,
        "llama-server",
        None,
        "cpu",
        None,
        "cpu",
    ),
    "flm": Runner(key="flm", image=_FLM_IMAGE, runtime_family="flm", supports=None,
                  device_class="npu", manifest_key="flm"),
}

RUNNER_ALIASES: dict[str, str] = {"vulkanfpx": "rocmfpx"}
'''


@dataclass(frozen=True)
class Hal0Tree:
    """One installed hal0 under ``root`` (the settings that point the reconciler at it)."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "usr/lib/hal0/venv"

    @property
    def release(self) -> Path:
        return self.root / "usr/lib/hal0/current"

    @property
    def package(self) -> Path:
        return self.venv / "lib/python3.11/site-packages/hal0"

    @property
    def schema(self) -> Path:
        return self.package / "config/schema.py"

    @property
    def runners(self) -> Path:
        return self.package / "runners/__init__.py"

    @property
    def config(self) -> Path:
        return self.root / "etc/hal0/hal0.toml"

    @property
    def env_file(self) -> Path:
        return self.root / "etc/hal0/api.env"

    def settings(self) -> dict[str, Any]:
        return {
            "hal0_venv": str(self.venv),
            "hal0_release_dir": str(self.release),
            "hal0_config_file": str(self.config),
            "api_env_file": str(self.env_file),
        }

    def install(self, era: str) -> Hal0Tree:
        """Lay out (or replace, as an update does) this era's files."""
        spec = ERAS[era]
        self.schema.parent.mkdir(parents=True, exist_ok=True)
        self.runners.parent.mkdir(parents=True, exist_ok=True)
        self.release.mkdir(parents=True, exist_ok=True)
        _replace(self.schema, schema_text(spec))
        _replace(self.runners, RUNNERS_TEXT)
        _replace(self.release / "VERSION", spec.version + "\n")
        return self


def _replace(path: Path, text: str) -> None:
    """Write by rename, as an installer does: a watcher never sees half a file."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
