"""The aiter half's reads, attacked by the user who owns a JIT folder or writes slot files.

Each test plays the attacker against the one-shot verbs (``aiter plan`` / ``heal``, in-process
and as a real subprocess under strace) and counts its attacks in the run's tally.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hal0_reconciler.aiter import cli, monitor
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers.attacker import Attacker, Tally

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "aiter"))
import tablegen  # tests/aiter is not on the path from this folder

REPO = Path(__file__).resolve().parents[2]
DATA_CONFIGS = tablegen.WRITTEN_CONFIGS  # tables of the suite's own making
BPS_CK = "module_gemm_a8w8_blockscale_bpreshuffle"
BPS_VAR = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE"
SHADOW_LINE = "root:$6$hal0secretsalt$DoNotEverPrintThisHash0123456789:19700:0:99999:7:::"


@dataclass
class Box:
    """A host in a folder every user can reach: root's aiter package, the attacker's JIT."""

    base: Path
    package: Path
    jit: Path
    slots: Path
    state: Path
    secret: Path

    def settings(self, *, jit_dir: Path | None = None, **options: object) -> Settings:
        tree = AiterTree(package_dir=self.package, jit_dir=jit_dir or self.jit, target="gfx950:256")
        return Settings(
            slots_dir=self.slots,
            state_dir=self.state,
            aiter=AiterSettings(trees=(tree,), **options),  # type: ignore[arg-type]
        )


@pytest.fixture
def box(attacker: Attacker) -> Iterator[Box]:
    base = Path(tempfile.mkdtemp(prefix="hal0-sec-aiter-", dir="/tmp"))
    base.chmod(0o755)
    package = base / "site-packages" / "aiter"
    shutil.copytree(DATA_CONFIGS, package / "configs")
    jit = base / "jit"
    jit.mkdir()
    attacker.chown(jit)
    slots = base / "slots"
    slots.mkdir()
    secret = base / "shadow"
    secret.write_text(SHADOW_LINE + "\n")
    secret.chmod(0o600)
    try:
        yield Box(base, package, jit, slots, base / "state", secret)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _plan(settings: Settings, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="verb"))
    out = io.StringIO()
    return cli.main(parser.parse_args(["aiter", "plan", *argv]), settings, out=out), out.getvalue()


def _module(report: monitor.MonitorReport, module: str) -> plan.ModulePlan:
    (found,) = [m for p in report.plans for m in p.modules if m.module == module]
    return found


def _check_within(settings: Settings, *, heal: bool, unblock: Path | None = None) -> object:
    """One check in a thread, bounded: a blocked open is released (FIFO) and the test fails."""
    done: list[object] = []
    worker = threading.Thread(
        target=lambda: done.append(monitor.AiterMonitor(settings).check(heal=heal)), daemon=True
    )
    worker.start()
    worker.join(30)
    if worker.is_alive() and unblock is not None:
        fd = os.open(unblock, os.O_WRONLY | os.O_NONBLOCK)  # let the stuck reader go
        os.close(fd)
        worker.join(10)
    assert [] != done, "the check did not finish: it blocked on a file in the tree"
    return done[0]


def test_a_module_linked_to_a_root_secret_is_never_read_nor_moved(box: Box, attacks: Tally) -> None:
    """``module_*.so`` → a 0600 root file: not followed, reported unreadable, left in place."""
    attacks.tried("aiter module symlink to a secret")
    link = box.jit / f"{BPS_CK}.so"
    link.symlink_to(box.secret)
    report = _check_within(box.settings(), heal=True)
    assert isinstance(report, monitor.MonitorReport)
    mod = _module(report, BPS_CK)
    assert (plan.Status.UNREADABLE, plan.Action.NONE) == (mod.status, mod.action)
    assert "symlink" in mod.reason
    assert link.is_symlink()
    assert SHADOW_LINE + "\n" == box.secret.read_text()
    assert not (box.jit / ".hal0-quarantine").exists()
    attacks.held("aiter module symlink to a secret")


def test_a_module_linked_to_a_device_is_never_opened(box: Box, attacks: Tally) -> None:
    """``module_*.so`` → a character device (a null device the test makes): not opened."""
    attacks.tried("aiter module symlink to a device")
    dev = box.base / "null"
    os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
    (box.jit / f"{BPS_CK}.so").symlink_to(dev)
    report = _check_within(box.settings(), heal=True)
    assert isinstance(report, monitor.MonitorReport)
    mod = _module(report, BPS_CK)
    assert plan.Status.UNREADABLE == mod.status
    assert (box.jit / f"{BPS_CK}.so").is_symlink()
    attacks.held("aiter module symlink to a device")


def test_a_fifo_module_never_blocks_the_check(box: Box, attacks: Tally) -> None:
    """A FIFO named like a module: the check finishes and says what it is."""
    attacks.tried("aiter FIFO module")
    fifo = box.jit / f"{BPS_CK}.so"
    os.mkfifo(fifo)
    os.chown(fifo, int(box.jit.stat().st_uid), -1)
    report = _check_within(box.settings(), heal=True, unblock=fifo)
    assert isinstance(report, monitor.MonitorReport)
    mod = _module(report, BPS_CK)
    assert plan.Status.UNREADABLE == mod.status
    assert "a FIFO" in mod.reason
    attacks.held("aiter FIFO module")


def test_plan_says_whose_credentials_handled_the_tree(box: Box, attacker: Attacker) -> None:
    """``aiter plan`` (text and --json) names the JIT folder's owner as the tree's handler."""
    code, text = _plan(box.settings())
    assert f"files handled as {attacker.name} (uid {attacker.uid}" in text
    _, raw = _plan(box.settings(), "--json")
    assert {
        f"{attacker.name} (uid {attacker.uid}, gid {attacker.gid}; the JIT folder's owner)"
    } == {p["handled_as"] for p in json.loads(raw)["plans"]}
    assert code in (0, 2)


def test_a_slot_table_path_outside_the_trees_is_never_read(
    box: Box, attacks: Tally, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot's AITER_CONFIG_* naming a root file outside the tree: not checked, never read,
    never printed; ``aiter plan`` exits 1."""
    attacks.tried("aiter slot env table outside the trees")
    (box.slots / "evil.toml").write_text(f'[server]\nenv = {{ {BPS_VAR} = "{box.secret}" }}\n')
    opened: list[str] = []
    real_open = os.open

    def spy(path: object, *args: object, **kwargs: object) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    code, text = _plan(box.settings())
    _, raw = _plan(box.settings(), "--json")
    monkeypatch.undo()
    (slot,) = [p for p in json.loads(raw)["plans"] if p["environment"] == "slot:evil"]
    assert 1 == code
    assert False is slot["checked"]
    assert (
        f"not checked: path outside configured trees (slot evil, {BPS_VAR} = '{box.secret}')"
        == slot["problems"][0]
    )
    assert "DoNotEverPrintThisHash" not in text + raw
    assert [] == [p for p in opened if p == str(box.secret)]
    attacks.held("aiter slot env table outside the trees")


