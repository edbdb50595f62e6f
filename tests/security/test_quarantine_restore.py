"""``aiter restore`` against the user who owns the JIT folder: a planted quarantine, a re-planted
``.hal0-quarantine`` under a real id, a JIT ``build`` folder swapped for a link. Root never moves
or replaces a file outside the JIT folder: the victim keeps its bytes and its inode."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers import quarantines
from helpers.attacker import Attacker, Tally

QID = "20990101T000000Z"
PASSWD = b"root:x:0:0:root:/root:/bin/bash\nhal0:x:990:990::/var/lib/hal0:/bin/false\n"


class Scene:
    """A JIT folder the attacker owns, root's state, and a victim folder with a passwd copy."""

    def __init__(self, root: Path, attacker: Attacker) -> None:
        root.chmod(0o755)
        self.attacker = attacker
        self.package = root / "aiter"
        (self.package / "configs").mkdir(parents=True)
        self.jit = self.package / "jit"
        self.state = root / "state"
        self.slots = root / "slots"
        self.slots.mkdir()
        quarantines.install(self.jit, "module_x", b"module-x")
        for path in [self.jit, *self.jit.rglob("*")]:
            attacker.chown(path)
        self.victim = root / "victim"
        (self.victim / "module_x").mkdir(parents=True)
        (self.victim / "passwd").write_bytes(PASSWD)
        (self.victim / "module_x" / "data").write_bytes(b"victim data")
        self.before = quarantines.snapshot(self.victim)
        self.inode = (self.victim / "passwd").stat().st_ino

    def monitor(self) -> monitor.AiterMonitor:
        tree = AiterTree(package_dir=self.package, jit_dir=self.jit, target="gfx950:256")
        settings = Settings(
            slots_dir=self.slots, state_dir=self.state, aiter=AiterSettings(trees=(tree,))
        )
        return monitor.AiterMonitor(settings, log_findings=False)

    def as_attacker(self, code: str) -> None:
        quarantines.as_user(self.attacker.uid, self.attacker.gid, code)

    def victim_untouched(self) -> bool:
        same = quarantines.snapshot(self.victim) == self.before
        return same and (self.victim / "passwd").stat().st_ino == self.inode

    def planted_manifest(self, qdir: Path) -> str:
        rel = "build/passwd"
        return json.dumps(
            {
                "id": qdir.name,
                "kind": "heal",
                "jit_dir": str(self.jit),
                "entries": [rel],
                "moves": [{"src": str(self.jit / rel), "dst": str(qdir / rel)}],
                "modules": {"module_x": {}},
            }
        )


@pytest.fixture
def scene(attacker: Attacker) -> Iterator[Scene]:
    with quarantines.reachable_dir() as root:
        yield Scene(root, attacker)


def _restore_refused(scene: Scene, qid: str) -> bool:
    try:
        scene.monitor().restore(qid)
    except heal.HealFailed:
        return True
    return False


def test_restore_through_a_planted_quarantine_moves_no_victim(scene: Scene, attacks: Tally) -> None:
    """The owner plants ``.hal0-quarantine/<id>`` with a manifest naming ``build/passwd`` and
    links ``build`` to a folder holding a passwd copy: the restore is refused, the victim keeps
    its bytes and inode, and nothing of the attacker's lands beside it."""
    attacks.tried("restore through a planted quarantine")
    qdir = scene.jit / heal.QUARANTINE_DIR / QID
    scene.as_attacker(
        f"os.makedirs({str(qdir / 'build')!r})\n"
        f"open({str(qdir / 'build' / 'passwd')!r}, 'w').write('evil::0:0::/:/bin/sh\\n')\n"
        f"open({str(qdir / heal.MANIFEST)!r}, 'w').write({scene.planted_manifest(qdir)!r})\n"
        f"shutil.rmtree({str(scene.jit / 'build')!r})\n"
        f"os.symlink({str(scene.victim)!r}, {str(scene.jit / 'build')!r})\n"
    )
    refused = _restore_refused(scene, QID)
    assert (True, True) == (refused, scene.victim_untouched())
    attacks.held("restore through a planted quarantine")


def test_a_replanted_quarantine_folder_under_a_real_id_is_refused(
    scene: Scene, attacks: Tally
) -> None:
    """Root's own heal made quarantine <id>; the owner renames ``.hal0-quarantine`` away and
    plants one of its own under the same id, aimed at the victim through a linked ``build``: the
    restore is refused loudly and the victim is untouched."""
    attacks.tried("re-planted .hal0-quarantine under a real id")
    plans = {"module_x": quarantines.module_plan(scene.jit, "module_x")}
    qid = heal.quarantine(scene.jit, plans, **quarantines.heal_kwargs(scene.state)).id
    qroot = scene.jit / heal.QUARANTINE_DIR
    qdir = qroot / qid
    scene.as_attacker(
        f"os.rename({str(qroot)!r}, {str(scene.jit / '.hidden-away')!r})\n"
        f"os.makedirs({str(qdir / 'build')!r})\n"
        f"open({str(qdir / 'build' / 'passwd')!r}, 'w').write('evil::0:0::/:/bin/sh\\n')\n"
        f"open({str(qdir / heal.MANIFEST)!r}, 'w').write({scene.planted_manifest(qdir)!r})\n"
        f"os.rename({str(scene.jit / 'build')!r}, {str(scene.jit / '.old-build')!r})\n"
        f"os.symlink({str(scene.victim)!r}, {str(scene.jit / 'build')!r})\n"
    )
    refused = _restore_refused(scene, qid)
    assert (True, True) == (refused, scene.victim_untouched())
    attacks.held("re-planted .hal0-quarantine under a real id")


def test_restore_into_a_build_folder_linked_to_a_victim_is_refused(
    scene: Scene, attacks: Tally
) -> None:
    """A real quarantine of ``module_x``; the owner swaps the JIT ``build`` folder for a link to
    a folder that has a ``module_x`` of its own: nothing is set aside from it or moved into it."""
    attacks.tried("restore into a linked build folder")
    plans = {"module_x": quarantines.module_plan(scene.jit, "module_x")}
    qid = heal.quarantine(scene.jit, plans, **quarantines.heal_kwargs(scene.state)).id
    scene.as_attacker(
        f"os.rename({str(scene.jit / 'build')!r}, {str(scene.jit / '.old-build')!r})\n"
        f"os.symlink({str(scene.victim)!r}, {str(scene.jit / 'build')!r})\n"
    )
    refused = _restore_refused(scene, qid)
    held = (scene.jit / heal.QUARANTINE_DIR / qid / "module_x.so").read_bytes()
    assert (True, True, b"module-x") == (refused, scene.victim_untouched(), held)
    attacks.held("restore into a linked build folder")
