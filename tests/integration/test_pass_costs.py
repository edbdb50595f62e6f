"""What a pass costs, as behaviour: an unchanged file is not parsed again, yet a change of host,
hal0 or file facts is always seen; the folder is fsynced once per pass before anything is
reported; a relabelled file is parsed twice (read, verify), not more."""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path

import pytest
import structlog.testing

from hal0_reconciler import fsio
from hal0_reconciler.reconcile import OutcomeStatus, Reconciler, slot_key
from helpers.hal0_tree import Hal0Tree
from helpers.hosts import ROCM_UNUSABLE, ROCM_USABLE

SLOT = '# {name}: keep this comment\nname = "{name}"\ndevice = "gpu-vulkan"\nport = 80{n:02d}\n'


def _fill(folder: Path, count: int) -> list[Path]:
    paths = []
    for n in range(count):
        path = folder / f"s{n}.toml"
        path.write_text(SLOT.format(name=f"s{n}", n=n))
        paths.append(path)
    return paths


def test_an_unchanged_file_is_not_parsed_again(
    host_dirs: dict[str, Path], make_settings, parses: list[str], settled_at_once: None
) -> None:
    _fill(host_dirs["slots_dir"], 3)
    engine = Reconciler(make_settings())
    first = engine.reconcile(ROCM_USABLE, apply=False)
    assert 3 == len(parses)
    again = engine.reconcile(ROCM_USABLE, apply=False)
    assert 3 == len(parses)  # recognised by their settled identity
    assert [o.status for o in first.outcomes] == [o.status for o in again.outcomes]
    assert {OutcomeStatus.PENDING} == {o.status for o in again.outcomes}


def test_an_unchanged_file_handed_off_is_hands_off_not_its_remembered_outcome(
    host_dirs: dict[str, Path], make_settings, parses: list[str], settled_at_once: None
) -> None:
    """A full pass gives an unchanged file its remembered outcome, except for a slot the daemon
    stopped fighting over: that one is hands-off, and gets its outcome again once released."""
    paths = _fill(host_dirs["slots_dir"], 2)
    engine = Reconciler(make_settings())
    first = engine.reconcile(ROCM_USABLE, apply=False)
    off = engine.reconcile(ROCM_USABLE, apply=False, hands_off={slot_key(paths[0])})
    assert [OutcomeStatus.HANDS_OFF, OutcomeStatus.PENDING] == [o.status for o in off.outcomes]
    assert off.outcomes[1] is first.outcomes[1]  # the other one: from the memory
    back = engine.reconcile(ROCM_USABLE, apply=False)
    assert [OutcomeStatus.PENDING] * 2 == [o.status for o in back.outcomes]
    assert 2 == len(parses)


def test_a_full_pass_after_a_move_to_another_folder_lists_that_folder(
    host_dirs: dict[str, Path], make_settings, settled_at_once: None
) -> None:
    """The same names in another slots folder (a reload that moved it): the pass is over the
    new folder's files, not the keys made for the old one."""
    _fill(host_dirs["slots_dir"], 2)
    other = host_dirs["slots_dir"].parent / "moved"
    other.mkdir()
    _fill(other, 2)
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE, apply=False)
    engine.update_settings(make_settings(slots_dir=str(other)))
    moved = engine.reconcile(ROCM_USABLE, apply=False)
    assert [other / "s0.toml", other / "s1.toml"] == [o.path for o in moved.outcomes]
    assert [str(other / "s0.toml"), str(other / "s1.toml")] == [o.key for o in moved.outcomes]


def test_a_touched_file_with_the_same_bytes_is_recognised_by_its_content(
    host_dirs: dict[str, Path], make_settings, parses: list[str], settled_at_once: None
) -> None:
    paths = _fill(host_dirs["slots_dir"], 2)
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE, apply=False)
    os.utime(paths[0])  # a new mtime and ctime, the same bytes
    engine.reconcile(ROCM_USABLE, apply=False)
    assert ["s0", "s1"] == sorted(parses)


def test_a_rewrite_in_place_with_the_old_size_and_mtime_is_judged_anew(
    host_dirs: dict[str, Path], make_settings, parses: list[str], settled_at_once: None
) -> None:
    """ctime cannot be set back: an in-place edit that keeps size and mtime is still seen."""
    (path,) = _fill(host_dirs["slots_dir"], 1)
    engine = Reconciler(make_settings())
    assert OutcomeStatus.PENDING is engine.reconcile(ROCM_USABLE, apply=False).outcomes[0].status
    before = path.stat()
    time.sleep(0.02)
    with path.open("r+b") as fh:  # same length, a label that is not a candidate
        data = fh.read().replace(b'"gpu-vulkan"', b'"Gpu-vulkan"')
        fh.seek(0)
        fh.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns)
    outcome = engine.reconcile(ROCM_USABLE, apply=False).outcomes[0]
    assert outcome.verdict is not None
    assert (OutcomeStatus.UNCHANGED, "device-not-gpu-vulkan") == (
        outcome.status,
        outcome.verdict.reason.value,
    )
    assert ["s0", "s0"] == parses


def test_a_change_of_host_facts_rejudges_every_slot_without_parsing(
    host_dirs: dict[str, Path], make_settings, parses: list[str], settled_at_once: None
) -> None:
    _fill(host_dirs["slots_dir"], 3)
    engine = Reconciler(make_settings(demote_grace=0))
    usable = engine.reconcile(ROCM_USABLE, apply=False)
    unusable = engine.reconcile(ROCM_UNUSABLE, apply=False)
    assert {"gpu-rocm"} == {o.verdict.new for o in usable.outcomes if o.verdict}
    assert {"cpu"} == {o.verdict.new for o in unusable.outcomes if o.verdict}
    assert 3 == len(parses)