def test_a_slot_jit_dir_outside_the_trees_is_never_looked_into(box: Box, attacks: Tally) -> None:
    """A slot's AITER_JIT_DIR naming a victim folder: not checked, nothing made or moved there."""
    attacks.tried("aiter slot env JIT folder outside the trees")
    victim = box.base / "victim"
    (victim / "keep").mkdir(parents=True)
    (box.package / "jit").mkdir()
    (box.slots / "evil.toml").write_text(
        f'[server]\nenv = {{ AITER_JIT_DIR = "{victim}", {BPS_VAR} = "" }}\n'
    )
    settings = box.settings()
    tree = settings.aiter.trees[0]
    settings = Settings(
        slots_dir=settings.slots_dir,
        state_dir=settings.state_dir,
        aiter=AiterSettings(trees=(AiterTree(package_dir=tree.package_dir, target=tree.target),)),
    )
    report = _check_within(settings, heal=True)
    assert isinstance(report, monitor.MonitorReport)
    (slot,) = [p for p in report.plans if p.environment == "slot:evil"]
    assert (False, ()) == (slot.checked, slot.modules)
    assert ["keep"] == sorted(p.name for p in victim.iterdir())
    attacks.held("aiter slot env JIT folder outside the trees")


def test_a_huge_sparse_table_is_refused_by_its_size(box: Box, attacks: Tally) -> None:
    """A 2 GiB sparse default table: refused by the cap before a byte is read, no traceback."""
    attacks.tried("aiter huge sparse table")
    table = box.package / "configs" / "a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
    with table.open("r+b") as fh:
        fh.truncate(2 << 30)
    report = _check_within(box.settings(), heal=False)
    assert isinstance(report, monitor.MonitorReport)
    errors = {s.error for p in report.plans for s in p.sources if s.file.path == table}
    assert {"larger than the 67108864-byte limit (2147483648 bytes)"} == errors
    attacks.held("aiter huge sparse table")


