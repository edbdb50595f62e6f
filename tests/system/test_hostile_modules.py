"""Hostile aiter modules under a real systemd 252: the unit stays up and the slots stay served.

One container (Debian 12, the package installed as the README says). A user owns a JIT folder
and, as that user, truncates a 48 MiB gcc-built module each time it is opened and puts it back
when it is closed (``inotify``), while a sparse module of 8 GiB apparent sits beside it. Full
passes every 2 s keep the aiter check racing the truncation. The unit must start (READY=1) on
time, stay active on the same main process (no SIGBUS, no restart), keep the watchdog fed, and
relabel a slot while all this goes on.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import rows as tables
from helpers import nspawn
from helpers.hosts import REPO
from helpers.nspawn import DEV, FILES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "aiter"))
import tablegen  # tests/aiter is not on the path from this folder

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the aiter test modules"),
]

UNIT = "hal0-reconciler"
SLOTS = "/etc/hal0/slots"
AMD_DIR = "/srv/hal0-amd/amdgpu"
STATUS = "/run/hal0-reconciler/status.json"
PKG = "/opt/aiter-hostile/aiter"
STEM = "a8w8_blockscale_bpreshuffle_tuned_gemm"
RACED = "module_gemm_a8w8_blockscale_bpreshuffle"
SPARSE = "module_gemm_a8w8_blockscale_bpreshuffle_cktile"
PAD = 48 << 20

RACER = r"""
import ctypes, os, struct, sys, time
path = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(path, os.O_RDWR)
original = os.pread(fd, os.fstat(fd).st_size, 0)
ino = libc.inotify_init1(0)
if ino < 0 or libc.inotify_add_watch(ino, path.encode(), 0x20 | 0x10) < 0:
    sys.exit("inotify failed")
rounds = 0
while True:
    data = os.read(ino, 4096)
    off = 0
    while off < len(data):
        _wd, mask, _c, size = struct.unpack_from("iIII", data, off)
        off += 16 + size
        if mask & 0x20:  # IN_OPEN: cut it to one page while it is read
            rounds += 1
            time.sleep((rounds % 7) * 0.002)
            os.ftruncate(fd, 4096)
            print(rounds, flush=True)
        elif mask & 0x10 and os.fstat(fd).st_size != len(original):  # IN_CLOSE_NOWRITE
            os.pwrite(fd, original, 0)
"""


def wait_until(what: str, check: Callable[[], object], timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for: {what}")
        time.sleep(0.2)


def show(box: nspawn.Container) -> dict[str, str]:
    out = box.run(f"systemctl show {UNIT} --no-pager").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def status_json(box: nspawn.Container) -> dict[str, object]:
    done = box.run(f"cat {STATUS}", check=False)
    try:
        data = json.loads(done.stdout)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def journal(box: nspawn.Container, args: str) -> list[dict[str, str]]:
    out = box.run(f"journalctl --no-pager -o json {args}", check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _files(into: Path) -> None:
    """The suite's tables; the raced module (gcc, every name the tables ask, 48 MiB)."""
    configs = tablegen.WRITTEN_CONFIGS
    shutil.copytree(configs, into / "configs")
    rules = routing.parse_routing(
        (REPO / "src/hal0_reconciler/aiter/rules/routing.toml").read_text()
    )
    route = next(t for t in rules.tables if t.stem == STEM)
    names: set[str] = set()
    for path in [configs / f"{STEM}.csv", *sorted((configs / "model_configs").glob(f"*{STEM}*"))]:
        if "untuned" in path.name:
            continue
        table = tables.parse_table(
            path.read_bytes(), route=route, targets=frozenset({tables.Target("gfx950", 256)})
        )
        names |= {row.name for row in table.rows if row.module == RACED}
    (into / "jit").mkdir()
    src = into / "raced.c"
    src.write_text(
        "__attribute__((used)) const char *const registered_names[] = {\n"
        + ",\n".join(f'  "{n}"' for n in sorted(names))
        + f"\n}};\n__attribute__((used)) const char pad[{PAD}] = {{1}};\n"
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O0", "-o", str(into / "jit" / f"{RACED}.so"), str(src)],
        check=True,
        timeout=300,
    )
    (into / "racer.py").write_text(RACER)


