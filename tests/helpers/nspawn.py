"""A real systemd 252 to test the unit and the package in: ``systemd-nspawn --boot``.

The host has no systemd as PID 1, so the container is booted the way that works without one:
``--register=no --keep-unit`` (no machined, no scope unit), ``--volatile=overlay`` (the cached
root stays clean: every boot writes to a tmpfs), ``--private-network`` (loopback only), from a
private mount namespace with a tmpfs on ``/run`` (nspawn's own runtime files never touch the
host's /run), in a cgroup of its own under the unified hierarchy. Teardown writes
``cgroup.kill``: every process of the container dies at once, whatever state it is in. A
cgroup left by a run that was itself killed (its creator pid is gone) is cleaned up first.
Commands run inside with ``nsenter --target <container PID 1> --all``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "hal0-reconciler-test"
FILES = "/srv/hal0-test"  # the tests bind a host folder here: the .deb and test files
DEV = "/srv/hal0-dev"  # ... and the fake /dev here: kfd and dri/renderD128, made on the host
BOOT_TIMEOUT = 90.0


def cgroup2_root() -> Path:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup or .../unified (hybrid)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    raise RuntimeError("no cgroup2 hierarchy is mounted: cannot give the container its own")


def _remove_tree(cgroup: Path) -> None:
    """Kill everything in ``cgroup`` and remove it with its children (deepest first)."""
    with contextlib.suppress(OSError):
        (cgroup / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if "populated 0" in (cgroup / "cgroup.events").read_text():
                break
        except OSError:
            break
        time.sleep(0.05)
    for folder in sorted((p for p in cgroup.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        cgroup.rmdir()


def clean_stale_cgroups() -> list[str]:
    """Remove the cgroups of earlier runs whose creator process is gone (named ``-<pid>-``)."""
    removed = []
    for cgroup in cgroup2_root().glob(f"{PREFIX}-*"):
        creator = cgroup.name.removeprefix(f"{PREFIX}-").split("-")[0]
        if creator.isdigit() and not Path(f"/proc/{creator}").exists():
            _remove_tree(cgroup)
            removed.append(cgroup.name)
    return removed


@dataclass
class Container:
    """One booted container; ``run`` executes inside it."""

    root: Path  # the (read-only, cached) root file system
    binds: dict[Path, str] = field(default_factory=dict)  # host path -> container path
    binds_ro: dict[Path, str] = field(default_factory=dict)  # the same, read-only inside
    log_path: Path | None = None
    cgroup: Path = field(init=False)
    pid1: int = field(init=False, default=0)
    _proc: subprocess.Popen[bytes] | None = field(init=False, default=None)

    def boot(self) -> None:
        clean_stale_cgroups()
        self.cgroup = cgroup2_root() / f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.cgroup.mkdir()
        nspawn = [
            "systemd-nspawn",
            "--quiet",
            "--register=no",
            "--keep-unit",
            "--volatile=overlay",
            "--private-network",
            "--boot",
            f"--machine={self.cgroup.name[-24:].strip('-')}",
            "-D",
            str(self.root),
            *[f"--bind={host}:{inside}" for host, inside in self.binds.items()],
            *[f"--bind-ro={host}:{inside}" for host, inside in self.binds_ro.items()],
        ]
        script = (
            f"echo $$ > {shlex.quote(str(self.cgroup / 'cgroup.procs'))} && "
            "mount -t tmpfs -o mode=0755 tmpfs /run && "
            f"exec {shlex.join(nspawn)}"
        )
        log = (self.log_path or Path(os.devnull)).open("wb")
        self._proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SYSTEMD_LOG_LEVEL": "warning"},
        )
        log.close()
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not self.pid1:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the container did not start: {self.console()}")
            self.pid1 = self._find_pid1()
            time.sleep(0.05)
        state = ""
        while time.monotonic() < deadline:
            done = self.run("systemctl is-system-running --wait", check=False, timeout=BOOT_TIMEOUT)
            state = done.stdout.strip()
            if state in {"running", "degraded"}:
                return
            time.sleep(0.2)
        raise RuntimeError(f"the container's systemd did not finish booting ({state!r})")

    def _find_pid1(self) -> int:
        """The container's init: in our cgroup tree, pid 1 of its own pid namespace."""
        for procs in self.cgroup.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                nspid = next((ln for ln in status.splitlines() if ln.startswith("NSpid:")), "")
                if nspid.split()[-1:] == ["1"] and len(nspid.split()) > 2:
                    return int(pid)
        return 0

    def run(
        self,
        command: str,
        *,
        check: bool = True,
        timeout: float = 60.0,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A shell command inside the container (all its namespaces, a clean environment)."""
        done = subprocess.run(
            [
                "nsenter",
                f"--target={self.pid1}",
                "--all",
                "/usr/bin/env",
                "-i",
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
                "SYSTEMD_PAGER=",
                "/bin/sh",
                "-c",
                command,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"in the container: {command!r} exited {done.returncode}\n"
                f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
            )
        return done

    def write(self, path: str, text: str, mode: str = "0644") -> None:
        quoted = shlex.quote(path)
        self.run(
            f"mkdir -p $(dirname {quoted}) && cat > {quoted}.tmp && chmod {mode} {quoted}.tmp "
            f"&& mv -f {quoted}.tmp {quoted}",
            stdin=text,
        )

    def read(self, path: str) -> str:
        return self.run(f"cat {shlex.quote(path)}").stdout

    def journal(self, args: str = "", lines: int = 400) -> str:
        done = self.run(
            f"journalctl --no-pager -o short-precise -n {lines} {args}", check=False, timeout=30
        )
        return done.stdout + done.stderr

    def console(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-3000:]

    def shutdown(self) -> None:
        """Kill the whole container at once (cgroup.kill) and remove its cgroup."""
        if getattr(self, "cgroup", None) is not None:
            _remove_tree(self.cgroup)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
