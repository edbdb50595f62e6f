"""A folder others can write is nobody's tree, sticky or not.

A root-owned JIT or configs folder with mode 1777 (as shared caches under ``/tmp`` often are)
would let every user plant modules or a ``.hal0-quarantine`` where root acts. An unprivileged
user plants both; the tree must be refused loudly, with how to fix it, and nothing in it read,
moved or healed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hal0_reconciler.aiter import cli, monitor
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers.attacker import Attacker, Tally

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "aiter"))
import tablegen  # tests/aiter is not on the path from this folder

MODULE = "module_gemm_a8w8_blockscale_bpreshuffle"
FIX = (
    "refused: a folder others can write is nobody's tree (chmod go-w it, or give each user a "
    "tree of their own with its own jit_dir)"
)


@dataclass
class Box:
    base: Path
    package: Path
    jit: Path
    slots: Path
    state: Path

    def settings(self) -> Settings:
        tree = AiterTree(package_dir=self.package, jit_dir=self.jit, target="gfx950:256")
        return Settings(
            slots_dir=self.slots, state_dir=self.state, aiter=AiterSettings(trees=(tree,))
        )


@pytest.fixture
def box() -> Iterator[Box]:
    base = Path(tempfile.mkdtemp(prefix="hal0-sec-shared-", dir="/tmp"))
    base.chmod(0o755)
    package = base / "site-packages" / "aiter"
    shutil.copytree(tablegen.WRITTEN_CONFIGS, package / "configs")
    jit = base / "jit"
    jit.mkdir()
    slots = base / "slots"
    slots.mkdir()
    try:
        yield Box(base, package, jit, slots, base / "state")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as(attacker: Attacker, action: object) -> None:
    """Run ``action`` in a forked process with the attacker's credentials."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(attacker.gid)
            os.setuid(attacker.uid)
            action()  # type: ignore[operator]
        except BaseException:  # the child's failure is its exit status
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert 0 == os.waitstatus_to_exitcode(status)


def _plan(settings: Settings) -> tuple[int, dict[str, object]]:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="verb"))
    out = io.StringIO()
    code = cli.main(parser.parse_args(["aiter", "plan", "--json"]), settings, out=out)
    return code, json.loads(out.getvalue())


@pytest.mark.parametrize("mode", [0o1777, 0o777])
def test_a_root_jit_folder_every_user_can_write_is_refused(
    box: Box, attacker: Attacker, attacks: Tally, mode: int
) -> None:
    """Root's JIT folder at ``mode``: the attacker plants a module and a quarantine folder;
    the tree is refused (plan exits 1, the reason says how to fix it), nothing is moved."""
    kind = f"aiter root JIT folder {mode:o}"
    attacks.tried(kind)
    box.jit.chmod(mode)

    def plant() -> None:
        (box.jit / f"{MODULE}.so").write_bytes(b"\x7fELF planted\0")
        (box.jit / ".hal0-quarantine").mkdir()

    _as(attacker, plant)
    code, raw = _plan(box.settings())
    plans = raw["plans"]
    assert isinstance(plans, list)
    assert 1 == code
    assert {False} == {p["checked"] for p in plans}
    want = (
        f"tree refused: JIT folder {box.jit} is root's but writable by every user (mode "
        f"{mode:o}, sticky or not); {FIX}"
    )
    assert {want} == {p["problems"][0] for p in plans}
    report = monitor.AiterMonitor(box.settings()).check(heal=True)
    assert () == report.heals
    assert sorted([f"{MODULE}.so", ".hal0-quarantine"]) == sorted(os.listdir(box.jit))
    assert [] == os.listdir(box.jit / ".hal0-quarantine")
    attacks.held(kind)


def test_a_root_configs_folder_every_user_can_write_is_refused(
    box: Box, attacker: Attacker, attacks: Tally
) -> None:
    """Root's configs folder at 1777: the attacker plants a table; the tree is refused and the
    planted table never read."""
    attacks.tried("aiter root configs folder 1777")
    configs = box.package / "configs"
    configs.chmod(0o1777)
    planted = configs / "planted.csv"

    def plant() -> None:
        planted.write_text("gfx,cu_num,M,N,K,kernelName\n")

    _as(attacker, plant)
    code, raw = _plan(box.settings())
    plans = raw["plans"]
    assert isinstance(plans, list)
    assert 1 == code
    want = (
        f"tree refused: configs folder {configs} is root's but writable by every user (mode "
        f"1777, sticky or not); {FIX}"
    )
    assert {want} == {p["problems"][0] for p in plans}
    assert planted.stat().st_uid == attacker.uid
    attacks.held("aiter root configs folder 1777")


def test_a_tree_under_tmp_stays_possible_when_its_own_folders_are_safe(box: Box) -> None:
    """The ancestors keep the systemd-tmpfiles rule: ``/tmp`` (root's, 1777) on the way is
    fine when the JIT and configs folders themselves are root's 0755."""
    assert Path("/tmp") in box.base.parents
    code, raw = _plan(box.settings())
    plans = raw["plans"]
    assert isinstance(plans, list)
    assert {True} == {p["checked"] for p in plans}
    assert code in (0, 2)
