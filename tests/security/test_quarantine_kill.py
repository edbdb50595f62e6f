"""A SIGKILL at every rename of a heal and of a restore, in a real process: the next run rolls
the operation forward or back, every module file ends in exactly one place (in its own place
in the JIT folder or in a quarantine), and whatever sits in a quarantine restores."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hal0_reconciler
from hal0_reconciler.aiter.quarantine import as_owner as owner_heal
from hal0_reconciler.aiter.quarantine import heal
from helpers import quarantines
from helpers.attacker import Attacker, Tally

TESTS = Path(__file__).resolve().parents[1]
SRC = Path(hal0_reconciler.__file__).resolve().parents[1]  # the code under test, for the child
MODULES = ("module_kill_a", "module_kill_b")
MAX_RENAMES = 12


def _kwargs(state: Path) -> dict[str, object]:
    return {"book": quarantines.book_for(state)} if hasattr(heal, "recover") else {}


def _next_run(jit: Path, state: Path, owner: bool = False) -> None:
    """What the next heal, restore or daemon start does first."""
    if owner:
        io = quarantines.owner_io(jit)
        try:
            owner_heal.recover(io, jit, book=quarantines.book_for(state))
        finally:
            io.close()
    elif hasattr(heal, "recover"):
        heal.recover(jit, book=quarantines.book_for(state))


def _killed_in_owners_child_at(jit: Path, state: Path, verb: str, kill_at: int, arg: str) -> bool:
    """Run the verb through the tree owner's child, which strace SIGKILLs at its rename
    ``kill_at`` (module moves are its only renameat2 calls); False when it finished first."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed: no fault injection into the owner's child")
    inject = f"inject=renameat2:signal=KILL:when={kill_at + 1}"
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=renameat2", "-e", inject]
    helper = [sys.executable, "-m", "helpers.quarantine_child", str(jit), str(state), verb]
    proc = subprocess.run(
        [*argv, *helper, str(kill_at), arg, "owner"],
        capture_output=True,
        cwd=TESTS,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])},
        timeout=120,
        check=False,
    )
    out = proc.stdout.decode()
    if (out, proc.returncode) == ("done\n", 0):
        return False
    assert (True, 3) == (out.startswith("failed\n"), proc.returncode), proc.stderr.decode()
    return True


def _run_killed(jit: Path, state: Path, verb: str, kill_at: int, arg: str, *, owner: bool) -> bool:
    killer = _killed_in_owners_child_at if owner else _killed_at
    return killer(jit, state, verb, kill_at, arg)


def _killed_at(jit: Path, state: Path, verb: str, kill_at: int, arg: str) -> bool:
    """Run the verb in a child, SIGKILL it at rename ``kill_at``; False when it finished first."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "helpers.quarantine_child",
            str(jit),
            str(state),
            verb,
            str(kill_at),
            arg,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=TESTS,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])},
    )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode() if ready else ""
        if line == f"{kill_at}\n":
            proc.send_signal(signal.SIGKILL)
            assert -signal.SIGKILL == proc.wait(timeout=30)
            return True
        _, err = proc.communicate(timeout=30)
        assert ("done\n", 0) == (line, proc.returncode), err.decode()
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _where(jit: Path) -> dict[bytes, list[str]]:
    """payload → the places (relative to the JIT folder) holding a file with those bytes."""
    found: dict[bytes, list[str]] = {}
    for rel, data in quarantines.snapshot(jit).items():
        if data is not None and not Path(jit / rel).is_symlink() and not rel.endswith(".json"):
            found.setdefault(data, []).append(rel)
    return found


def _own_place(rel: str) -> str:
    parts = Path(rel).parts
    return str(Path(*parts[2:])) if parts[0] == heal.QUARANTINE_DIR else rel


def _exactly_once(jit: Path, payloads: dict[bytes, str]) -> None:
    where = _where(jit)
    for data, rel in payloads.items():
        places = where.get(data, [])
        assert 1 == len(places), f"{rel}: in {places or 'no place'}"
        assert rel == _own_place(places[0])


def _restore(jit: Path, state: Path, qid: str, owner: bool) -> None:
    if not owner:
        heal.restore(jit, qid, **_kwargs(state))  # type: ignore[arg-type]
        return
    io = quarantines.owner_io(jit)
    try:
        owner_heal.restore(io, jit, qid, book=quarantines.book_for(state))
    finally:
        io.close()


def _restore_everything(
    jit: Path, state: Path, payloads: dict[bytes, str], owner: bool = False
) -> None:
    """Each quarantine holding one of the payloads restores, putting it back in its place."""
    for qdir in heal.list_quarantines(jit):
        held = [
            d
            for d, places in _where(jit).items()
            if d in payloads
            and any(p.startswith(f"{heal.QUARANTINE_DIR}/{qdir.name}/") for p in places)
        ]
        if held:
            _restore(jit, state, qdir.name, owner)
            where = _where(jit)
            assert [[payloads[d]] for d in held] == [where[d] for d in held]


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder the owner's child can reach: pytest's own folders are root's 0700, and another
    pytest session resets them to 0700 whatever a test opened them to."""
    with quarantines.reachable_dir() as path:
        yield path