@pytest.fixture(scope="module")
def hostile(box: nspawn.Container) -> nspawn.Container:
    staging = box.files / "hostile"  # type: ignore[attr-defined]
    _files(staging)
    box.run("id aiterjit >/dev/null 2>&1 || useradd --system --no-create-home aiterjit")
    box.run(
        f"mkdir -p {PKG} {AMD_DIR} {SLOTS} && cp -a {FILES}/hostile/configs {FILES}/hostile/jit "
        f"{PKG}/ && cp {FILES}/hostile/racer.py /usr/local/bin/racer.py "
        f"&& truncate -s 8G {PKG}/jit/{SPARSE}.so && chown -R aiterjit: {PKG}/jit"
    )
    box.write(
        f"/etc/systemd/system/{UNIT}.service.d/aiter.conf",
        f"[Service]\nReadWritePaths=-{PKG}/jit\n",
    )
    box.run("systemctl daemon-reload")
    return box


def _settings() -> str:
    values = {
        "amdgpu_module_dir": AMD_DIR,
        "kfd_path": f"{DEV}/kfd",
        "dri_dir": f"{DEV}/dri",
        "resync_interval": 2.0,  # a full pass, and an aiter check, every 2 s
    }
    lines = [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return (
        "\n".join(lines)
        + f"\n\n[aiter]\nmodule_max_bytes = {16 << 30}\nsettle_window = 0.2\n"
        + f'\n[[aiter.trees]]\npackage_dir = "{PKG}"\ntarget = "gfx950:256"\nslot_envs = false\n'
    )


def _slot(name: str) -> str:
    return (
        f'name = "{name}"\ntype = "llm"\ndevice = "gpu-vulkan"\nruntime = "container"\n'
        'profile = "coding"\nport = 8090\n'
    )


def test_a_truncation_race_and_a_sparse_module_leave_the_unit_serving(
    hostile: nspawn.Container,
) -> None:
    box = hostile
    box.run(
        "systemctl stop hal0-test-racer 2>/dev/null; systemctl reset-failed hal0-test-racer "
        "2>/dev/null; systemd-run --unit=hal0-test-racer --uid=aiterjit "
        f"python3 /usr/local/bin/racer.py {PKG}/jit/{RACED}.so",
        check=False,
    )
    try:
        wait_until(
            "the racer",
            lambda: (
                box.run("systemctl is-active hal0-test-racer", check=False).stdout.strip()
                == "active"
            ),
        )
        box.write("/etc/hal0/reconciler.toml", _settings())
        # Type=notify: restart returns once READY=1 came (within TimeoutStartSec, or it fails)
        box.run(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}", timeout=90)
        props = show(box)
        assert "active" == props["ActiveState"], props.get("Result")
        main_pid, restarts = props["MainPID"], props["NRestarts"]
        ready = [e for e in journal(box, f"-u {UNIT} -n 200") if e.get("EVENT") == "daemon.ready"]
        assert ready, "no daemon.ready in the journal"
        sparse = wait_until(
            "the sparse module reported",
            lambda: [
                s
                for s in (status_json(box).get("aiter") or {}).get("not_checked", [])  # type: ignore[union-attr]
                if "sparse module" in s
            ],
            60,
        )
        assert any(SPARSE in s for s in sparse)  # type: ignore[union-attr]
        box.write(f"{SLOTS}/raced.toml", _slot("raced"))
        wait_until(
            "the slot relabelled while the race runs",
            lambda: 'device = "gpu-rocm"' in box.run(f"cat {SLOTS}/raced.toml").stdout,
            20,
        )
        time.sleep(40)  # past WatchdogSec=30: a stalled watchdog would have fired
        after = show(box)
        assert (main_pid, restarts, "active") == (
            after["MainPID"],
            after["NRestarts"],
            after["ActiveState"],
        ), "the unit died or was restarted during the race"
        said = box.run(f"journalctl --no-pager -o cat -u {UNIT}", check=False).stdout
        assert "Watchdog timeout" not in said
        assert "Bus error" not in said
        assert "SIGBUS" not in said
        racer_rounds = box.run("journalctl --no-pager -o cat -u hal0-test-racer", check=False)
        rounds = [int(x) for x in racer_rounds.stdout.split() if x.isdigit()]
        assert max(rounds, default=0) >= 10, "the racer truncated the module fewer than 10 times"
        checks = int((status_json(box).get("aiter") or {}).get("checks", 0))  # type: ignore[union-attr]
        assert checks >= 10
        events = [
            json.dumps(e)
            for e in journal(box, f"-u {UNIT}")
            if e.get("EVENT") == "aiter.module_unreadable"
        ]
        assert any("rewritten while read" in r or "keeps changing" in r for r in events), events
    finally:
        box.run("systemctl stop hal0-test-racer", check=False)
        box.run(
            f"rm -f /etc/systemd/system/{UNIT}.service.d/aiter.conf {SLOTS}/raced.toml "
            "&& systemctl daemon-reload",
            check=False,
        )