def test_a_table_of_a_million_rows_is_refused_by_its_line_count(box: Box, attacks: Tally) -> None:
    """1e6 small rows (under the byte cap): refused before parsing, with the reason."""
    attacks.tried("aiter million-row table")
    table = box.package / "configs" / "a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
    header = table.read_text().splitlines()[0]
    with table.open("w") as fh:
        fh.write(header + "\n")
        fh.write("gfx950,256,1,1,1,ck,0,0,1.0,k,1.0,1.0,0.0\n" * 1_000_000)
    started = time.monotonic()
    report = _check_within(box.settings(), heal=False)
    elapsed = time.monotonic() - started
    assert isinstance(report, monitor.MonitorReport)
    errors = {s.error for p in report.plans for s in p.sources if s.file.path == table}
    assert {"more than the 200000-line limit (1000001 lines); not parsed"} == errors
    print(f"1e6-row table refused in {elapsed:.2f}s")
    attacks.held("aiter million-row table")


def test_a_shadow_like_file_as_a_table_is_never_echoed(box: Box, attacks: Tally) -> None:
    """A table whose first line is a password hash: the error says what is wrong, not the bytes."""
    attacks.tried("aiter table first line echoed")
    table = box.package / "configs" / "a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
    table.write_text(SHADOW_LINE + "\n")
    _, text = _plan(box.settings())
    _, raw = _plan(box.settings(), "--json")
    assert "not an aiter table" in text
    assert "DoNotEverPrintThisHash" not in text + raw
    attacks.held("aiter table first line echoed")


_SWAPPER = r"""
import os, sys, time
uid, gid, jit, secret, rounds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
os.setgroups([]); os.setgid(gid); os.setuid(uid)
mod = os.path.join(jit, "module_gemm_a8w8_blockscale_bpreshuffle.so")
tmp = mod + ".swap"
end = time.monotonic() + 20
done = 0
for i in range(rounds):
    if time.monotonic() > end:
        break
    kind = i % 4
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if kind == 0:
            os.symlink(secret, tmp)
        elif kind == 1:
            os.mkfifo(tmp)
        elif kind == 2:
            try:
                os.link(secret, tmp)  # protected_hardlinks refuses: a plain file instead
            except OSError:
                open(tmp, "wb").close()
        else:
            os.symlink("/dev/zero", tmp)
        os.rename(tmp, mod)
        done += 1
    except OSError:
        pass
print(done)
"""


def _strace_events(log: Path) -> list[str]:
    """The file syscalls the root process itself made (its threads too; not the owner's child)."""
    child_pids: set[int] = set()
    calls = [line.split(None, 1) for line in log.read_text(errors="replace").splitlines()]
    for pid, call in calls:
        if "execve(" in call and "hal0_reconciler.aiter.trees." in call:
            child_pids.add(int(pid))
    return [call for pid, call in calls if int(pid) not in child_pids]


