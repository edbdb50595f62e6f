"""File-system attacks: while the daemon runs, a slot is swapped for a symlink, a hardlink or a
FIFO between its read and its write, in a loop; a symlinked slots folder and lock file. Counted:
writes outside the slots folder (0), hangs (0); the daemon lives and still relabels."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from helpers import devnodes
from helpers.daemon_host import Host, drop_slot, slot_text
from helpers.notify_socket import NotifySocket
from reliability import support


def _outside(root: Path) -> Path:
    """Files outside the slots folder that a followed link would change: vulkan slots."""
    outside = root / "outside"
    outside.mkdir()
    for name in ("victim.toml", "linked.toml"):
        (outside / name).write_text(slot_text(name[:-5]))
    return outside


def _swap_in(slots: Path, outside: Path, kind: str, n: int) -> None:
    """Atomically put a symlink, a hardlink or a FIFO where ``race.toml`` was."""
    staged = slots / f".staged-{n}"
    if kind == "symlink":
        staged.symlink_to(outside / "victim.toml")
    elif kind == "hardlink":
        os.link(outside / "linked.toml", staged)
    else:
        os.mkfifo(staged)
    staged.rename(slots / "race.toml")


def test_swaps_between_read_and_write_while_the_daemon_runs(host: Host) -> None:
    rounds = support.scaled(150, 2000)
    rng = random.Random(7)
    outside = _outside(host.root)
    (host.slots / "link.toml").symlink_to(outside / "victim.toml")  # standing attacks too
    os.link(outside / "linked.toml", host.slots / "hard.toml")
    os.mkfifo(host.slots / "pipe.toml")
    devnodes.char_node(host.slots / "node.toml", mode=0o666)
    support.quiet_systemctl(host.root / "quiet-bin")
    # hal0's lock file (created empty when missing) and the daemon's own folders are theirs
    ours = (
        host.slots,
        host.root / "run",
        host.root / "var",
        host.root / "etc/hal0/slots.lock",
        support.daemon_log(host),  # the test's own record of the daemon's log
    )
    before = support.tree_digest(host.root, skip=ours)
    with NotifySocket() as sock:
        child = support.start_daemon(host, sock.path, settle_window="0.02")
        try:
            sock.wait_for("READY=1", timeout=30)
            for n in range(rounds):
                drop_slot(host.slots, "race")  # a vulkan slot: the daemon reads it, then writes
                time.sleep(rng.uniform(0, 0.08))
                _swap_in(host.slots, outside, rng.choice(("symlink", "hardlink", "fifo")), n)
                time.sleep(rng.uniform(0, 0.02))
                assert child.poll() is None, "the daemon died"
            slot = drop_slot(host.slots, "afterwards")
            support.wait_for(lambda: b"gpu-rocm" in slot.read_bytes(), timeout=30, what="relabel")
            child.send_signal(signal.SIGTERM)
            assert 0 == child.wait(10)
        finally:
            support.kill_tree(child)
        support.FIGURES["crashes"] += support.tracebacks(support.daemon_log(host).read_text())
    support.FIGURES["cases"] += rounds
    after = support.tree_digest(host.root, skip=ours)
    assert [] == support.outside_writes(before, after)


def test_symlinked_slots_folder_and_lock_file(host: Host, tmp_path: Path) -> None:
    """A slots folder that is a symlink is followed once, to its folder, and written only
    there; a lock file that is a symlink is refused (hal0's lock is never followed)."""
    outside = _outside(host.root)
    real = host.root / "real-slots"
    real.mkdir()
    support.write_vulkan_slots(real, 3)
    linked_dir = host.root / "linked-slots"
    linked_dir.symlink_to(real)
    lock_target = outside / "lock-target"
    lock_target.write_text("not a lock\n")
    (host.root / "linked.lock").symlink_to(lock_target)
    skip = (real, host.root / "run", host.root / "var")
    support.quiet_systemctl(host.root / "quiet-bin")
    before = support.tree_digest(host.root, skip=skip)
    refused = support.run_cli(
        host, "once", slots_dir=linked_dir, lock_file=host.root / "linked.lock"
    )
    assert 1 == refused.returncode
    assert "Too many levels of symbolic links" in refused.stderr
    assert [] == [p.name for p in real.iterdir() if b"gpu-rocm" in p.read_bytes()]
    done = support.run_cli(host, "once", slots_dir=linked_dir)
    assert 0 == done.returncode, done.stderr
    assert 3 == sum(b"gpu-rocm" in p.read_bytes() for p in real.iterdir())
    after = support.tree_digest(host.root, skip=(*skip, host.root / "linked-slots.lock"))
    assert [] == support.outside_writes(before, after)
