"""A host for the benchmarks: an AMD host whose ROCm lane is usable, a hal0 of the "ade07ba" era
(its default image is not Vulkan-capable, so every unpinned ``gpu-vulkan`` slot IS relabelled),
a fake ``systemctl`` (a shell script, as cheap as a process can be) that logs its calls, and N
slot files. Used by ``run_all.py``; asserts nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = Path(os.environ.get("HAL0_BENCH_SRC") or REPO / "src")
"""The package tree measured: this checkout's, or a baseline's (``baselines``, in a child)."""
for _p in (SRC, REPO / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from helpers.hal0_tree import Hal0Tree  # noqa: E402

SLOT = """# bench slot {n}: a comment the edit must keep
name = "s{n}"
type = "llm"
device = "{device}"
profile = "coding"
port = {port}

[model]
context_size = 4096   # tokens

[server]
extra_args = "--flash-attn on"
"""

_SYSTEMCTL = """#!/bin/sh
# fake systemctl: one line per call in calls.log; every unit is inactive
echo "$*" >> "{log}"
if [ "$1" = "is-active" ]; then
  shift
  for unit in "$@"; do echo inactive; done
  exit 3
fi
exit 0
"""

NULL_DEVICE = os.makedev(1, 3)


def slot_text(n: int, device: str = "gpu-vulkan") -> str:
    return SLOT.format(n=n, port=9000 + n % 50000, device=device)


class World:
    """Temp stand-ins for every host path. ``close()`` removes them."""

    def __init__(self, *, prefix: str = "hal0-bench-") -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.root.chmod(0o755)
        self.slots = self.root / "etc/hal0/slots"
        self.slots.mkdir(parents=True)
        (self.root / "sys/module/amdgpu").mkdir(parents=True)
        dev = self.root / "dev"
        (dev / "dri").mkdir(parents=True)
        for node in (dev / "kfd", dev / "dri/renderD128"):
            os.mknod(node, stat.S_IFCHR | 0o600, NULL_DEVICE)
            node.chmod(0o666)
        self.kfd, self.dri = dev / "kfd", dev / "dri"
        self.hal0 = Hal0Tree(self.root).install("ade07ba")  # unpinned gpu-vulkan: not capable
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        self.systemctl = bin_dir / "systemctl"
        self.systemctl_log = bin_dir / "calls.log"
        self.systemctl.write_text(_SYSTEMCTL.format(log=self.systemctl_log))
        self.systemctl.chmod(0o755)
        # the runtime folder is /run in production: a tmpfs (status.json's fsync costs nothing)
        shm = Path("/dev/shm")
        self.run_dir = Path(
            tempfile.mkdtemp(prefix="hal0-bench-run-", dir=shm if shm.is_dir() else None)
        )

    def overrides(self, **extra: str) -> dict[str, str]:
        values = {
            "slots_dir": str(self.slots),
            "state_dir": str(self.root / "var/lib/hal0-reconciler"),
            "runtime_dir": str(self.run_dir),
            "amdgpu_module_dir": str(self.root / "sys/module/amdgpu"),
            "kfd_path": str(self.kfd),
            "dri_dir": str(self.dri),
            "profiles_file": str(self.root / "etc/hal0/profiles.toml"),
            "service_user": "54321:54321",
            "api_url": "http://127.0.0.1:9",
            "systemctl": str(self.systemctl),
            "lock_file": str(self.root / "etc/hal0/slots.lock"),
            **self.hal0.settings(),
        }
        values.update(extra)
        return values

    def argv(self, verb: str, *extra: str, **settings: str) -> list[str]:
        """``python -m hal0_reconciler <verb>`` with every host path pointed here."""
        argv = [sys.executable, "-m", "hal0_reconciler", verb]
        for key, value in self.overrides(**settings).items():
            argv += ["--set", f"{key}={value}"]
        return [*argv, *extra]

    def fill(self, count: int, *, device: str = "gpu-vulkan", start: int = 0) -> None:
        for n in range(start, start + count):
            (self.slots / f"s{n}.toml").write_text(slot_text(n, device))

    def refill(self, count: int, *, device: str = "gpu-vulkan") -> None:
        """An empty slots folder, then ``count`` fresh files."""
        shutil.rmtree(self.slots)
        self.slots.mkdir()
        self.fill(count, device=device)

    def systemctl_calls(self) -> list[str]:
        try:
            return self.systemctl_log.read_text().splitlines()
        except FileNotFoundError:
            return []

    def reset_systemctl_log(self) -> None:
        self.systemctl_log.unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def env() -> dict[str, str]:
    """The environment for a child: this checkout's src first; no NOTIFY_SOCKET inherited."""
    values = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    values["PYTHONPATH"] = str(SRC)
    values.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode
    return values


def compile_sources() -> None:
    """Bytecode for src/ (as an installed package has), so a child does not compile it."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "src")], check=True, env=env()
    )


def run(
    argv: list[str], *, environment: dict[str, str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[bytes]:
    """``argv`` with ``env()`` (this checkout's src first) unless another environment is given."""
    values = env() if environment is None else environment
    return subprocess.run(argv, env=values, capture_output=True, check=False, **kwargs)  # type: ignore[call-overload]
