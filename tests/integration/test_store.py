"""Slot files on disk: reads that never follow links, the write lock, atomic replacement."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hal0_reconciler import fsio
from hal0_reconciler.errors import LockTimeout, WriteRefused
from hal0_reconciler.slots import store
from helpers.lock_holder import holding_lock

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another owner needs root")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("agent.toml", True),
        ("0042.toml", True),
        (".agent.x1y2.tmp", False),
        (".agent.toml.hal0-reconciler.ab12.tmp", False),
        ("agent.toml~", False),
        (".#agent.toml", False),
        (".agent.toml.swp", False),
        ("agent.toml.tmp", False),
        ("agent.txt", False),
        ("README", False),
    ],
)
def test_only_toml_files_are_slots(name: str, expected: bool) -> None:
    """`*.toml` files are slots; writer temp files and editor litter are not."""
    assert expected == store.is_slot_file_name(name)


@settings(max_examples=300)
@example(["s1.toml", ".s0.toml", "a.toml~", "a.toml"])
@given(
    st.lists(
        st.builds(
            "".join,
            st.lists(
                st.sampled_from(["", ".", "a", "s1", ".toml", "toml", "~", ".swp", ".swx", ".tmp"]),
                max_size=4,
            ),
        )
    )
)
def test_a_listing_keeps_exactly_the_slot_file_names_sorted(names: list[str]) -> None:
    """The full pass's listing spells ``is_slot_file_name`` out: the same names, sorted."""
    assert sorted(n for n in names if store.is_slot_file_name(n)) == store.slot_names(names)


def test_listing_a_missing_directory_is_empty(tmp_path: Path) -> None:
    """A slots directory that does not exist (yet) has no slots."""
    assert [] == store.list_slot_paths(tmp_path / "absent")


def _make_fifo(p: Path) -> None:
    os.mkfifo(p)


def _make_dir(p: Path) -> None:
    p.mkdir()


def _make_symlink(p: Path) -> None:
    target = p.with_name("target.txt")
    target.write_text('device = "gpu-vulkan"\n')
    p.symlink_to(target)


def _make_chardev(p: Path) -> None:
    os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "make",
    [_make_fifo, _make_dir, _make_symlink, _make_chardev],
    ids=["fifo", "directory", "symlink", "char-device"],
)
def test_non_regular_slot_paths_are_refused_without_blocking(tmp_path: Path, make) -> None:
    """A slot path that is a FIFO, directory, symlink or device is refused, never opened or followed."""
    path = tmp_path / "odd.toml"
    make(path)
    with pytest.raises(WriteRefused, match=r"odd\.toml"):
        store.read_slot(path)


@needs_root
def test_replace_keeps_owner_group_and_mode(tmp_path: Path) -> None:
    """A rewrite keeps the owner, group and mode of the file it replaces."""
    path = tmp_path / "a.toml"
    path.write_bytes(b'device = "gpu-vulkan"\n')
    os.chown(path, 4242, 4343)
    os.chmod(path, 0o600)
    before = store.read_slot(path)
    store.replace_slot(path, b'device = "gpu-rocm"\n', like=before.stat)
    after = path.stat()
    assert (4242, 4343, 0o600) == (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode))
    assert b'device = "gpu-rocm"\n' == path.read_bytes()
    assert [] == [p.name for p in tmp_path.iterdir() if p.name != "a.toml"]


def test_replace_refuses_a_path_that_became_a_symlink(tmp_path: Path) -> None:
    """If a symlink is put where the slot was, the write is refused and the link target untouched."""
    path = tmp_path / "a.toml"
    path.write_bytes(b"x = 1\n")
    before = store.read_slot(path)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious\n")
    path.unlink()
    path.symlink_to(target)
    with pytest.raises(WriteRefused):
        store.replace_slot(path, b"y = 2\n", like=before.stat)
    assert b"precious\n" == target.read_bytes()


def test_failed_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails before the rename leaves the old bytes and removes its temp file."""
    path = tmp_path / "a.toml"
    path.write_bytes(b"old\n")
    before = store.read_slot(path)

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output"):
        store.replace_slot(path, b"new\n", like=before.stat)
    assert b"old\n" == path.read_bytes()
    assert ["a.toml"] == sorted(p.name for p in tmp_path.iterdir())


def test_stale_temps_from_a_crash_are_removed(tmp_path: Path) -> None:
    """Temp files this package left after a crash are removed; others' files are not."""
    ours = fsio.temp_path_for(tmp_path / "a.toml")
    ours.write_bytes(b"half")
    theirs = tmp_path / ".a.toml.1234.tmp"
    theirs.write_bytes(b"hal0's own temp")
    assert [ours] == fsio.remove_stale_temps(tmp_path)
    assert [".a.toml.1234.tmp"] == sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.timeout(20)