def test_a_hal0_update_rejudges_every_slot_without_parsing(
    host_dirs: dict[str, Path], make_settings, parses: list[str], settled_at_once: None
) -> None:
    """ade07ba's default image is not Vulkan-capable; 0826's is: the same files, kept now."""
    _fill(host_dirs["slots_dir"], 3)
    engine = Reconciler(make_settings())
    old = engine.reconcile(ROCM_USABLE, apply=False)
    Hal0Tree(host_dirs["hal0_venv"].parents[3]).install("0826")
    new = engine.reconcile(ROCM_USABLE, apply=False)
    assert {OutcomeStatus.PENDING} == {o.status for o in old.outcomes}
    assert {"image-vulkan-capable"} == {o.verdict.reason.value for o in new.outcomes if o.verdict}
    assert 3 == len(parses)


def test_a_racy_read_is_not_trusted_by_identity(
    host_dirs: dict[str, Path], make_settings, parses: list[str]
) -> None:
    """A file read within a second of its last change is checked by content next time."""
    _fill(host_dirs["slots_dir"], 1)
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE, apply=False)
    engine.reconcile(ROCM_USABLE, apply=False)
    assert ["s0"] == parses  # same bytes: no parse, but they were read and hashed


def test_a_relabel_parses_twice_and_syncs_the_folder_once_before_reporting(
    host_dirs: dict[str, Path], make_settings, parses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _fill(host_dirs["slots_dir"], 4)
    loads: list[str] = []  # slot texts parsed (hal0's own files are TOML too)
    real_loads = tomllib.loads

    def counting_loads(text: str, **kwargs: object) -> dict[str, object]:
        if "keep this comment" in text:
            loads.append(text)
        return real_loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tomllib, "loads", counting_loads)
    order: list[str] = []
    real_sync = fsio.fsync_directory
    real_commit = fsio.commit_writes

    def sync(folder: Path) -> None:
        order.append(f"fsync {folder.name}")
        real_sync(folder)

    def commit(pending: list[fsio.PendingWrite]) -> list[OSError | None]:
        order.append("commit " + " ".join(p.path.name for p in pending))
        return real_commit(pending)

    monkeypatch.setattr(fsio, "fsync_directory", sync)
    monkeypatch.setattr(fsio, "commit_writes", commit)
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
        order.extend(e["event"] for e in logs)
    assert 4 == len(report.relabeled)
    # the four files' temp files fsynced and renamed together (one write group), then the
    # folder once, then the news
    assert ["commit " + " ".join(p.name for p in paths)] == order[:1]
    assert ["fsync slots", *["slot.relabeled"] * 4] == order[1:]
    assert sorted(f"s{n}" for n in range(4)) == sorted(parses)  # read once, under the lock
    assert 8 == len(loads)  # per file: that parse, and the edit's verifying re-parse
    for path in paths:  # and the files are right
        assert b'device = "gpu-rocm"' in path.read_bytes()


def test_a_folder_that_cannot_be_synced_fails_the_relabels(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(host_dirs["slots_dir"], 2)

    def broken(folder: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(fsio, "fsync_directory", broken)
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert {OutcomeStatus.WRITE_FAILED} == {o.status for o in report.outcomes}
    assert all("could not be synced" in (o.message or "") for o in report.outcomes)
    assert ["slot.write_failed"] * 2 == [e["event"] for e in logs]


def test_a_dry_run_outcome_is_not_taken_for_a_real_pass(
    host_dirs: dict[str, Path], make_settings, settled_at_once: None
) -> None:
    """`plan`'s "pending" remembered for an unchanged file must not stand in for the write."""
    paths = _fill(host_dirs["slots_dir"], 2)
    engine = Reconciler(make_settings())
    assert {OutcomeStatus.PENDING} == {
        o.status for o in engine.reconcile(ROCM_USABLE, apply=False).outcomes
    }
    assert 2 == len(engine.reconcile(ROCM_USABLE).relabeled)
    assert all(b'"gpu-rocm"' in p.read_bytes() for p in paths)


def test_the_echo_of_a_relabel_is_known_by_its_bytes_and_not_parsed_again(
    host_dirs: dict[str, Path], make_settings, parses: list[str]
) -> None:
    """The daemon's own write comes back as an event: the written bytes are remembered with the
    parse the editor verified them by, so the next look reads them and does not parse them."""
    paths = _fill(host_dirs["slots_dir"], 3)
    engine = Reconciler(make_settings())
    assert 3 == len(engine.reconcile(ROCM_USABLE).relabeled)
    assert 3 == len(parses)
    echo = engine.reconcile(ROCM_USABLE, paths)
    assert 3 == len(parses), "the daemon's own writes were parsed again"
    assert {OutcomeStatus.UNCHANGED} == {o.status for o in echo.outcomes}
    assert {"gpu-rocm"} == {o.verdict.old for o in echo.outcomes if o.verdict is not None}
    paths[0].write_text(paths[0].read_text().replace("port", "# moved\nport"))
    engine.reconcile(ROCM_USABLE, paths)
    assert ["s0"] == parses[3:], "a file changed after the daemon's write was not read anew"
