"""A heal, restore, roll and prune of a tree root does not own run in the tree owner's child:
every move is the owner's, the digest book (and its key) stays root's."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.quarantine import as_owner as owner_heal
from hal0_reconciler.aiter.quarantine import as_owner_child as owner_heal_child
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.trees import owner_io as treeio
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers import quarantines
from helpers.attacker import Attacker, Tally

MODULES = ["module_own_a", "module_own_b"]


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder every user can reach (pytest's own is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hal0-heal-owner-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _attacker_jit(open_tmp: Path, attacker: Attacker) -> Path:
    jit = open_tmp / "jit"
    for m in MODULES:
        quarantines.install(jit, m, m.encode())
    for path in [jit, *jit.rglob("*")]:
        attacker.chown(path)
    return jit


def _book(open_tmp: Path) -> manifest_digest.DigestBook:
    state = open_tmp / "state"
    state.mkdir(mode=0o700)
    return manifest_digest.DigestBook(state / "aiter")


def test_a_heal_of_an_attackers_folder_is_done_by_the_attackers_uid(
    open_tmp: Path, attacker: Attacker, attacks: Tally
) -> None:
    """Healing an attacker-owned JIT folder: the quarantine folders are created by the
    attacker's uid (the owner's child did the mkdir and renames), the manifest still verifies
    through root's book, and the key stays root's 0600 file."""
    jit = _attacker_jit(open_tmp, attacker)
    book = _book(open_tmp)
    io = quarantines.owner_io(jit)
    attacks.tried("heal run as root in another user's tree")
    try:
        assert isinstance(io, treeio.ChildTree)
        assert attacker.uid == io.child_uid
        plans = {m: quarantines.module_plan(jit, m) for m in MODULES}
        q = owner_heal.quarantine(io, jit, plans, book=book)
        qroot = jit / heal.QUARANTINE_DIR
        made = [qroot, qroot / q.id, qroot / q.id / "build", qroot / q.id / "manifest.json"]
        assert [attacker.uid] * len(made) == [p.lstat().st_uid for p in made]
        assert sorted(f"{m}.so" for m in MODULES) == sorted(
            p.name for p in (qroot / q.id).iterdir() if p.name.endswith(".so")
        )
        key = (open_tmp / "state" / "aiter" / manifest_digest.KEY_FILE).lstat()
        assert (0, 0o600) == (key.st_uid, stat.S_IMODE(key.st_mode))
        restored, displaced = owner_heal.restore(io, jit, q.id, book=book)
        assert (True, None) == (restored.verified, displaced)
        assert [m.encode() for m in MODULES] == [(jit / f"{m}.so").read_bytes() for m in MODULES]
    finally:
        io.close()
    attacks.held("heal run as root in another user's tree")


def test_a_restore_through_the_owners_child_moves_only_what_the_owner_could(
    open_tmp: Path, attacker: Attacker, attacks: Tally
) -> None:
    """The attacker plants a quarantine whose manifest lists ``build/module_victim``: a
    root-owned folder in a root-only ``build/`` of its JIT folder. The restore (as the owner)
    cannot set it aside (the owner's EACCES, where root would have moved it): it fails, and the
    victim is byte for byte where it was."""
    jit = _attacker_jit(open_tmp, attacker)
    book = _book(open_tmp)
    build = jit / "build"
    os.chown(build, 0, 0)
    build.chmod(0o755)
    victim = build / "module_victim"
    victim.mkdir()
    (victim / "secret").write_bytes(b"root's")
    (victim / "secret").chmod(0o600)
    planted = jit / heal.QUARANTINE_DIR / "20200101T000000Z"
    (planted / "build" / "module_victim").mkdir(parents=True)
    doc = b'{"id": "20200101T000000Z", "kind": "heal", "entries": ["build/module_victim"],'
    (planted / heal.MANIFEST).write_bytes(doc + b' "modules": {"module_victim": {}}}')
    for path in [jit / heal.QUARANTINE_DIR, *(jit / heal.QUARANTINE_DIR).rglob("*")]:
        attacker.chown(path)
    before = quarantines.snapshot(victim)
    io = quarantines.owner_io(jit)
    attacks.tried("restore of a planted quarantine over a root-only folder")
    try:
        with pytest.raises(heal.HealFailed, match=r"module_victim failed \(\[Errno 13\]"):
            owner_heal.restore(io, jit, "20200101T000000Z", book=book)
    finally:
        io.close()
    assert before == quarantines.snapshot(victim)
    assert (0, b"root's") == ((victim / "secret").lstat().st_uid, (victim / "secret").read_bytes())
    attacks.held("restore of a planted quarantine over a root-only folder")


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_dead_or_hung_owners_child_fails_the_heal_and_moves_nothing(
    open_tmp: Path, attacker: Attacker, attacks: Tally, how: str
) -> None:
    """The owner's child killed, or stopped (it never answers: the exchange's timeout), before
    the heal: HealFailed naming the folder, and every module is still in its place."""
    jit = _attacker_jit(open_tmp, attacker)
    book = _book(open_tmp)
    before = quarantines.snapshot(jit)
    io = quarantines.owner_io(jit, timeout=1.0)
    attacks.tried("dead or hung owner's child")
    try:
        assert isinstance(io, treeio.ChildTree)
        assert io._server is not None
        pid = io._server.pid
        os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        plans = {m: quarantines.module_plan(jit, m) for m in MODULES}
        with pytest.raises(heal.HealFailed, match=str(jit)):
            owner_heal.quarantine(io, jit, plans, book=book)
    finally:
        io.close()
    assert before == quarantines.snapshot(jit)
    attacks.held("dead or hung owner's child")


def test_the_daemons_restore_of_an_attackers_tree_runs_as_the_attacker(
    attacker: Attacker, attacks: Tally
) -> None:
    """``AiterMonitor.restore`` (what ``aiter restore`` and the daemon call) on a tree whose JIT
    folder the attacker owns: the quarantine of the rebuilt module it sets aside is created by
    the attacker's uid, and the restored module is back in its place."""
    with quarantines.reachable_dir() as root:
        package = root / "aiter"
        (package / "configs").mkdir(parents=True)
        jit = package / "jit"
        quarantines.install(jit, "module_x", b"old")
        for path in [jit, *jit.rglob("*")]:
            attacker.chown(path)
        tree = AiterTree(package_dir=package, jit_dir=jit, target="gfx950:256")
        settings = Settings(
            slots_dir=root / "slots", state_dir=root / "state", aiter=AiterSettings(trees=(tree,))
        )
        (root / "slots").mkdir()
        daemon = monitor.AiterMonitor(settings, log_findings=False)
        attacks.tried("restore run as root in another user's tree")
        try:
            io = daemon._io(jit)
            assert attacker.uid == getattr(io, "child_uid", 0)
            plans = {"module_x": quarantines.module_plan(jit, "module_x")}
            qid = owner_heal.quarantine(io, jit, plans, book=daemon.book).id
            quarantines.install(jit, "module_x", b"rebuilt")
            for path in [jit / "module_x.so", *(jit / "build").rglob("*")]:
                attacker.chown(path)
            restored, displaced = daemon.restore(qid)
        finally:
            daemon.surveyor.trees.close()
        assert displaced is not None
        assert (True, b"old") == (restored.verified, (jit / "module_x.so").read_bytes())
        assert attacker.uid == displaced.path.lstat().st_uid
        assert b"rebuilt" == (displaced.path / "module_x.so").read_bytes()
    attacks.held("restore run as root in another user's tree")


def test_roots_book_answers_the_child_only_for_the_folder_it_was_asked_about(
    open_tmp: Path, attacks: Tally
) -> None:
    """A child asking root to sign bytes for another JIT folder (a forged manifest elsewhere)
    gets "unavailable", and nothing is recorded; for its own folder the digest verifies."""
    book = _book(open_tmp)
    attacks.tried("child asks root to sign for another folder")
    data = b'{"id": "q"}'

    def ask(jit: str, what: str) -> dict[str, object]:
        fd = os.memfd_create("question", os.MFD_CLOEXEC)
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        question = {"book": what, "jit": jit, "qid": "q", "kind": "manifest", "folder": [1, 2]}
        return owner_heal_child.answer_book(book, "/srv/jit", question, [fd])

    assert "unavailable" in ask("/etc", "record")
    assert False is book.verify("/etc", "q", "manifest", data, (1, 2))
    assert {} == ask("/srv/jit", "record")
    assert {"verified": True} == ask("/srv/jit", "verify")
    attacks.held("child asks root to sign for another folder")