def test_lock_waits_for_another_process(tmp_path: Path) -> None:
    """The write lock is hal0's flock: while another process holds it, we wait."""
    lock = tmp_path / "slots.lock"
    releasing = tmp_path / "releasing"
    with holding_lock(lock, seconds=0.6, releasing=releasing) as holder:
        with store.slot_write_lock(lock, timeout=10):
            got_it_after_release = releasing.exists()
        holder.wait(timeout=10)
    assert got_it_after_release  # not while the other process still held it


@pytest.mark.timeout(20)
def test_lock_wait_is_bounded(tmp_path: Path) -> None:
    """When the lock is held too long, LockTimeout names the lock file."""
    lock = tmp_path / "slots.lock"
    with (
        holding_lock(lock),
        pytest.raises(LockTimeout, match=r"slots\.lock"),
        store.slot_write_lock(lock, timeout=0.3),
    ):
        pass


@needs_root
def test_lock_file_is_created_so_hal0_can_still_write_it(tmp_path: Path) -> None:
    """A lock file we create is mode 0664 whatever our umask, in the slots directory's group."""
    slots = tmp_path / "slots"
    slots.mkdir()
    os.chown(slots, 0, 4343)
    lock = tmp_path / "slots.lock"
    old = os.umask(0o077)
    try:
        with store.slot_write_lock(lock, timeout=1, group_of=slots):
            pass
    finally:
        os.umask(old)
    st = lock.stat()
    assert (0o664, 4343) == (stat.S_IMODE(st.st_mode), st.st_gid)


def test_existing_lock_file_is_left_as_it_is(tmp_path: Path) -> None:
    """hal0's own lock file keeps its mode and owner when we take the lock."""
    lock = tmp_path / "slots.lock"
    lock.write_bytes(b"")
    lock.chmod(0o660)
    with store.slot_write_lock(lock, timeout=1, group_of=tmp_path):
        pass
    assert 0o660 == stat.S_IMODE(lock.stat().st_mode)


@pytest.mark.timeout(10)
def test_lock_excludes_threads_of_one_process(tmp_path: Path) -> None:
    """Two holders in one process never overlap (each takes its own open file description)."""
    lock = tmp_path / "slots.lock"
    inside = 0
    overlaps = []

    def worker() -> None:
        nonlocal inside
        for _ in range(20):
            with store.slot_write_lock(lock, timeout=5):
                inside += 1
                overlaps.append(inside)
                time.sleep(0.001)
                inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=8)
    assert {1} == set(overlaps)


def test_replace_refuses_a_slot_that_vanished(tmp_path: Path) -> None:
    """A slot deleted between read and write stays deleted: nothing is written back."""
    path = tmp_path / "a.toml"
    path.write_bytes(b"x = 1\n")
    before = store.read_slot(path)
    path.unlink()
    with pytest.raises(WriteRefused, match="vanished"):
        store.replace_slot(path, b"x = 2\n", like=before.stat)
    assert [] == list(tmp_path.iterdir())


@pytest.mark.parametrize("make", [_make_fifo, _make_chardev], ids=["fifo", "char-device"])
def test_non_regular_slot_paths_are_never_opened(
    tmp_path: Path, make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO or device named like a slot is refused from its lstat, before any open()."""
    path = tmp_path / "odd.toml"
    make(path)
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(
        os, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k)
    )
    with pytest.raises(WriteRefused):
        store.read_slot(path)
    assert [] == opened


def test_replace_keeps_a_group_readable_mode(tmp_path: Path) -> None:
    """The new file gets the old mode exactly (0640 here), not the temp file's 0600."""
    path = tmp_path / "a.toml"
    path.write_bytes(b"x = 1\n")
    path.chmod(0o640)
    store.replace_slot(path, b"x = 2\n", like=store.read_slot(path).stat)
    assert 0o640 == stat.S_IMODE(path.stat().st_mode)


def test_a_replace_syncs_the_folder_unless_the_caller_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.toml"
    path.write_bytes(b"old\n")
    synced: list[Path] = []
    monkeypatch.setattr(fsio, "fsync_directory", synced.append)
    store.replace_slot(path, b"new\n", like=store.read_slot(path).stat)
    assert [tmp_path] == synced
    store.replace_slot(path, b"newer\n", like=store.read_slot(path).stat, sync_dir=False)
    assert ([tmp_path], b"newer\n") == (synced, path.read_bytes())

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output"):  # the file's own fsync, not the folder's
        store.replace_slot(path, b"lost\n", like=store.read_slot(path).stat, sync_dir=False)
    assert b"newer\n" == path.read_bytes()
