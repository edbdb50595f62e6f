"""The daemon tests' host: temp dirs for every host path, slot files, a runner in a thread."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import notify, runner
from hal0_reconciler.settings import Settings
from helpers import devnodes
from helpers.fake_systemctl import FakeSystemctl
from helpers.hal0_tree import Hal0Tree

SERVICE_USER = f"{devnodes.SERVICE_UID}:{devnodes.SERVICE_UID}"
FAST = {
    "settle_window": "0.05",
    "settle_cap": "0.5",
    "resync_interval": "120",
    "demote_grace": "0",
    "restart_min_interval": "60",
    "api_timeout": "2",
    "lock_timeout": "2",
    "probe_timeout": "5",
}


def wait_until(predicate: Callable[[], Any], *, timeout: float = 15.0, what: str = "") -> Any:
    """Poll ``predicate`` until it is truthy; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


def slot_text(name: str, device: str = "gpu-vulkan", *, port: int = 8081) -> str:
    return f'name = "{name}"\ntype = "llm"\ndevice = "{device}"\nport = {port}\n\n[model]\ndefault = "m"\n'


def device_of(path: Path) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith("device = "):
            return line.split('"')[1]
    return None


def drop_slot(slots_dir: Path, name: str, device: str = "gpu-vulkan", *, port: int = 8081) -> Path:
    """Save like hal0 and editors do: temp file in the folder, then rename onto the slot name."""
    tmp = slots_dir / f".{name}.toml.{os.getpid()}.tmp"
    tmp.write_text(slot_text(name, device, port=port))
    target = slots_dir / f"{name}.toml"
    tmp.rename(target)
    return target


class Host:
    """Temp stand-ins for every host path: an AMD host whose ROCm lane is usable."""

    def __init__(self, root: Path, dev: devnodes.DevTree) -> None:
        self.root = root
        self.dev = dev
        self.slots = root / "etc/hal0/slots"
        self.slots.mkdir(parents=True)
        (root / "sys/module/amdgpu").mkdir(parents=True)
        devnodes.char_node(dev.kfd, mode=0o666)
        devnodes.char_node(dev.render(), mode=0o666)
        self.systemctl = FakeSystemctl(root / "bin", {})
        self.hal0 = Hal0Tree(root).install("ade07ba")  # unpinned gpu-vulkan is not capable

    def lane(self, *, usable: bool) -> None:
        """chmod the nodes: 0666 usable by the service user, 0600 not."""
        self.dev.kfd.chmod(0o666 if usable else 0o600)

    def overrides(self, **extra: Any) -> dict[str, Any]:
        values: dict[str, Any] = {
            "slots_dir": str(self.slots),
            "state_dir": str(self.root / "var/lib/hal0-reconciler"),
            "runtime_dir": str(self.root / "run/hal0-reconciler"),
            "amdgpu_module_dir": str(self.root / "sys/module/amdgpu"),
            "kfd_path": str(self.dev.kfd),
            "dri_dir": str(self.dev.dri),
            "profiles_file": str(self.root / "etc/hal0/profiles.toml"),
            "service_user": SERVICE_USER,
            "api_url": "http://127.0.0.1:9",  # discard port: nothing listens
            "api_env_file": str(self.root / "etc/hal0/api.env"),
            "update_jobs_dir": str(self.root / "var/lib/hal0/update-jobs"),
            "quadlet_dir": str(self.root / "etc/containers/systemd"),
            "idle_recheck": "0.1",
            "idle_confirm": "0.3",
            "systemctl": str(self.systemctl.path),
            **self.hal0.settings(),
            **FAST,
        }
        values.update({k: str(v) for k, v in extra.items()})
        return values

    def settings(self, **extra: Any) -> Settings:
        return settings_mod.load(None, self.overrides(**extra))


@contextlib.contextmanager
def running(settings: Settings, **kwargs: Any) -> Iterator[runner.Runner]:
    """``Runner.serve`` in a thread (sd_notify from the environment); stopped and joined after."""
    kwargs.setdefault("notifier", notify.from_environment())
    daemon = runner.Runner(settings, **kwargs)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(daemon.serve()), name="test-runner")
    thread.start()
    try:
        yield daemon
    finally:
        daemon.request_stop()
        thread.join(10)
        daemon.close()
        assert not thread.is_alive(), "the runner did not stop within 10 s"
    assert [0] == result
