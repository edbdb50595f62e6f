"""What the reliability experiments share: scale, figures, a host in temp dirs, the CLI as a
real process, and the checks every experiment makes (old-or-new bytes, temp files, outside
writes).

Every experiment is sized to run in CI in seconds; ``--soak`` (or ``HAL0_SOAK=<factor>``) runs
the full counts by hand. Figures add up over the session and are printed at the end (see
``conftest.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from hal0_reconciler import fsio
from helpers import devnodes
from helpers.daemon_host import Host, slot_text

REPO = Path(__file__).resolve().parents[2]
FIGURES: Counter[str] = Counter()
"""kills, torn, lost, cases, crashes, hangs, outside writes ... (summed over the session)."""
NOTES: dict[str, str] = {}
"""Measured values that are not counts (RSS, worst cost per file), printed as they are."""
FIGURE_ORDER = ("kills", "torn", "lost", "cases", "crashes", "hangs", "outside writes")

_SOAK = {"factor": float(os.environ.get("HAL0_SOAK", "0") or 0)}


def set_soak(factor: float) -> None:
    _SOAK["factor"] = factor


def soaking() -> bool:
    return _SOAK["factor"] > 0


def scaled(ci: int, soak: int) -> int:
    """``ci`` in the default run; ``soak`` (times the factor beyond 1) when soaking."""
    factor = _SOAK["factor"]
    return ci if factor <= 0 else max(ci, round(soak * factor))


# -- a host and the command line as a process -----------------------------------------------


def quiet_systemctl(folder: Path) -> Path:
    """A systemctl that answers every unit "inactive" at once (no restarts, no cost)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "systemctl"
    path.write_text("#!/bin/sh\necho inactive\nexit 3\n")
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def amd_host(root: Path) -> Iterator[Host]:
    """An AMD host in temp dirs whose ROCm lane is usable by the service user."""
    with devnodes.dev_tree() as dev:
        yield Host(root, dev)


def cli_argv(host: Host, verb: str, **settings: object) -> list[str]:
    """``python -m hal0_reconciler <verb>`` on the host's paths (JSON logs, quiet systemctl)."""
    o = host.overrides()
    argv = [sys.executable, "-m", "hal0_reconciler", verb, "--log-format", "json"]
    flags = (
        "slots_dir",
        "state_dir",
        "runtime_dir",
        "amdgpu_module_dir",
        "kfd_path",
        "dri_dir",
        "profiles_file",
    )
    for key in flags:
        value = settings.pop(key, o[key])  # a flag wins over --set: one or the other
        argv += ["--" + key.replace("_", "-"), str(value)]
    argv += ["--user", o["service_user"]]
    values = {k: v for k, v in o.items() if k not in (*flags, "service_user")}  # hal0's tree too
    values.update(
        {
            "systemctl": str(quiet_systemctl(host.root / "quiet-bin")),
            "lock_timeout": "2",
            "demote_grace": "0",
            **{k: str(v) for k, v in settings.items()},
        }
    )
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **extra}
    for name in ("JOURNAL_STREAM", "WATCHDOG_PID", "WATCHDOG_USEC", "NOTIFY_SOCKET"):
        if name not in extra:
            env.pop(name, None)
    return env


def run_cli(
    host: Host, verb: str, *, timeout: float = 60.0, **settings: object
) -> subprocess.CompletedProcess[str]:
    """Run a verb to its end (killed and counted as a hang after ``timeout``)."""
    try:
        return subprocess.run(
            cli_argv(host, verb, **settings),
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        FIGURES["hangs"] += 1
        raise


def start_daemon(
    host: Host, notify_socket: Path | None = None, **settings: object
) -> subprocess.Popen[bytes]:
    """``run`` as a process; its log goes to ``daemon_log(host)`` (a pipe nobody reads while
    the test runs would fill up and block the daemon's logging)."""
    env = cli_env() if notify_socket is None else cli_env(NOTIFY_SOCKET=str(notify_socket))
    with daemon_log(host).open("ab") as log:
        return subprocess.Popen(
            cli_argv(host, "run", **settings), env=env, stdout=subprocess.DEVNULL, stderr=log
        )


def daemon_log(host: Host) -> Path:
    return host.root / "daemon.log"


def daemon_events(host: Host) -> list[dict[str, object]]:
    """The JSON log lines of every daemon the test started on this host."""
    decoder = json.JSONDecoder()
    events = []
    for line in daemon_log(host).read_text().splitlines():
        at = 0
        while line.startswith("{", at):  # two threads' lines can end up on one (seen here)
            event, at = decoder.raw_decode(line, at)
            events.append(event)
    return events


def tracebacks(text: str) -> int:
    return text.count("Traceback (most recent call last)")


def kill_tree(child: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGKILL a child this test started (and wait for it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGKILL)
    child.wait(10)


# -- slot files -----------------------------------------------------------------------------


def write_vulkan_slots(folder: Path, count: int, *, prefix: str = "s") -> dict[Path, bytes]:
    """``count`` llama.cpp slots labelled gpu-vulkan (each needs a relabel); their bytes."""
    written = {}
    for n in range(count):
        path = folder / f"{prefix}{n:05d}.toml"
        data = slot_text(f"{prefix}{n}", port=9000 + n % 1000).encode()
        path.write_bytes(data)
        written[path] = data
    return written


def relabelled(old: bytes) -> bytes:
    return old.replace(b'device = "gpu-vulkan"', b'device = "gpu-rocm"')


def torn_files(old: dict[Path, bytes]) -> list[Path]:
    """Files that are neither exactly their old bytes nor exactly the relabelled bytes, or that
    no longer parse; counted in the figures."""
    torn = []
    for path, data in old.items():
        now = path.read_bytes()
        if now not in (data, relabelled(data)):
            torn.append(path)
            continue
        try:
            tomllib.loads(now.decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            torn.append(path)
    FIGURES["torn"] += len(torn)
    return torn


def own_temps(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if fsio.is_own_temp(n))


def tree_digest(root: Path, *, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """Every file under ``root`` (not following symlinks) → sha256 of its bytes or link target,
    except under ``skip``; compared before and after to count outside writes."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in skip]
        for name in files + [d for d in dirs if (here / d).is_symlink()]:
            path = here / name
            if path in skip:
                continue
            if path.is_symlink():
                found[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(path)] = "special"
    return found


def outside_writes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    FIGURES["outside writes"] += len(changed)
    return changed


def wait_for(predicate: object, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            FIGURES["hangs"] += 1
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
