"""What the engine keeps between passes, and for how long, as an operator feels it: one key per
slot whatever path names it, the demotion gauge, hands-off entries, leftover temp files (at
start, and after a write fails on a full disk), an orderly stop, a folder that cannot be synced,
what is remembered of each file (kept outcomes, released memory, problems said again, failed
writes tried again)."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from hal0_reconciler import fsio
from hal0_reconciler.model import HostFacts, Verdict
from hal0_reconciler.reconcile import Outcome, OutcomeStatus, Reconciler, slot_key
from hal0_reconciler.slots import document, policy, store
from hal0_reconciler.state import DemotionLedger
from helpers.clock import FakeTime
from helpers.daemon_host import slot_text
from helpers.hosts import NOT_AMD, ROCM_UNUSABLE, ROCM_USABLE
from helpers.lock_holder import holding_lock


def _slot(folder: Path, name: str, device: str = "gpu-vulkan") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(slot_text(name, device))
    return path


def test_a_relative_slots_dir_still_keys_each_slot_by_its_absolute_path(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``slots_dir = "slots"`` (relative to the working directory): the demotion recorded by a
    full pass is keyed by the absolute path (it outlives a restart from another directory), and
    a pass over the same file named relatively (as a watch event names it) finds it."""
    slots = host_dirs["slots_dir"]
    agent = _slot(slots, "agent")
    monkeypatch.chdir(slots.parent)
    settings = make_settings(slots_dir=slots.name)
    ledger = DemotionLedger.in_state_dir(host_dirs["state_dir"])
    Reconciler(settings, ledger=ledger).reconcile(ROCM_UNUSABLE)
    assert 'device = "cpu"' in agent.read_text(), "setup: the slot is demoted"
    assert {str(agent)} == set(ledger.keys()), (
        "a full pass with a relative slots_dir recorded the demotion under a relative key"
    )
    Reconciler(settings, ledger=ledger).reconcile(ROCM_USABLE, [Path(slots.name, agent.name)])
    assert 'device = "gpu-rocm"' in agent.read_text(), (
        "a slot named by a relative path was not recognised as our own demotion"
    )


