"""The files root reads back that another user may replace: hal0's ``api.env``, the status,
state and settings files. Each is read through ``boundedread``: a FIFO, a link or a giant is
refused by path and reason, without blocking, and the verb still answers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.attacker import Attacker, Tally
from helpers.hosts import REPO
from integration.test_cli import host_args, make_usable_lane

pytestmark = pytest.mark.timeout(120)

BOUND = 30  # seconds: a verb that has not answered by then is hung on the file


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The command line as a real child, hal0's roots under ``home``; hung → TimeoutExpired."""
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HAL0_HOME": str(home)}
    for name in ("JOURNAL_STREAM", "NOTIFY_SOCKET"):
        environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "hal0_reconciler", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=BOUND,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def plant_fifo(path: Path, attacker: Attacker) -> None:
    """A FIFO at ``path`` in a folder the attacker owns, owned by the attacker."""
    if path.exists() or path.is_symlink():
        path.unlink()
    attacker.chown(path.parent)
    os.mkfifo(path)
    attacker.chown(path)


def seed_one_slot(slots: Path) -> None:
    shutil.copy2(REPO / "tests/data/slots/agent.toml", slots / "agent.toml")


@pytest.mark.parametrize("verb", ["plan", "once", "probe"])
def test_an_api_env_that_is_a_fifo_is_refused_and_the_verb_still_answers(
    verb: str, attacker: Attacker, attacks: Tally, host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """api.env as a FIFO on a usable ROCm host: plan, once and probe answer within the bound,
    plan and probe name the refused file, and once still relabels the Vulkan slot."""
    env_file = tmp_path / "etc/hal0/api.env"
    make_usable_lane(host_dirs)
    seed_one_slot(host_dirs["slots_dir"])
    plant_fifo(env_file, attacker)
    attacks.tried("api.env fifo")
    result = run_cli(verb, *host_args(host_dirs), home=tmp_path)
    said = result.stdout + result.stderr
    assert "Traceback" not in said
    if verb in ("plan", "probe"):  # they show hal0's facts: the refused source is a problem line
        line = f"  hal0: environment ({env_file}): cannot be read (a fifo, not a "
        assert line + "regular file): no image overrides used" in result.stdout.splitlines()
    assert {"plan": 2, "once": 0, "probe": 0}[verb] == result.returncode, said
    device = 'device = "gpu-rocm"' if verb == "once" else 'device = "gpu-vulkan"'
    assert device in (host_dirs["slots_dir"] / "agent.toml").read_text()
    assert env_file.is_fifo()
    attacks.held("api.env fifo")


def test_a_huge_sparse_api_env_is_refused_by_its_cap(
    attacker: Attacker, attacks: Tally, host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A 64 MiB sparse api.env is not read: probe says it is over the 1 MiB cap."""
    env_file = tmp_path / "etc/hal0/api.env"
    env_file.parent.mkdir(parents=True, exist_ok=True)
    with env_file.open("wb") as fh:
        fh.truncate(64 << 20)
    attacker.chown(env_file)
    attacks.tried("api.env huge")
    result = run_cli("probe", "--json", *host_args(host_dirs), home=tmp_path)
    doc = json.loads(result.stdout)
    why = f"environment ({env_file}): cannot be read (larger than the 1048576-byte limit"
    assert [p for p in doc["hal0"]["problems"] if p.startswith(why)], doc["hal0"]["problems"]
    assert 64 << 20 == env_file.stat().st_size
    attacks.held("api.env huge")


def forged_status(target: Path) -> None:
    """A status file saying "running, healthy", its pid this test's own (alive)."""
    start = Path(f"/proc/{os.getpid()}/stat").read_bytes()
    start_ticks = float(start[start.rfind(b")") + 2 :].split()[19])
    snapshot = {
        "pid": os.getpid(),
        "pid_start": start_ticks,
        "ready": True,
        "healthy": True,
        "health": "healthy",
        "heartbeat": 30.0,
        "updated_at": 4e9,
    }
    target.write_text(json.dumps(snapshot))


def test_a_status_file_that_is_a_fifo_gives_status_unknown_not_a_hang(
    attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    """status.json as a FIFO: `status` says why and exits 4 (LSB: unknown), text and JSON."""
    runtime = tmp_path / "run/hal0-reconciler"
    runtime.mkdir(parents=True)
    plant_fifo(runtime / "status.json", attacker)
    attacks.tried("status.json fifo", 2)
    text = run_cli("status", "--runtime-dir", str(runtime), home=tmp_path)
    expected = f"status unknown ({runtime / 'status.json'}: a FIFO, not a regular file)"
    assert 4 == text.returncode, text.stdout + text.stderr
    assert f"hal0-reconciler: {expected}\n" == text.stdout
    attacks.held("status.json fifo")
    machine = run_cli("status", "--json", "--runtime-dir", str(runtime), home=tmp_path)
    assert 4 == machine.returncode
    assert expected == json.loads(machine.stdout)["summary"]
    attacks.held("status.json fifo")


def test_a_status_file_planted_as_a_symlink_is_not_followed(
    attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    """A status.json symlink to a forged "healthy" file: `status` refuses the link, exit 4."""
    runtime = tmp_path / "run/hal0-reconciler"
    runtime.mkdir(parents=True)
    attacker.chown(runtime)
    forged = tmp_path / "forged.json"
    forged_status(forged)
    (runtime / "status.json").symlink_to(forged)
    attacks.tried("status.json symlink")
    result = run_cli("status", "--runtime-dir", str(runtime), home=tmp_path)
    path = runtime / "status.json"
    assert 4 == result.returncode, result.stdout
    assert f"hal0-reconciler: status unknown ({path}: a symlink (never followed))\n" == (
        result.stdout
    )
    attacks.held("status.json symlink")


def test_a_demotion_record_that_is_a_fifo_leaves_plan_answering(
    attacker: Attacker, attacks: Tally, host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """demotions.json as a FIFO: `plan` on an AMD host answers, and logs the file unreadable."""
    seed_one_slot(host_dirs["slots_dir"])
    host_dirs["state_dir"].mkdir(parents=True)
    plant_fifo(host_dirs["state_dir"] / "demotions.json", attacker)
    attacks.tried("state fifo")
    args = (*host_args(host_dirs), "--assume-amd", "--assume-rocm=usable")
    result = run_cli("plan", *args, home=tmp_path)
    assert 2 == result.returncode, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    unreadable = [e for e in events if e.get("event") == "state.unreadable"]
    assert [["a FIFO, not a regular file"]] == [[e["error"]] for e in unreadable]
    attacks.held("state fifo")


def test_a_settings_file_that_is_a_fifo_is_a_one_line_error(
    attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    """--config naming a FIFO: one error line naming it, exit 78 (the settings), no hang."""
    fifo = tmp_path / "conf/reconciler.toml"
    fifo.parent.mkdir()
    plant_fifo(fifo, attacker)
    attacks.tried("settings fifo")
    result = run_cli("plan", "--config", str(fifo), home=tmp_path)
    assert 78 == result.returncode
    expected = f"{fifo}: cannot read the settings file: a FIFO, not a regular file"
    assert [f"hal0-reconciler: error: {expected}"] == result.stderr.splitlines()
    attacks.held("settings fifo")


def test_a_fifo_at_the_default_settings_path_is_refused_loudly(
    attacker: Attacker, attacks: Tally, host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A FIFO where /etc/hal0/reconciler.toml goes: an error naming it, not silent defaults."""
    fifo = tmp_path / "etc/hal0/reconciler.toml"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    plant_fifo(fifo, attacker)
    attacks.tried("settings fifo")
    result = run_cli("plan", *host_args(host_dirs), home=tmp_path)
    assert 78 == result.returncode, result.stdout
    expected = f"{fifo}: cannot read the settings file: a FIFO, not a regular file"
    assert [f"hal0-reconciler: error: {expected}"] == result.stderr.splitlines()
    attacks.held("settings fifo")


def test_a_huge_settings_file_is_refused_by_its_cap(attacks: Tally, tmp_path: Path) -> None:
    """A 16 MiB sparse settings file is refused with the cap named, not parsed."""
    big = tmp_path / "reconciler.toml"
    with big.open("wb") as fh:
        fh.truncate(16 << 20)
    attacks.tried("settings huge")
    result = run_cli("plan", "--config", str(big), home=tmp_path)
    assert 78 == result.returncode
    assert "larger than the 1048576-byte limit (16777216 bytes)" in result.stderr
    attacks.held("settings huge")


def in_a_child(code: str, *, home: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter with the package importable; hung → TimeoutExpired."""
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HAL0_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        timeout=BOUND,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_our_own_memories_read_back_refuse_a_fifo(
    attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    """The seen-slots memory and the aiter caches, each a FIFO: read back as empty, no hang."""
    state = tmp_path / "state"
    state.mkdir()
    for name in ("seen.json", "tables.json", "needs.json"):
        plant_fifo(state / name, attacker)
    attacks.tried("state fifo", 3)
    code = f"""
from pathlib import Path
from hal0_reconciler.slots.seen import SeenSlots
from hal0_reconciler.aiter.tables import cachefile
state = Path({str(state)!r})
print(len(SeenSlots.load(state / "seen.json", scope="s")._entries))
print(cachefile.read(state / "tables.json", 1, "tables"))
print(cachefile.read(state / "needs.json", 1, "entries"))
"""
    result = in_a_child(code, home=tmp_path)
    assert ["0", "({}, True)", "({}, True)"] == result.stdout.splitlines(), result.stderr
    attacks.held("state fifo", 3)


def test_a_slot_unit_that_is_a_fifo_does_not_hang_the_identity(
    attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    """A hal0-slot@ unit file that is a FIFO: the probe's identity is still chosen (root)."""
    units = tmp_path / "units"
    units.mkdir()
    plant_fifo(units / "hal0-slot@x.container", attacker)
    attacks.tried("unit fifo")
    code = f"""
from pathlib import Path
from hal0_reconciler.settings import Settings
from hal0_reconciler.host import identity
print(identity.slot_runner(Settings(slot_unit_dirs=(Path({str(units)!r}),))).spec)
"""
    result = in_a_child(code, home=tmp_path)
    assert ["root"] == result.stdout.splitlines(), result.stderr
    attacks.held("unit fifo")
