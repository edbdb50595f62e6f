"""hal0's rendered Quadlet units (``hal0-slot@<token>.container``) are read only as regular
files within their cap, never through a link: what another writer of that folder plants
(a link to a root-only file, a FIFO, a giant) is refused by path and reason, and the look goes
on. In 0.2.0 these held already; kept as attacks."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hal0_reconciler.host.restarts import label_check, running_lane
from helpers.attacker import Attacker, Tally

pytestmark = pytest.mark.timeout(30)

UNIT = "[Container]\nImage=ghcr.io/hal0ai/hal0-vulkan:test\nAddDevice=/dev/kfd\n"


@pytest.fixture
def quadlets(tmp_path: Path, attacker: Attacker) -> Path:
    """hal0's Quadlet folder, here one the attacker may write (as hal0's user may)."""
    folder = tmp_path / "systemd"
    folder.mkdir()
    attacker.chown(folder)
    return folder


def test_a_unit_linked_to_a_root_only_file_is_not_followed(
    quadlets: Path, attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    attacks.tried("quadlet unit symlink")
    secret = tmp_path / "secret"
    secret.write_text("[Container]\nImage=root-only-secret\n")
    secret.chmod(0o600)
    link = quadlets / label_check.unit_file_name("agent")
    link.symlink_to(secret)
    os.chown(link, attacker.uid, attacker.gid, follow_symlinks=False)
    found = label_check.read_unit(quadlets, "agent")
    assert isinstance(found, str)
    assert "symlink" in found
    assert "root-only-secret" not in found
    attacks.held("quadlet unit symlink")


def test_a_fifo_unit_never_blocks_the_look(
    quadlets: Path, attacker: Attacker, attacks: Tally
) -> None:
    attacks.tried("quadlet unit fifo")
    fifo = quadlets / label_check.unit_file_name("agent")
    os.mkfifo(fifo)
    attacker.chown(fifo)
    result: list[object] = []
    reader = threading.Thread(
        target=lambda: result.append(label_check.read_unit(quadlets, "agent"))
    )
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "the look blocked on a FIFO"
    assert isinstance(result[0], str)
    assert "FIFO" in result[0]
    attacks.held("quadlet unit fifo")


def test_a_unit_over_its_cap_is_refused_and_one_at_its_cap_is_read(
    quadlets: Path, attacker: Attacker, attacks: Tally
) -> None:
    """A sparse giant (no bytes on disk) over the 1 MiB cap is refused by its size; the same
    unit exactly at the cap is read and judged."""
    attacks.tried("quadlet unit huge")
    path = quadlets / label_check.unit_file_name("agent")

    def sized(size: int) -> None:
        with path.open("wb") as fh:
            fh.write(UNIT.encode())
            fh.truncate(size)
        attacker.chown(path)

    cap = 1 << 20  # docs/security.md: a rendered unit is read up to 1 MiB
    sized(cap + 1)
    refused = label_check.read_unit(quadlets, "agent")
    assert isinstance(refused, str)
    assert "larger than" in refused
    sized(cap)
    read = label_check.read_unit(quadlets, "agent")
    assert isinstance(read, running_lane.RenderedUnit), read
    assert "ghcr.io/hal0ai/hal0-vulkan:test" == read.image
    attacks.held("quadlet unit huge")


def test_a_missing_unit_is_a_slot_not_rendered(quadlets: Path) -> None:
    assert label_check.read_unit(quadlets, "agent") is None
