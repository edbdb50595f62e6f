"""Installed-hal0 trees shaped like hal0's releases, written the way hal0 lays them out.

``/usr/lib/hal0/venv/lib/python3.X/site-packages/hal0/config/schema.py`` holds the 1.0-1.3
image sets, ``.../hal0/runners/__init__.py`` the runner table, ``.../hal0/runners/pins.py``
marks 1.4+, ``/usr/lib/hal0/current/VERSION`` names the release and
``/usr/lib/hal0/current/manifest.json`` holds 1.4+'s runner pins. The texts below are
project-written facsimiles of only what the reconciler reads (module constants, a
``Runner(...)`` table, a manifest in hal0's schema); they are not copies of hal0's files.
Trees are keyed by release number (:data:`ERAS` for 1.1-1.3-shaped image sets,
:func:`Hal0Tree.install_pins` for 1.4+).
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


ERAS = {  # image sets in a 1.1-1.3-shaped tree (release numbers the placement accepts)
    "ade07ba": Era("1.1.0", ADE07BA, C0822, (), OLD_STALE),
    "0822": Era("1.2.0", C0822, C0822, (), (ADE07BA, *OLD_STALE)),
    "0824": Era("1.2.0", C0824, C0824, (), (C0822, ADE07BA, *OLD_STALE)),
    "0826": Era("1.3.0", C0826, C0826, (STRIX,), (C0824, C0822, ADE07BA, *OLD_STALE)),
}

PINS_RELEASES = ("1.4.0", "1.5.0", "1.6.0", "1.6.5", "1.7.0")
STANDARD_REPO = "registry.example/hal0-runner-standard"
DIGEST = "sha256:" + "ab" * 32
STANDARD_REF = f"{STANDARD_REPO}:b7000-r1@{DIGEST}"

PINS_SCHEMA_TEXT = '''"""Test stand-in for a 1.4+ configuration schema (no image constants)."""

from __future__ import annotations

_LANE_DEVICE = {"gpu-rocm": "ROCm0", "gpu-vulkan": "Vulkan0", "cpu": "none"}

from pydantic import BaseModel, Field


class SlotsConfig(BaseModel):
    """[slots] of hal0.toml (only what the tests' files hold)."""

    max_slots: int = Field(default=4, ge=0)
    default_images: dict[str, str] = Field(default_factory=dict)
'''

PINS_MODULE_TEXT = '''"""Test stand-in for 1.4+'s runner pins module (its presence marks the era)."""

ENV_OVERRIDE_PREFIX = "HAL0_RUNNER_IMAGE_"
'''

PINS_RUNNERS_TEXT = '''"""Test stand-in for a 1.4+ runner registry (keys and supported backends)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Runner:
    key: str
    runtime_family: str
    supports: object
    device_class: str
    backend: str | None = None
    supported_backends: tuple[str, ...] = ()


RUNNER_IMAGES: dict[str, Runner] = {
    "standard": Runner(
        key="standard",
        runtime_family="llama-server",
        supports=None,
        device_class="gpu",
        backend="rocm",
        supported_backends=("rocm", "vulkan"),
    ),
    "cpu": Runner("cpu", "llama-server", None, "cpu", None, ("cpu",)),
    "cuda": Runner(key="cuda", runtime_family="llama-server", supports=None, device_class="gpu",
                   backend="cuda", supported_backends=("cuda",)),
    "flm": Runner(key="flm", runtime_family="flm", supports=None, device_class="npu",
                  supported_backends=("npu",)),
}
'''


def manifest(*, gated: bool = True, standard: dict[str, Any] | None = None) -> dict[str, Any]:
    """A manifest in hal0 1.4+'s schema (project data): ``standard`` gated for Vulkan when
    ``gated``; ``standard`` replaces its row."""
    row = (
        standard
        if standard is not None
        else {
            "image": STANDARD_REPO,
            "tag": "b7000-r1",
            "digest": DIGEST,
            "lanes_gated": ["rocm", "vulkan"] if gated else ["rocm"],
        }
    )
    return {
        "version": "test",
        "runners": {
            "standard": row,
            "cpu": {"image": "registry.example/hal0-runner-cpu", "tag": "b7000", "digest": None},
            "cuda": {"image": "registry.example/llama-cuda", "tag": None, "digest": None},
        },
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

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)
_SLOT_PORT_MIN = 8081


class SlotsConfig(BaseModel):
    """[slots] of hal0.toml (only what the tests' files hold)."""

    max_slots: int = Field(default=4, ge=0)
    default_images: dict[str, str] = Field(default_factory=dict)


#: the runner every fresh install pulls
DEFAULT_ROCMFPX_IMAGE = "{era.default}"
{fixed}
FALLBACK_CUDA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda"
FALLBACK_VULKAN_IMAGE = "ghcr.io/hal0ai/amd-strix-halo-toolboxes:vulkan-radv-server"

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


RUNNERS_100_TEXT = RUNNERS_TEXT.replace(
    """    "cuda": Runner(""",
    """    "vulkanfpx": Runner("vulkanfpx", DEFAULT_ROCMFPX_IMAGE, "llama-server", None, "gpu", "vulkan"),
    "cuda": Runner(""",
    1,
).replace('RUNNER_ALIASES: dict[str, str] = {"vulkanfpx": "rocmfpx"}\n', "")
"""A 1.0.0-shaped runner table: ``vulkanfpx`` is a runner of its own, no aliases."""


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

    @property
    def restore_marker(self) -> Path:
        return self.root / "var/lib/hal0/runner-migration.restored"

    def settings(self) -> dict[str, Any]:
        return {
            "hal0_venv": str(self.venv),
            "hal0_release_dir": str(self.release),
            "hal0_config_file": str(self.config),
            "api_env_file": str(self.env_file),
            "restore_marker": str(self.restore_marker),
        }

    def install_pins(
        self, version: str = "1.7.0", manifest_doc: dict[str, Any] | str | None = None
    ) -> Hal0Tree:
        """A 1.4+-shaped release (``manifest_doc``: the release tree's manifest.json, a dict
        as JSON or text as written; None: none)."""
        import json

        write_file(self.schema, PINS_SCHEMA_TEXT)
        write_file(self.runners, PINS_RUNNERS_TEXT)
        write_file(self.package / "runners/pins.py", PINS_MODULE_TEXT)
        write_file(self.release / "VERSION", version + "\n")
        if manifest_doc is not None:
            text = manifest_doc if isinstance(manifest_doc, str) else json.dumps(manifest_doc)
            write_file(self.release / "manifest.json", text)
        return self

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


# -- eras before the allowlist, and the catalog-built runner table ---------------------------
PRE_RULE_DEFAULT = f"{G}/hal0-rocmfpx:c077206"


def pre_rule_schema_text(*, fixed: bool = False) -> str:
    """A schema of hal0 before the Vulkan rule: a default and stale set, no capable set (with
    ``fixed``: a ``VULKAN_FIXED_IMAGE`` too, a shape between the known eras)."""
    extra = f'VULKAN_FIXED_IMAGE = "{C0822}"\n' if fixed else ""
    return f'''"""Test stand-in for an early hal0 schema (no Vulkan-lane rule)."""

from __future__ import annotations

DEFAULT_ROCMFPX_IMAGE = "{PRE_RULE_DEFAULT}"
{extra}FALLBACK_CUDA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda"
FALLBACK_VULKAN_IMAGE = "{G}/amd-strix-halo-toolboxes:vulkan-radv-server"

STALE_ROCMFPX_IMAGE_REFS = frozenset({{"{G}/hal0-rocmfpx:server"}})
'''


UPDATER_RELABEL_TEXT = '''"""Test stand-in for an updater that relabels (with no capable set: no release's shape)."""


def relabel_stale_vulkan_slots(*, kfd_present=None):
    return 0
'''


def write_file(path: Path, text: str) -> None:
    """Lay one installed file down (folders made), by rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace(path, text)


def install_texts(
    tree: Hal0Tree,
    *,
    schema: str,
    runners: str,
    version: str = "1.0.0",
    extra: dict[str, str] | None = None,
) -> Hal0Tree:
    """An installed hal0 from module texts; ``extra`` maps a path inside the hal0 package
    (``updater/updater.py``, ``lifecycle/data/catalog.json``) to its text."""
    write_file(tree.schema, schema)
    write_file(tree.runners, runners)
    write_file(tree.release / "VERSION", version + "\n")
    for relative, text in (extra or {}).items():
        write_file(tree.package / relative, text)
    return tree


def plan_json(tree: Hal0Tree, slots: Path, *extra: str) -> dict[str, Any]:
    """`hal0-reconciler plan --json` over ``slots`` with this hal0 installed (an AMD host whose
    ROCm lane is usable), as a child process."""
    import json
    import os
    import subprocess
    import sys

    from helpers.hosts import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("HAL0_HOME", None)
    s = tree.settings()
    argv = [sys.executable, "-m", "hal0_reconciler", "plan", "--json", "--assume-amd"]
    argv += ["--assume-rocm=usable", "--slots-dir", str(slots)]
    argv += ["--state-dir", str(tree.root / "state"), "--hal0-venv", s["hal0_venv"]]
    argv += ["--hal0-release-dir", s["hal0_release_dir"]]
    argv += ["--hal0-config-file", s["hal0_config_file"]]
    argv += ["--set", f"api_env_file={s['api_env_file']}", "--log-format", "json"]
    argv += ["--set", f"restore_marker={s['restore_marker']}", *extra]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode in (0, 2), result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc
