"""Relabels are written in groups under one hold of hal0's lock: each file is read again and
judged again under it, the group's temp files are fsynced together and renamed; one file's
failure is its own, an interruption leaves no temp file, and the edit is made before the lock
is held when the bytes did not change."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from hal0_reconciler import fsio
from hal0_reconciler.reconcile import OutcomeStatus, Reconciler, writegroup
from hal0_reconciler.slots import edit, store
from helpers.daemon_host import slot_text
from helpers.hosts import ROCM_USABLE


def _slots(folder: Path, count: int) -> list[Path]:
    paths = []
    for n in range(count):
        path = folder / f"s{n}.toml"
        path.write_text(slot_text(f"s{n}", "gpu-vulkan", port=8000 + n))
        paths.append(path)
    return paths


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if fsio.is_own_temp(p.name))


def test_a_pass_writes_its_relabels_in_groups_each_under_one_lock_hold(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _slots(host_dirs["slots_dir"], 5)
    monkeypatch.setattr(writegroup, "WRITE_GROUP", 2)  # where the pass reads it
    events: list[str] = []
    real_lock, real_commit = store.slot_write_lock, fsio.commit_writes

    @contextlib.contextmanager
    def lock(*args: Any, **kwargs: Any) -> Iterator[None]:
        with real_lock(*args, **kwargs):
            events.append("lock")
            yield
            events.append("unlock")

    def commit(pending: list[fsio.PendingWrite]) -> list[OSError | None]:
        events.append("commit " + " ".join(p.path.stem for p in pending))
        return real_commit(pending)

    monkeypatch.setattr(store, "slot_write_lock", lock)
    monkeypatch.setattr(fsio, "commit_writes", commit)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert [OutcomeStatus.RELABELED] * 5 == [o.status for o in report.outcomes]
    assert paths == [o.path for o in report.outcomes]  # in the listing's order
    assert [
        *("lock", "commit s0 s1", "unlock"),
        *("lock", "commit s2 s3", "unlock"),
        *("lock", "commit s4", "unlock"),
    ] == events
    assert all(b'device = "gpu-rocm"' in p.read_bytes() for p in paths)


def test_one_files_failed_write_is_its_own_and_clears_leftover_temps(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second file's fsync fails: it is write-failed and keeps its bytes, the others are
    relabelled; with hal0's lock held, temp files a crash left are removed."""
    folder = host_dirs["slots_dir"]
    paths = _slots(folder, 3)
    before = paths[1].read_bytes()
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE, apply=False)
    leftover = fsio.temp_path_for(folder / "crashed.toml")
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder / ".s1.toml")):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    engine._temps._checked = True  # the start's own clean-up is done: only a failure clears
    leftover.write_text("left by a crash")
    with structlog.testing.capture_logs() as logs:
        report = engine.reconcile(ROCM_USABLE)
    statuses = [o.status for o in report.outcomes]
    assert [
        OutcomeStatus.RELABELED,
        OutcomeStatus.WRITE_FAILED,
        OutcomeStatus.RELABELED,
    ] == statuses
    assert "Input/output error" in (report.outcomes[1].message or "")
    assert before == paths[1].read_bytes()
    assert [] == _temps(folder), "the failed write's temp, or the crash's, was left"
    assert {"slot.relabeled", "slot.write_failed", "slot.temp_files_removed"} == {
        e["event"] for e in logs
    }


def test_without_a_failure_no_temp_file_is_looked_for(
    host_dirs: dict[str, Path], make_settings
) -> None:
    folder = host_dirs["slots_dir"]
    _slots(folder, 2)
    engine = Reconciler(make_settings())
    engine._temps._checked = True
    leftover = fsio.temp_path_for(folder / "crashed.toml")
    leftover.write_text("left by a crash")
    engine.reconcile(ROCM_USABLE)
    assert [leftover.name] == _temps(folder)


def test_an_interruption_while_a_group_is_prepared_leaves_no_temp(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = host_dirs["slots_dir"]
    paths = _slots(folder, 3)
    real = store.begin_replace
    calls: list[Path] = []

    def begin(path: Path, data: bytes, **kwargs: Any) -> fsio.PendingWrite:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, data, **kwargs)

    monkeypatch.setattr(store, "begin_replace", begin)
    olds = [p.read_bytes() for p in paths]
    with pytest.raises(KeyboardInterrupt):
        Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert olds == [p.read_bytes() for p in paths]
    assert [] == _temps(folder)


def test_the_edit_is_made_before_the_lock_and_again_only_when_the_file_changed(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hal0's lock is held for the re-read and the write, not for the edit of unchanged bytes;
    a file another writer changed meanwhile is edited again, from what it holds now."""
    folder = host_dirs["slots_dir"]
    same, changed = _slots(folder, 2)
    held: list[bool] = []
    edits: list[tuple[str, bool]] = []
    real_lock, real_edit = store.slot_write_lock, edit.set_device

    @contextlib.contextmanager
    def lock(*args: Any, **kwargs: Any) -> Iterator[None]:
        changed.write_text(changed.read_text().replace("port = 8001", "port = 9001"))
        with real_lock(*args, **kwargs):
            held.append(True)
            yield
            held.pop()

    def counting(text: str, **kwargs: Any) -> edit.EditResult:
        edits.append(("port = 9001" in text, bool(held)))
        return real_edit(text, **kwargs)

    monkeypatch.setattr(store, "slot_write_lock", lock)
    monkeypatch.setattr(edit, "set_device", counting)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert [OutcomeStatus.RELABELED] * 2 == [o.status for o in report.outcomes]
    # s0 and s1 before the lock; s1 again, from its new bytes, under it
    assert [(False, False), (False, False), (True, True)] == edits
    assert "port = 9001" in changed.read_text()
    assert b'device = "gpu-rocm"' in same.read_bytes()