def test_the_demotion_gauge_counts_the_slots_on_cpu_because_of_us(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """The metrics gauge of our own demotions: two demoted, then none once they are restored."""
    for name in ("agent", "coder"):
        _slot(host_dirs["slots_dir"], name)
    _slot(host_dirs["slots_dir"], "mine", device="cpu")  # on cpu, but not by us
    engine = Reconciler(make_settings(), ledger=DemotionLedger.in_state_dir(host_dirs["state_dir"]))
    engine.reconcile(ROCM_UNUSABLE)
    assert 2 == engine.own_demotions, "the gauge does not count the slots we demoted"
    engine.reconcile(ROCM_USABLE)
    assert 0 == engine.own_demotions, "the gauge still counts slots we restored"


def test_a_hands_off_slot_of_a_full_pass_names_its_file(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """The status lists a hands-off slot by its file path (a full pass lists names only)."""
    agent = _slot(host_dirs["slots_dir"], "agent")
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE, hands_off={slot_key(agent)})
    (outcome,) = report.outcomes
    assert (OutcomeStatus.HANDS_OFF, agent) == (outcome.status, outcome.path), (
        f"a hands-off slot is reported under {outcome.path!r}, not its file path"
    )


def test_leftover_temp_files_are_looked_for_at_the_start_not_on_every_pass(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """The first applying pass clears leftovers of a crash; later passes do not scan the folder
    for them again (with 10k slots, a second walk of the folder per pass). A leftover that
    appears later waits for the next start or the next failed write."""
    slots = host_dirs["slots_dir"]
    early = fsio.temp_path_for(slots / "agent.toml")
    early.write_text("half")
    _slot(slots, "agent", device="gpu-rocm")
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE)
    assert not early.exists(), "setup: the first pass clears leftover temp files"
    late = fsio.temp_path_for(slots / "agent.toml")
    late.write_text("half")
    engine.reconcile(ROCM_USABLE)
    engine.reconcile(ROCM_USABLE)
    assert late.exists(), "passes after the first scan the slots folder for temp files again"


@pytest.mark.timeout(30)
def test_a_write_abandoned_because_the_daemon_stops_is_not_an_error(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """Waiting for hal0's lock when the daemon is told to stop: the write is given up and said
    as ``slot.write_abandoned`` at info level (an orderly stop), never ``slot.write_failed``."""
    settings = make_settings(lock_timeout=20.0)
    agent = _slot(host_dirs["slots_dir"], "agent")
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    with holding_lock(settings.effective_lock_file), structlog.testing.capture_logs() as logs:
        timer.start()
        started = time.monotonic()
        Reconciler(settings, cancelled=stop.is_set).reconcile(ROCM_USABLE, [agent])
        assert time.monotonic() - started < 10, "the lock wait did not end at the stop"
    timer.cancel()
    said = [(e["event"], e["log_level"]) for e in logs if e["event"].startswith("slot.write")]
    assert [("slot.write_abandoned", "info")] == said, (
        f"a write given up at a stop is reported as {said}"
    )


def test_a_folder_that_cannot_be_synced_fails_only_the_files_written_into_it(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync of the slots folder fails (EIO): the relabels of that pass are write failures with
    the folder and the errno (the health check tells EIO from EROFS by it); a slot the pass did
    not write stays unchanged."""
    slots = host_dirs["slots_dir"]
    written = _slot(slots, "agent")
    kept = _slot(slots, "coder", device="gpu-rocm")

    def failing(folder: Path) -> None:  # the one call there is no real way to make fail
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fsio, "fsync_directory", failing)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    by_path = {o.path: o for o in report.outcomes}
    assert OutcomeStatus.UNCHANGED is by_path[kept].status, (
        "a slot the pass did not write was failed by the folder sync"
    )
    failed = by_path[written]
    assert (OutcomeStatus.WRITE_FAILED, errno.EIO) == (failed.status, failed.errno), (
        "a relabel whose folder could not be synced is not a write failure with its errno"
    )
    assert f"{slots}: the folder could not be synced" in (failed.message or "")


# -- what is remembered of each file between passes ----------------------------------------------
def _kept_of(names: set[str]) -> int:
    """Parses and outcomes of the slot files called ``names`` still alive anywhere."""
    gc.collect()
    return sum(
        (isinstance(o, document.SlotDoc) and o.name in names)
        or (isinstance(o, Outcome) and o.path.stem in names)
        for o in gc.get_objects()
    )


@pytest.mark.parametrize("facts", [ROCM_USABLE, NOT_AMD], ids=["reporting", "quiet"])
def test_the_memory_of_deleted_slots_is_released_by_the_next_full_pass(
    host_dirs: dict[str, Path], make_settings, facts: HostFacts
) -> None:
    """Slots come and go for months: what was kept of each deleted file (its parse, its last
    outcome) goes with the next full pass, reporting or not (memory stays bounded by the slots
    that exist)."""
    slots = host_dirs["slots_dir"]
    names = {f"gone{n}" for n in range(20)}
    paths = [_slot(slots, name, device="gpu-rocm") for name in sorted(names)]
    keeper = _slot(slots, "keeper", device="gpu-rocm")
    engine = Reconciler(make_settings())
    engine.reconcile(facts)
    assert _kept_of(names) >= 20, "setup: the engine keeps the parse of each slot"
    for path in paths:
        path.unlink()
    assert [keeper] == [o.path for o in engine.reconcile(facts).outcomes]
    assert 0 == _kept_of(names), "a full pass kept the memory of deleted slot files"


@pytest.mark.parametrize("facts", [ROCM_USABLE, NOT_AMD], ids=["reporting", "quiet"])
def test_a_pass_that_finds_a_slot_gone_releases_its_memory_at_once(
    host_dirs: dict[str, Path], make_settings, facts: HostFacts
) -> None:
    """The pass a deletion event triggers (over that file only, reporting or not) forgets it:
    the next full pass may be hours away."""
    agent = _slot(host_dirs["slots_dir"], "agent", device="gpu-rocm")
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE)
    agent.unlink()
    (status,) = [o.status for o in engine.reconcile(facts, [agent]).outcomes]
    assert OutcomeStatus.GONE is status
    assert 0 == _kept_of({"agent"}), "a pass that found a slot gone kept its memory"


_PROBLEMS = {  # a slot text, and the event that reports its problem
    "unreadable": ("name = [\n", "slot.unreadable"),
    "bad-name": ('name = "Odd"\ntype = "llm"\ndevice = "cpu"\n', "slot.name_invalid"),
}


@pytest.mark.parametrize("problem", sorted(_PROBLEMS))
@pytest.mark.parametrize("seen_by", ["a pass over it", "a full pass only"])
def test_a_problem_of_a_file_deleted_and_put_back_is_reported_again(
    host_dirs: dict[str, Path], make_settings, problem: str, seen_by: str
) -> None:
    """A problem is said once per file: deleted (the deletion seen by a pass over that file,
    or by a full pass only: events lost, an overflow) and put back later, it is a new file,
    and its problem is said again."""
    text, event = _PROBLEMS[problem]
    slot = host_dirs["slots_dir"] / "agent.toml"
    slot.write_text(text)
    engine = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        engine.reconcile(ROCM_USABLE)
        slot.unlink()
        engine.reconcile(ROCM_USABLE, [slot] if seen_by == "a pass over it" else None)
        slot.write_text(text)
        engine.reconcile(ROCM_USABLE)
    reported = [e["path"] for e in logs if e["event"] == event]
    assert [str(slot), str(slot)] == reported, (
        f"{event} of a file deleted (seen by {seen_by}) and put back was not said again"
    )


def test_a_new_file_where_a_demoted_slot_was_deleted_unseen_is_the_operators(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """Our demoted slot is deleted, seen by a full pass only; the operator then puts a slot on
    cpu at that path: it is theirs, and stays on cpu when the lane comes back."""
    slot = _slot(host_dirs["slots_dir"], "agent")
    ledger = DemotionLedger.in_state_dir(host_dirs["state_dir"])
    engine = Reconciler(make_settings(), ledger=ledger)
    engine.reconcile(ROCM_UNUSABLE)
    assert 'device = "cpu"' in slot.read_text(), "setup: the slot is demoted"
    slot.unlink()
    engine.reconcile(ROCM_UNUSABLE)
    assert frozenset() == ledger.keys(), "the demotion of a deleted slot is still on record"
    slot.write_text('# on the CPU on purpose\nname = "agent"\ndevice = "cpu"\n')
    engine.reconcile(ROCM_USABLE)
    assert 'device = "cpu"' in slot.read_text(), "the operator's new cpu slot was 'restored'"


def test_a_full_pass_keeps_the_demotions_of_slots_in_other_folders(
    host_dirs: dict[str, Path], make_settings, tmp_path: Path
) -> None:
    """The record is per slot path: a slot demoted in another folder (the slots folder before
    a settings change) is not dropped by a full pass over this one."""
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = _slot(other, "agent")
    ledger = DemotionLedger.in_state_dir(host_dirs["state_dir"])
    engine = Reconciler(make_settings(), ledger=ledger)
    engine.reconcile(ROCM_UNUSABLE, [elsewhere])
    engine.reconcile(ROCM_UNUSABLE)
    assert {str(elsewhere)} == set(ledger.keys()), (
        "a full pass dropped the demotion of a slot outside its folder"
    )


def test_a_pass_over_unchanged_files_gives_back_their_outcomes_as_they_were(
    host_dirs: dict[str, Path], make_settings, settled_at_once: None
) -> None:
    """A full pass over settled, unchanged files costs one lstat each: their outcomes are the
    very objects of the last pass (the daemon keeps their status entries without rebuilding)."""
    for n in range(3):
        _slot(host_dirs["slots_dir"], f"s{n}", device="gpu-rocm")
    engine = Reconciler(make_settings())
    first = engine.reconcile(ROCM_USABLE).outcomes
    engine.reconcile(ROCM_USABLE)  # settled now: noted for the next pass
    second = engine.reconcile(ROCM_USABLE).outcomes
    third = engine.reconcile(ROCM_USABLE).outcomes
    assert {OutcomeStatus.UNCHANGED} == {o.status for o in first}
    assert all(a is b for a, b in zip(second, third, strict=True)), (
        "unchanged files were judged again instead of keeping their outcome"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
@pytest.mark.timeout(60)
def test_a_write_that_failed_is_tried_again_by_the_next_pass(
    host_dirs: dict[str, Path], make_settings, settled_at_once: None
) -> None:
    """The slots folder is read-only (a real bind mount: EROFS) for one pass: the relabel
    fails; writable again, the very next pass writes it, although the file did not change."""
    slots = host_dirs["slots_dir"]
    agent = _slot(slots, "agent")
    engine = Reconciler(make_settings())
    subprocess.run(["mount", "--bind", str(slots), str(slots)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(slots)], check=True, timeout=30)
        (failed,) = engine.reconcile(ROCM_USABLE).outcomes
    finally:
        subprocess.run(["umount", str(slots)], check=False, timeout=30)
    assert (OutcomeStatus.WRITE_FAILED, errno.EROFS) == (failed.status, failed.errno)
    (retried,) = engine.reconcile(ROCM_USABLE).outcomes
    assert OutcomeStatus.RELABELED is retried.status, (
        f"a failed write was not tried again on an unchanged file: {retried.status}"
    )
    assert 'device = "gpu-rocm"' in agent.read_text()


def test_a_file_whose_judging_raised_is_parsed_afresh(
    host_dirs: dict[str, Path],
    make_settings,
    parses: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Judging a cached parse raises (here when the host facts change): that file is the
    pass's one problem, and the next pass trusts nothing of it: it is read and parsed again."""
    agent = _slot(host_dirs["slots_dir"], "agent", device="gpu-rocm")
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE)
    real = policy.decide
    failures = [MemoryError()]

    def once(doc: document.SlotDoc, **kwargs: Any) -> Verdict:
        if failures:
            raise failures.pop()
        return real(doc, **kwargs)

    monkeypatch.setattr(policy, "decide", once)
    (broken,) = engine.reconcile(ROCM_UNUSABLE, apply=False).outcomes
    assert OutcomeStatus.UNREADABLE is broken.status, "setup: judging the file raised"
    (again,) = engine.reconcile(ROCM_UNUSABLE, apply=False).outcomes
    assert OutcomeStatus.UNCHANGED is again.status, "the file is still called unreadable"
    assert ["agent", "agent"] == parses, (
        "after judging its cached parse raised, the file was not parsed afresh"
    )
    assert agent.exists()


def test_a_pass_over_some_files_keeps_what_is_known_of_the_others(
    host_dirs: dict[str, Path], make_settings, parses: list[str]
) -> None:
    """A watch event makes a pass over one file: the parses of the other files are kept, so
    the next full pass parses only what changed."""
    slots = host_dirs["slots_dir"]
    first, *_ = [_slot(slots, f"s{n}", device="gpu-rocm") for n in range(3)]
    engine = Reconciler(make_settings())
    engine.reconcile(ROCM_USABLE)
    first.write_text(slot_text("s0", "cpu"))
    engine.reconcile(ROCM_USABLE, [first])
    engine.reconcile(ROCM_USABLE)
    assert ["s0", "s1", "s2", "s0"] == parses, (
        "a pass over one file made the next full pass parse the others again"
    )


def test_a_pass_that_writes_nothing_syncs_no_folder(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder fsync (milliseconds on a busy disk) is paid only by a pass that renamed a
    file into it."""
    for n in range(3):
        _slot(host_dirs["slots_dir"], f"s{n}", device="gpu-rocm")
    synced: list[Path] = []
    monkeypatch.setattr(fsio, "fsync_directory", synced.append)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert {OutcomeStatus.UNCHANGED} == {o.status for o in report.outcomes}
    assert [] == synced, "a pass that wrote nothing fsynced the slots folder"


@contextlib.contextmanager
def _small_tmpfs(folder: Path, size: str) -> Iterator[None]:
    """``folder`` as a fresh tmpfs of ``size`` (a real disk that can fill up) until exit."""
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=False, timeout=30)


def _fill(path: Path) -> None:
    """Write ``path`` until the file system is full."""
    with path.open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
@pytest.mark.timeout(60)
def test_a_write_that_fails_clears_the_leftovers_of_a_crashed_write(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """The slots folder is full because another instance crashed mid-write and left its temp
    file: our write fails (ENOSPC) and, holding hal0's lock (so no write is in flight), we
    remove that leftover and say so; the next pass can write."""
    slots = host_dirs["slots_dir"]
    with _small_tmpfs(slots, "64k"):
        engine = Reconciler(make_settings())
        engine.reconcile(ROCM_USABLE)  # started: the start-up look for leftovers is done
        agent = _slot(slots, "agent")
        leftover = fsio.temp_path_for(slots / "other.toml")
        _fill(leftover)
        with structlog.testing.capture_logs() as logs:
            (failed,) = engine.reconcile(ROCM_USABLE).outcomes
        assert (OutcomeStatus.WRITE_FAILED, errno.ENOSPC) == (failed.status, failed.errno)
        assert not leftover.exists(), "a failed write left the crashed write's temp file"
        cleared = [e for e in logs if e["event"] == "slot.temp_files_removed"]
        assert [(1, str(slots))] == [(e["count"], e["folder"]) for e in cleared], (
            "the removal of leftover temp files was not said (with how many, and where)"
        )
        (written,) = engine.reconcile(ROCM_USABLE).outcomes
        assert OutcomeStatus.RELABELED is written.status
        assert 'device = "gpu-rocm"' in agent.read_text()


def test_the_start_up_look_for_leftovers_never_waits_for_the_lock(
    host_dirs: dict[str, Path], make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start, with hal0's lock held by another writer, the leftover temp file may be their
    write in flight: it is left for later, without waiting a moment for the lock (the first
    pass, and READY=1, are not delayed by it)."""
    slots = host_dirs["slots_dir"]
    _slot(slots, "agent", device="gpu-rocm")  # nothing to write: no other need for the lock
    leftover = fsio.temp_path_for(slots / "agent.toml")
    leftover.write_text("maybe in flight")
    waits = FakeTime()
    with holding_lock(Path(f"{slots}.lock")):
        monkeypatch.setattr(store, "time", waits)
        Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert leftover.exists(), "a temp file was removed while another writer held the lock"
    assert [] == waits.sleeps, "the start-up look for leftover temp files waited for the lock"


@pytest.mark.parametrize("broken", ["symlink", "over the size limit", "not TOML"])
def test_a_file_that_broke_keeps_nothing_of_its_former_parse(
    host_dirs: dict[str, Path], make_settings, broken: str
) -> None:
    """What the engine holds describes the files as they are now: a slot that became a
    symlink, too large or unparsable keeps no parse of what it was."""
    slot = _slot(host_dirs["slots_dir"], "agent", device="gpu-rocm")
    engine = Reconciler(make_settings(slot_max_bytes=1024))
    engine.reconcile(ROCM_USABLE)
    assert _kept_of({"agent"}) >= 1, "setup: the parse of the slot is kept"
    if broken == "symlink":
        slot.unlink()
        slot.symlink_to(host_dirs["slots_dir"].parent / "elsewhere.toml")
    elif broken == "over the size limit":
        slot.write_text(slot_text("agent", "gpu-rocm") + "#" * 2048 + "\n")
    else:
        slot.write_text("name = [\n")
    (outcome,) = engine.reconcile(ROCM_USABLE).outcomes
    assert outcome.status in {OutcomeStatus.NOT_REGULAR, OutcomeStatus.UNREADABLE}
    gc.collect()
    kept = [o for o in gc.get_objects() if isinstance(o, document.SlotDoc) and o.name == "agent"]
    assert [] == kept, f"a slot that is now {broken} still holds its former parse"


def test_a_restart_naming_the_same_folder_relatively_keeps_the_memory(
    host_dirs: dict[str, Path],
    make_settings,
    monkeypatch: pytest.MonkeyPatch,
    settled_at_once: None,
) -> None:
    """The saved memory of slot files is for a folder, however the setting spells it: a restart
    with ``slots_dir`` relative to the working directory (the same folder) reads no file."""
    slots = host_dirs["slots_dir"]
    for n in range(3):
        _slot(slots, f"s{n}", device="gpu-rocm")
    memory = host_dirs["state_dir"] / "seen-slots.json"
    Reconciler(make_settings(), seen_file=memory).reconcile(ROCM_USABLE)
    reads: list[Path] = []
    real = store.read_slot

    def counting(path: Path, **kwargs: Any) -> store.SlotFile:
        reads.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(store, "read_slot", counting)
    monkeypatch.chdir(slots.parent)
    Reconciler(make_settings(slots_dir=slots.name), seen_file=memory).reconcile(ROCM_USABLE)
    assert [] == reads, "a restart naming the slots folder relatively forgot the saved memory"
