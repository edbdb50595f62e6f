"""Real device nodes, users and interpreters for the host-probe tests.

Nodes are character devices 1:3 (the kernel's null device: safe to open) with a chosen
owner, group and mode, in a directory every uid can traverse (pytest's own tmp dirs are 0700).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

NULL_DEVICE = os.makedev(1, 3)
SERVICE_UID = 54321
RENDER_GID = 54322

requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: mknod, chown and switching credentials"
)


@dataclass(frozen=True)
class DevTree:
    """A fake /dev: ``kfd`` and ``dri/`` under a world-traversable root."""

    root: Path

    @property
    def kfd(self) -> Path:
        return self.root / "kfd"

    @property
    def dri(self) -> Path:
        return self.root / "dri"

    def render(self, number: int = 128) -> Path:
        return self.dri / f"renderD{number}"


@contextlib.contextmanager
def dev_tree() -> Iterator[DevTree]:
    """A fresh DevTree with an empty, world-readable ``dri/``; removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="hal0-probe-"))
    try:
        root.chmod(0o755)
        (root / "dri").mkdir()
        (root / "dri").chmod(0o755)
        yield DevTree(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def char_node(
    path: Path, *, mode: int = 0o666, uid: int = 0, gid: int = 0, device: int = NULL_DEVICE
) -> Path:
    """A character device node at ``path`` with exactly this owner, group and mode."""
    os.mknod(path, stat.S_IFCHR | 0o600, device)
    os.chown(path, uid, gid)
    path.chmod(mode)  # after mknod: the umask does not get a say
    return path


def regular_file(path: Path, *, mode: int = 0o666) -> Path:
    path.write_bytes(b"")
    path.chmod(mode)
    return path


def unregistered_char_major() -> int:
    """A character-device major number no driver has registered (open gives ENXIO)."""
    text = Path("/proc/devices").read_text()
    chars = text.split("Block devices:")[0]
    used = {int(line.split()[0]) for line in chars.splitlines() if line[:4].strip().isdigit()}
    return next(m for m in range(240, 255) if m not in used)


@contextlib.contextmanager
def system_user(groups: tuple[str, ...] = ()) -> Iterator[str]:
    """A real system user (``useradd --system``) in ``groups``; removed with its group after."""
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel not installed")
    name = f"h0p{uuid.uuid4().hex[:10]}"
    argv = ["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/bin/false"]
    if groups:
        argv += ["--groups", ",".join(groups)]
    subprocess.run([*argv, name], check=True, capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=30)
        subprocess.run(["groupdel", name], check=False, capture_output=True, timeout=30)


@contextlib.contextmanager
def system_group() -> Iterator[tuple[str, int]]:
    """A real system group (``groupadd --system``): its name and gid; removed after."""
    if shutil.which("groupadd") is None:
        pytest.skip("groupadd not installed")
    name = f"h0g{uuid.uuid4().hex[:10]}"
    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True, timeout=30)
    try:
        import grp

        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True, timeout=30)


def root_only_venv(parent: Path) -> Path:
    """A copied (not symlinked) venv interpreter inside a 0700 root-only directory."""
    home = parent / "root-only"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--copies", str(home / "venv")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    python = home / "venv" / "bin" / "python"
    assert not python.is_symlink()
    return python


def script(path: Path, body: str) -> Path:
    """An executable /bin/sh script standing in for the probe's interpreter."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def can_exec_as(uid: int, gid: int, program: Path) -> bool:
    """Whether ``uid``:``gid`` (no other groups) can start ``program`` at all."""
    try:
        subprocess.run(
            [str(program), "-c", "pass"],
            user=uid,
            group=gid,
            extra_groups=[],
            check=False,
            capture_output=True,
            timeout=30,
        )
    except PermissionError:
        return False
    return True


def dies_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` (not our child) is gone or a zombie within ``seconds``.

    SIGKILL is delivered asynchronously, so a killed grandchild may still show as running for
    a moment; it is reaped by whoever inherited it.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
