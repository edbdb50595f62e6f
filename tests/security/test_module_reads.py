"""Root never maps, nor pays for, a module another user can change.

The owner of a JIT folder plays against the aiter check (a real subprocess, so a SIGBUS is an
exit status, not a dead test run): it truncates a gcc-built module the moment it is opened
(``inotify`` ``IN_OPEN``), rewrites it during every read, or leaves a sparse module of many GiB.
The check must finish every time, say what it saw ("rewritten while read", "keeps changing",
"sparse module", "module too large"), heal nothing, and hold no more memory than a chunk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.attacker import Attacker, Tally

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "aiter"))
import tablegen  # tests/aiter is not on the path from this folder

REPO = Path(__file__).resolve().parents[2]
MODULE = "module_gemm_a8w8_blockscale_bpreshuffle"
PAD_BYTES = 48 << 20  # a module of some tens of MiB, as real aiter modules are

# The attacker: as the folder's owner, it holds the module open (its own opens are not the
# check's) and answers each IN_OPEN of it by the check: ``truncate`` cuts it to one page after a
# delay that walks through the read, then puts the bytes back when the reader closes it;
# ``rewrite`` changes a byte in place during every read.
_ATTACKER = r"""
import ctypes, os, struct, sys, time
uid, gid, path, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.setgroups([]); os.setgid(gid); os.setuid(uid)
libc = ctypes.CDLL(None, use_errno=True)
IN_OPEN, IN_CLOSE_NOWRITE = 0x20, 0x10
fd = os.open(path, os.O_RDWR)
original = os.pread(fd, os.fstat(fd).st_size, 0)
ino = libc.inotify_init1(0)
if ino < 0 or libc.inotify_add_watch(ino, path.encode(), IN_OPEN | IN_CLOSE_NOWRITE) < 0:
    sys.exit("inotify failed")
