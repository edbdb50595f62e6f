"""A cached Debian 12 root for the container tests: ``debootstrap --variant=minbase``.

Built once from this machine's own apt sources (the container has no network, so the package's
Debian dependencies are baked in) and kept under ``HAL0_TEST_CACHE`` (default
``/var/cache/hal0-reconciler-tests``), keyed by the package list: a changed list builds a new
root; an interrupted build never becomes the cache (built aside, renamed when complete).
Run as a script to build it ahead: ``python3 tests/helpers/rootfs.py``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SUITE = "bookworm"
# What the container needs to boot a real systemd, plus the .deb's Depends and Recommends.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "polkitd",
    "python3",
    "procps",
    "python3-watchdog",
    "python3-sdnotify",
    "python3-tomli-w",
    "python3-structlog",
    "python3-psutil",
    "python3-systemd",
)
CACHE = Path(os.environ.get("HAL0_TEST_CACHE", "/var/cache/hal0-reconciler-tests"))


def mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    for text in texts:
        for url in re.findall(r"(?:URIs:\s*|^deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.MULTILINE):
            if "security" not in url and re.search(r"/debian/?$", url):
                return url
    return "http://deb.debian.org/debian"


def key() -> str:
    text = "\n".join([SUITE, os.uname().machine, *sorted(PACKAGES)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def root_dir() -> Path:
    return CACHE / f"rootfs-{SUITE}-{key()}"


def ensure(log: object = sys.stderr) -> Path:
    """The cached root, built first when absent (under a lock: parallel runs build it once)."""
    final = root_dir()
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "etc/os-release").exists():
            return final
        work = CACHE / f".building-{key()}"
        shutil.rmtree(work, ignore_errors=True)  # what an interrupted build left
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(work),
            mirror(),
        ]
        print("building the test root:", " ".join(cmd), file=log)  # type: ignore[call-overload]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
        if done.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            raise RuntimeError(f"debootstrap failed ({done.returncode}): {done.stderr[-2000:]}")
        # no machine-id: systemd makes a transient one at every boot
        (work / "etc/machine-id").unlink(missing_ok=True)
        work.rename(final)
        return final


if __name__ == "__main__":
    print(ensure())