def test_root_never_opens_inside_the_attackers_jit_while_it_swaps_files(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """Under strace, with the owner swapping links, FIFOs and hardlinks in: root's own process
    opens, renames and unlinks nothing inside the JIT folder; every plan finishes."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed: the syscall trace cannot be taken")
    config = box.base / "reconciler.toml"
    config.write_text(
        f'slots_dir = "{box.slots}"\nstate_dir = "{box.state}"\n'
        f'[[aiter.trees]]\npackage_dir = "{box.package}"\njit_dir = "{box.jit}"\n'
        'target = "gfx950:256"\n'
    )
    swapper = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(attacker.uid), str(attacker.gid), str(box.jit),
         str(box.secret), "1000000"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    rounds = 0
    try:
        for i in range(4):
            log = box.base / f"strace-{i}.log"
            run = subprocess.run(
                ["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(log),
                 sys.executable, "-m", "hal0_reconciler", "aiter", "plan",
                 "--config", str(config)],
                capture_output=True,
                timeout=60,
                check=False,
                env={**os.environ, "PYTHONPATH": str(REPO / "src")},
            )  # fmt: skip
            rounds += 1
            assert run.returncode in (0, 1, 2), run.stderr.decode(errors="replace")[-2000:]
            assert f"== {box.package} [base]".encode() in run.stdout  # the plan ran
            root_calls = _strace_events(log)
            assert any(f'"{box.package}' in c for c in root_calls)  # root's own calls traced
            inside = [c for c in root_calls if f'"{box.jit}/' in c]
            assert [] == inside
            opened = [c for c in root_calls if c.startswith("open") and f'"{box.jit}' in c]
            assert [] == opened  # not even the folder: the owner's child opens it
            assert b"DoNotEverPrintThisHash" not in run.stdout + run.stderr
    finally:
        os.killpg(swapper.pid, signal.SIGKILL)
        swapper.wait(timeout=10)
    attacks.tried("aiter swap race under strace", rounds)
    assert SHADOW_LINE + "\n" == box.secret.read_text()
    attacks.held("aiter swap race under strace", rounds)


def test_a_tree_below_a_folder_the_attacker_owns_is_refused_loudly(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """A root JIT folder inside the attacker's folder: refused, nothing read, plan exits 1."""
    attacks.tried("aiter tree below the attacker's folder")
    mid = box.base / "users"
    (mid / "jit").mkdir(parents=True)
    attacker.chown(mid)
    (mid / "jit" / f"{BPS_CK}.so").symlink_to(box.secret)
    code, text = _plan(box.settings(jit_dir=mid / "jit"))
    assert 1 == code
    assert f"{mid} is a folder owned by uid {attacker.uid}, not root; refused" in text
    assert "module_" not in text  # nothing in the tree was looked at
    attacks.held("aiter tree below the attacker's folder")


def test_a_link_to_a_tree_root_owned_by_the_attacker_is_refused(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """The JIT folder named through a symlink a third user owns: the way is refused."""
    attacks.tried("aiter link on the way to a tree")
    other = box.base / "rootjit"
    other.mkdir()
    link = box.base / "via"
    link.symlink_to(other)
    attacker.chown(link)
    code, text = _plan(box.settings(jit_dir=link))
    assert 1 == code
    assert f"{link} is a symlink owned by uid {attacker.uid}, not root; refused" in text
    attacks.held("aiter link on the way to a tree")


def test_root_reads_tables_the_owner_cannot_only_when_the_way_is_roots(
    box: Box, attacker: Attacker
) -> None:
    """A 0700 root configs folder: root reads its tables and says so; the modules stay the
    owner's child's."""
    (box.package / "configs").chmod(0o700)
    (box.jit / f"{BPS_CK}.so").symlink_to(box.secret)
    _, raw = _plan(box.settings(), "--json")
    (base,) = json.loads(raw)["plans"]
    assert base["handled_as"].endswith(
        "; its tables read by root (the owner cannot read the configs folder)"
    )
    assert [] == [s for s in base["sources"] if s["error"] is not None]
    (mod,) = [m for m in base["modules"] if m["module"] == BPS_CK]
    assert "unreadable" == mod["status"]


def test_a_configs_folder_the_owner_cannot_read_below_the_owners_folder_is_refused(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """The owner's package folder holding a 0700 root configs folder: root does not read it."""
    attacks.tried("aiter unreadable configs below the owner's folder")
    attacker.chown(box.package)
    (box.package / "configs").chmod(0o700)
    code, text = _plan(box.settings())
    assert 1 == code
    assert "cannot be read by" in text
    assert "is not wholly root's" in text
    attacks.held("aiter unreadable configs below the owner's folder")


def test_the_daemon_sends_ready_with_a_fifo_module_in_the_owners_jit(
    box: Box, attacks: Tally, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO module (and a link to one) in the JIT folder: READY still comes, checks go on."""
    import dataclasses

    from hal0_reconciler.daemon import status
    from helpers import devnodes
    from helpers.daemon_host import Host, running, wait_until
    from helpers.notify_socket import NotifySocket

    attacks.tried("aiter FIFO module against the daemon")
    os.mkfifo(box.jit / f"{BPS_CK}.so")
    os.mkfifo(box.base / "fifo")
    (box.jit / "module_deepgemm_opus.so").symlink_to(box.base / "fifo")
    with devnodes.dev_tree() as dev, NotifySocket() as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", str(sock.path))
        host = Host(tmp_path, dev)
        settings = dataclasses.replace(host.settings(), aiter=box.settings().aiter)

        def checks() -> int:
            try:
                snapshot = json.loads(status.status_path(settings).read_text())
            except (OSError, ValueError):
                return 0
            return int((snapshot.get("aiter") or {}).get("checks") or 0)

        with running(settings):
            sock.wait_for("READY=1", timeout=30)
            wait_until(lambda: checks() >= 1, timeout=30, what="the first aiter check")
    attacks.held("aiter FIFO module against the daemon")