print("ready", flush=True)
rounds = 0
while True:
    data = os.read(ino, 4096)
    off = 0
    while off < len(data):
        _wd, mask, _cookie, size = struct.unpack_from("iIII", data, off)
        off += 16 + size
        if mask & IN_OPEN:
            rounds += 1
            if mode == "truncate":
                time.sleep((rounds % 7) * 0.002)
                os.ftruncate(fd, 4096)
            else:
                os.pwrite(fd, bytes([rounds % 251]), len(original) // 2)
        elif mask & IN_CLOSE_NOWRITE and mode == "truncate" and os.fstat(fd).st_size != len(original):
            os.pwrite(fd, original, 0)
"""

# The root side: checks in one process (the CLI's monitor), each verdict printed as JSON.
_CHECKS = r"""
import json, sys
from pathlib import Path
from hal0_reconciler.aiter import monitor
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
spec = json.loads(sys.argv[1])
tree = AiterTree(package_dir=Path(spec["package"]), jit_dir=Path(spec["jit"]), target="gfx950:256")
settings = Settings(
    slots_dir=Path(spec["slots"]), state_dir=Path(spec["state"]),
    aiter=AiterSettings(trees=(tree,), **spec["options"]),
)
mon = None
for _ in range(spec["rounds"]):
    if mon is None or not spec["one_monitor"]:  # one monitor: what a daemon does
        mon = monitor.AiterMonitor(settings, log_findings=False)
    report = mon.check(heal=True)
    for p in report.plans:
        for m in p.modules:
            if m.module == spec["module"]:
                print(json.dumps({"status": str(m.status), "action": str(m.action),
                                  "reason": m.reason}), flush=True)
mon.surveyor.trees.close()  # the owner's child is reaped: its peak counts below
import resource
peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(f"peak {peak}")
"""


@dataclass
class Box:
    base: Path
    package: Path
    jit: Path
    slots: Path
    state: Path

    @property
    def module(self) -> Path:
        return self.jit / f"{MODULE}.so"

    def checks(
        self, rounds: int, *, one_monitor: bool = False, **options: object
    ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]], int]:
        """``rounds`` checks in a real subprocess: (the run, each verdict, its peak RSS KiB)."""
        spec = {
            "package": str(self.package),
            "jit": str(self.jit),
            "slots": str(self.slots),
            "state": str(self.state),
            "module": MODULE,
            "rounds": rounds,
            "options": options,
            "one_monitor": one_monitor,
        }
        run = subprocess.run(
            [sys.executable, "-c", _CHECKS, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        verdicts = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        peaks = [
            int(line.split()[1]) for line in run.stdout.splitlines() if line.startswith("peak")
        ]
        return run, verdicts, max(peaks, default=-1)


@pytest.fixture
def box(attacker: Attacker) -> Iterator[Box]:
    base = Path(tempfile.mkdtemp(prefix="hal0-sec-modules-", dir="/tmp"))
    base.chmod(0o755)
    package = base / "site-packages" / "aiter"
    shutil.copytree(tablegen.WRITTEN_CONFIGS, package / "configs")
    jit = base / "jit"
    jit.mkdir()
    attacker.chown(jit)
    slots = base / "slots"
    slots.mkdir()
    try:
        yield Box(base, package, jit, slots, base / "state")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _gcc_module(box: Box, attacker: Attacker, *, pad_bytes: int) -> Path:
    """A real shared object (gcc) in the attacker's JIT folder, owned by the attacker."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    src = box.base / "m.c"
    src.write_text(
        '__attribute__((used)) const char *const names[] = {"a8w8_blockscale_kernel_1"};\n'
        f"__attribute__((used)) const char pad[{pad_bytes}] = {{1}};\n"
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O0", "-o", str(box.module), str(src)],
        check=True,
        timeout=600,
    )
    attacker.chown(box.module)
    return box.module


def _attacker(attacker: Attacker, path: Path, mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _ATTACKER, str(attacker.uid), str(attacker.gid), str(path), mode],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert "ready" == proc.stdout.readline().strip()
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _no_quarantine(box: Box) -> None:
    assert not (box.jit / ".hal0-quarantine").exists()


def test_a_module_truncated_while_it_is_read_never_kills_root(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """The owner truncates a 48 MiB gcc-built module at each open, at delays walking through
    the read, 40 times: every check finishes (no SIGBUS), the module is judged again next time
    ("rewritten while read") or read whole, never healed on a short read."""
    rounds = 40
    attacks.tried("aiter module truncated while read", rounds)
    _gcc_module(box, attacker, pad_bytes=PAD_BYTES)
    racer = _attacker(attacker, box.module, "truncate")
    try:
        run, verdicts, _ = box.checks(rounds)
    finally:
        _stop(racer)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    assert rounds == len(verdicts)
    reasons = [v["reason"] for v in verdicts]
    print(sorted(set(reasons)))
    assert any("rewritten while read" in r or "keeps changing" in r for r in reasons), reasons
    for v in verdicts:
        if v["status"] == "unreadable":
            assert v["action"] == "none"
    # No "no quarantine" here: the owner truncates at every open of its module, so one check
    # can find it already cut to a page before it looks and read that page whole, its identity
    # steady from the look to the end of the read. Moving such a module aside, as its owner, is
    # aiter's own heal of a module that registers nothing. What must never happen is a heal on a
    # short or moving read (the loop above) or root dying (the exit status).
    attacks.held("aiter module truncated while read", rounds)


def test_a_module_rewritten_during_every_read_keeps_changing_after_three_checks(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """A byte changed during every read: two checks say "rewritten while read" (judged again),
    the third "not checked: keeps changing" (degraded); nothing is healed."""
    attacks.tried("aiter module rewritten during every read")
    _gcc_module(box, attacker, pad_bytes=PAD_BYTES)
    racer = _attacker(attacker, box.module, "rewrite")
    try:
        run, verdicts, _ = box.checks(3, one_monitor=True)
    finally:
        _stop(racer)
    assert run.returncode == 0, run.stderr[-3000:]
    reasons = [v["reason"] for v in verdicts]
    assert 3 == len(reasons)
    assert ["rewritten while read; judged again at the next check"] * 2 == [
        r.removeprefix("cannot read the module: ") for r in reasons[:2]
    ]
    assert reasons[2].startswith("not checked: keeps changing"), reasons
    _no_quarantine(box)
    attacks.held("aiter module rewritten during every read")


def _sparse(box: Box, attacker: Attacker, size: int) -> Path:
    """A module of ``size`` bytes apparent and one page written (the rest a hole)."""
    box.module.write_bytes(b"\x7fELF" + b"\0" * 4092)
    os.truncate(box.module, size)
    attacker.chown(box.module)
    return box.module


def test_a_sparse_module_of_many_gib_is_not_read(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """8 GiB apparent, one page on disk, under a cap of 16 GiB: "not checked: sparse module",
    never healed, and the check's process peaks far below the module's size."""
    attacks.tried("aiter sparse module")
    _sparse(box, attacker, 8 << 30)
    run, verdicts, peak_kib = box.checks(1, module_max_bytes=16 << 30)
    assert run.returncode == 0, run.stderr[-3000:]
    (v,) = verdicts
    assert v["reason"].startswith("not checked: sparse module"), v
    assert ("unreadable", "none") == (v["status"], v["action"])
    assert 0 < peak_kib < 512 << 10  # KiB: far below 8 GiB (a read through would hold GiBs)
    assert 8 << 30 == box.module.stat().st_size
    _no_quarantine(box)
    attacks.held("aiter sparse module")


def test_a_module_over_the_cap_is_not_read(box: Box, attacker: Attacker, attacks: Tally) -> None:
    """Over ``module_max_bytes`` (the default 1 GiB, here 2 GiB apparent): "not checked: module
    too large", never healed."""
    attacks.tried("aiter module over the cap")
    _sparse(box, attacker, 2 << 30)
    run, verdicts, _ = box.checks(1)
    assert run.returncode == 0, run.stderr[-3000:]
    (v,) = verdicts
    assert v["reason"].startswith("not checked: module too large"), v
    assert f"over module_max_bytes = {1 << 30}" in v["reason"]
    assert ("unreadable", "none") == (v["status"], v["action"])
    _no_quarantine(box)
    attacks.held("aiter module over the cap")