def _tree(case: Path, attacker: Attacker, tag: bytes) -> tuple[Path, Path, dict[bytes, str]]:
    jit, state = case / "jit", case / "state"
    payloads: dict[bytes, str] = {}
    for m in MODULES:
        quarantines.install(jit, m, m.encode() + tag)
        payloads[m.encode() + tag] = f"{m}.so"
        payloads[m.encode() + tag + b"-src"] = f"build/{m}/blob/gen.cpp"
    for path in [jit, *jit.rglob("*")]:
        attacker.chown(path)
    return jit, state, payloads


@pytest.mark.parametrize("owner", [False, True], ids=["as-root", "in-the-owners-child"])
def test_a_kill_at_every_rename_of_a_heal_is_finished_or_undone(
    place: Path, attacker: Attacker, attacks: Tally, owner: bool
) -> None:
    """Killed at rename k of a heal of two modules (k = 0, 1, …), run as root or in the tree
    owner's child: after the next run each module file is in exactly one place, and a
    quarantine holding them restores."""
    points = 0
    for kill_at in range(MAX_RENAMES):
        case = place / f"heal-{kill_at}"
        case.mkdir()
        jit, state, payloads = _tree(case, attacker, b"-old")
        attacks.tried("kill at a heal's rename")
        if not _run_killed(jit, state, "heal", kill_at, ",".join(MODULES), owner=owner):
            attacks.held("kill at a heal's rename")  # ran to the end: nothing to roll
            break
        points += 1
        _next_run(jit, state, owner)
        _exactly_once(jit, payloads)
        _restore_everything(jit, state, payloads, owner)
        _exactly_once(jit, payloads)
        attacks.held("kill at a heal's rename")
    assert 2 * len(MODULES) == points


@pytest.mark.parametrize("owner", [False, True], ids=["as-root", "in-the-owners-child"])
@pytest.mark.parametrize("rebuilt", [True, False], ids=["over-a-rebuild", "into-an-empty-place"])
def test_a_kill_at_every_rename_of_a_restore_is_finished_or_undone(
    place: Path, attacker: Attacker, attacks: Tally, rebuilt: bool, owner: bool
) -> None:
    """Killed at rename k of a restore (over rebuilt modules, which are set aside first, or into
    an empty place): after the next run the old and the rebuilt files are each in exactly one
    place, and every quarantine holding them restores."""
    points = 0
    for kill_at in range(MAX_RENAMES):
        case = place / f"restore-{kill_at}"
        case.mkdir()
        jit, state, payloads = _tree(case, attacker, b"-old")
        plans = {m: quarantines.module_plan(jit, m) for m in MODULES}
        if owner:
            io = quarantines.owner_io(jit)
            try:
                qid = owner_heal.quarantine(io, jit, plans, book=quarantines.book_for(state)).id
            finally:
                io.close()
        else:
            qid = heal.quarantine(jit, plans, **_kwargs(state)).id  # type: ignore[arg-type]
        if rebuilt:
            for m in MODULES:
                quarantines.install(jit, m, m.encode() + b"-new")
                payloads[m.encode() + b"-new"] = f"{m}.so"
                payloads[m.encode() + b"-new-src"] = f"build/{m}/blob/gen.cpp"
            if owner:  # the owner's aiter rebuilt them: its files, which its child can move
                attacker.chown(*(p for p in jit.rglob("*") if heal.QUARANTINE_DIR not in p.parts))
        attacks.tried("kill at a restore's rename")
        if not _run_killed(jit, state, "restore", kill_at, qid, owner=owner):
            attacks.held("kill at a restore's rename")
            break
        points += 1
        _next_run(jit, state, owner)
        _exactly_once(jit, payloads)
        _restore_everything(jit, state, payloads, owner)
        _exactly_once(jit, payloads)
        attacks.held("kill at a restore's rename")
    assert (4 if rebuilt else 2) * len(MODULES) == points
