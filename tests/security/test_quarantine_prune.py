"""The daemon's heal and prune against the user who owns the JIT folder: ``.hal0-quarantine``
swapped for a link to a victim folder. Root makes nothing in it, moves nothing into it and
deletes none of its subfolders; the heal is refused loudly and the module stays where it was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.quarantine import heal
from helpers import quarantines
from helpers.attacker import Attacker, Tally

support = quarantines.aiter_support()
rules = support.rules
so_builder = support.so_builder
built_modules = support.built_modules
no_processes = support.no_processes

pytestmark = pytest.mark.usefixtures("no_processes")


@pytest.fixture
def reachable() -> Iterator[Path]:
    with quarantines.reachable_dir() as root:
        yield root


def test_prune_through_a_linked_quarantine_folder_deletes_nothing(
    reachable: Path, attacker: Attacker, attacks: Tally, built_modules: dict[str, Path]
) -> None:
    """A stale module to heal and ``.hal0-quarantine`` a link to a folder with six subfolders:
    the heal is refused (said, not silent), the module is not moved, and every subfolder of the
    victim survives with its file."""
    attacks.tried("prune through a linked quarantine folder")
    tree = support.Tree(reachable / "tree", support.DATA_CONFIGS)
    tree.install(support.BPS_CK, built_modules[support.BPS_CK])
    stale = tree.install(support.BPS_CKTILE, built_modules["stale_cktile"])
    for path in [tree.jit, *tree.jit.rglob("*")]:
        attacker.chown(path)
    victim = reachable / "victim"
    for i in range(6):
        (victim / f"2020010{i}T000000Z").mkdir(parents=True)
        (victim / f"2020010{i}T000000Z" / "keep").write_bytes(b"victim")
    before = quarantines.snapshot(victim)
    link = tree.jit / heal.QUARANTINE_DIR
    quarantines.as_user(attacker.uid, attacker.gid, f"os.symlink({str(victim)!r}, {str(link)!r})\n")
    report = monitor.AiterMonitor(tree.settings(keep_quarantines=3)).check(heal=True)
    errors = [h.error for h in report.heals if h.error]
    assert (before, True) == (quarantines.snapshot(victim), stale.is_file())
    assert 1 == len(errors)
    assert "not a real folder" in errors[0]
    attacks.held("prune through a linked quarantine folder")
