"""One batch as the worker runs it: a failing pass is said and counted, the metrics textfile is
rewritten only for a batch that changed something, and the counters the bench reads."""

from __future__ import annotations

import json
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler.daemon import memory, passes, publish
from hal0_reconciler.host.restarts import units
from hal0_reconciler.model import HostFacts, LaneState, ProbeResult
from hal0_reconciler.settings import Settings
from hal0_reconciler.slots import seen
from helpers.daemon_host import device_of
from helpers.pass_bench import UNUSABLE, USABLE, Bench


def _failing_probe(_settings: Settings) -> HostFacts:
    raise OSError(5, "Input/output error", "/dev/kfd")


def test_a_failing_pass_is_the_worker_s_health_until_a_pass_works(tmp_path: Path) -> None:
    """A batch that raises is re-raised (the worker logs it with its traceback), its reason is
    what the main loop's health says, and the next batch that works clears it."""
    bench = Bench(tmp_path)
    bench.slot("agent")
    gather = bench.passes._gather
    bench.passes._gather = _failing_probe
    with pytest.raises(OSError, match="Input/output error"):
        bench.full()
    reasons = passes.failures(bench.passes)
    assert ["the last pass failed: [Errno 5] Input/output error: '/dev/kfd'"] == reasons, (
        f"the health does not say why the pass failed: {reasons}"
    )
    bench.passes._gather = gather
    bench.full()
    assert [] == passes.failures(bench.passes), "a pass that worked left the worker failed"


def test_a_failed_full_pass_still_counts_toward_ready(tmp_path: Path) -> None:
    """READY=1 comes after the first full pass finished or failed (a poisoned file must not
    keep the daemon from ever being ready); a partial batch is no full attempt."""
    bench = Bench(tmp_path)
    slot = bench.slot("agent")
    bench.passes._gather = _failing_probe
    with pytest.raises(OSError):
        bench.full()
    assert 1 == bench.passes.progress.full_attempts, "a failed full pass is no full attempt"
    with pytest.raises(OSError):
        bench.changed(slot)
    assert 1 == bench.passes.progress.full_attempts, "a partial batch counted as a full attempt"
    assert 2 == bench.passes.progress.batches, "a failed batch is not counted as finished"
    assert 2 == bench.wakes, "the main loop was not woken after a failed batch"


def _metrics_file_identity(path: Path) -> tuple[int, int]:
    st = path.stat()  # written by rename: a rewrite is a new inode
    return st.st_ino, st.st_mtime_ns


def test_the_metrics_file_is_rewritten_only_when_a_batch_changed_something(
    tmp_path: Path,
) -> None:
    """The textfile is written after a batch that changed what it shows (a relabel, a restart
    result) and left alone for one that did not (the echo of the daemon's own write)."""
    prom = tmp_path / "textfiles" / "hal0.prom"
    bench = Bench(tmp_path, metrics_textfile=str(prom))
    slot = bench.slot("agent")
    bench.slot("coder", "gpu-rocm")  # not in the partial batches below
    bench.full()  # relabels agent
    written = _metrics_file_identity(prom)
    bench.changed(slot)  # the echo of our own write: nothing changed
    assert written == _metrics_file_identity(prom), "the metrics were rewritten for an echo"
    bench.slot("agent", port=9000)  # an operator edit: a relabel again
    bench.changed(slot)
    assert written != _metrics_file_identity(prom), "a relabel did not rewrite the metrics"
    assert 'hal0_reconciler_relabels_total{target="gpu-rocm"} 2' in prom.read_text()
    written = _metrics_file_identity(prom)
    results = bench.passes._restarter.results  # type: ignore[attr-defined]
    gather = bench.passes._gather

    def probe_while_a_restart_finishes(settings: Settings) -> HostFacts:
        results[units.RestartResult.RESTARTED] += 1  # the restarter thread, meanwhile
        return gather(settings)

    bench.passes._gather = probe_while_a_restart_finishes
    bench.probe()  # the same facts: nothing in the slots or the lane changed
    assert written != _metrics_file_identity(prom), "a restart result did not rewrite them"
    assert 'hal0_reconciler_restarts_total{result="restarted"} 1' in prom.read_text()


def test_the_stats_say_the_lane_the_policy_saw(tmp_path: Path) -> None:
    """Stats.lane is None before the first probe, then the lane the pass decided on (unsettled
    while the demotion grace runs)."""
    bench = Bench(tmp_path, demote_grace=60)
    assert bench.passes.stats().lane is None, "a lane before any probe"
    bench.facts = UNUSABLE
    bench.full()
    assert LaneState.UNSETTLED is bench.passes.stats().lane, "the stats lost the lane"


def test_a_probe_that_cannot_run_is_a_problem_until_it_runs_again(tmp_path: Path) -> None:
    """An AMD host whose lane probe cannot run (no such service user): a "probe" problem naming
    why, warned once however many probes fail; the first probe that runs clears it and says so."""
    from structlog.testing import capture_logs

    cannot = ProbeResult(
        usable=False, credentials=None, kfd_ok=False, render_node=None, error="no user 'hal0x'"
    )
    bench = Bench(tmp_path)
    bench.slot("agent")
    with capture_logs() as logs:
        bench.facts = HostFacts(amd=True, lane=LaneState.UNKNOWN, probe=cannot)
        bench.full()
        warned_at_once = [e["event"] for e in logs if e["event"] == "host.probe_failed"]
        bench.probe()
        bench.probe()
        problem = bench.passes.progress.problems.get("probe")
        bench.facts = USABLE
        bench.probe()
    assert problem is not None, "a probe that cannot run is no problem"
    assert "no user 'hal0x'" in problem, f"the probe problem does not say why: {problem}"
    assert "probe" not in bench.passes.progress.problems, "a probe that runs again left it"
    assert ["host.probe_failed"] == warned_at_once, "the first probe that cannot run is not said"
    said = [e["event"] for e in logs if e["event"].startswith("host.probe")]
    assert ["host.probe_failed", "host.probe_runs_again"] == said, f"said: {said}"


def test_a_probe_that_finds_other_facts_is_published(tmp_path: Path) -> None:
    """Host facts that changed (even with no slot to reconcile) move the revision the main loop
    republishes status.json on, and status.json shows them; the same facts move nothing."""
    bench = Bench(tmp_path)
    bench.facts = HostFacts(amd=True, lane=LaneState.USABLE)
    bench.full()
    sources = publish.Sources(bench.passes, None, {}, bench.selfheal, 0.0)
    revision = bench.passes.progress.revision
    bench.probe()
    assert revision == bench.passes.progress.revision, "the same facts were published again"
    bench.facts = HostFacts(amd=True, lane=LaneState.UNUSABLE)
    bench.probe()
    assert revision != bench.passes.progress.revision, "other host facts were not published"
    snapshot, _ = publish.compose(sources, [], ready=True)
    assert "unusable" == snapshot["lane"]["state"], f"status.json shows {snapshot['lane']}"


def test_the_main_loop_is_told_when_to_probe_again_during_the_grace(tmp_path: Path) -> None:
    """While the demotion grace runs the main loop gets the next probe's time (so a lane that
    stays down is demoted on time without any event); once the lane is decided, none."""
    bench = Bench(tmp_path, demote_grace=60)
    bench.slot("agent", "gpu-rocm")
    bench.facts = UNUSABLE
    bench.full()
    assert 1005.0 == bench.passes.progress.recheck_at, "no re-probe asked for during the grace"
    bench.clock.now = 1060.0
    bench.probe()
    assert bench.passes.progress.recheck_at is None, "re-probes asked for after the grace"


def test_a_big_batch_gives_its_garbage_back(tmp_path: Path) -> None:
    """After a pass over at least BIG_BATCH files the worker drops the pass's report and
    collects garbage (then glibc gives the free pages back): a flood must not leave the daemon
    fat. A small batch does not pay for it."""
    import gc

    bench = Bench(tmp_path)
    small = [bench.slot(f"s{n}", "gpu-rocm") for n in range(3)]
    bench.full()
    reconciler = bench.passes._reconciler
    assert reconciler is not None
    reports: list[weakref.ref[Any]] = []
    reconcile = reconciler.reconcile

    def keep_an_eye(*args: Any, **kwargs: Any) -> Any:
        report = reconcile(*args, **kwargs)
        reports.append(weakref.ref(report))
        return report

    reconciler.reconcile = keep_an_eye  # type: ignore[method-assign]
    report_held: list[bool] = []  # at each full collection: is the last report still held?

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            report_held.append(bool(reports) and reports[-1]() is not None)

    was_enabled = gc.isenabled()
    gc.disable()  # only the worker's own collections are seen
    gc.callbacks.append(note)
    try:
        bench.changed(*small)
        assert [] == report_held, "a small batch paid for a full garbage collection"
        for n in range(memory.BIG_BATCH):
            bench.slot(f"big{n}", "gpu-rocm")
        bench.full()
        assert 1 == len(report_held), "a batch of BIG_BATCH files did not give its garbage back"
        assert [False] == report_held, "the big pass's report was still held when collected"
    finally:
        gc.callbacks.remove(note)
        if was_enabled:
            gc.enable()


def test_the_demoted_slots_gauge_follows_the_ledger(tmp_path: Path) -> None:
    """A reload to a state_dir whose ledger says a cpu slot was demoted by us: no file changes,
    but hal0_reconciler_demoted_slots goes to 1 in the textfile at the next pass (even one that
    covers only that slot)."""
    prom = tmp_path / "textfiles" / "hal0.prom"
    bench = Bench(tmp_path, metrics_textfile=str(prom))
    slot = bench.slot("agent", "cpu")
    bench.facts = UNUSABLE
    bench.full()
    assert "hal0_reconciler_demoted_slots 0" in prom.read_text()
    other = tmp_path / "state2"
    other.mkdir()
    ledger = {str(slot.absolute()): {"slot": "agent", "old": "gpu-rocm", "at": 1.0}}
    (other / "demotions.json").write_text(json.dumps(ledger))
    bench.passes.update_settings(
        bench.make_settings(state_dir=str(other), metrics_textfile=str(prom))
    )
    bench.changed(slot)  # a partial pass: only a changed batch rewrites the textfile
    assert "cpu" == device_of(slot), "setup: the lane is down, the demoted slot stays on cpu"
    assert "hal0_reconciler_demoted_slots 1" in prom.read_text(), (
        "the demoted-slots gauge did not follow the ledger"
    )


def test_a_hal0_update_alone_is_published(tmp_path: Path) -> None:
    """hal0 updated with no slot whose verdict changes: the status still shows the new hal0
    (the revision the main loop republishes on moves)."""
    bench = Bench(tmp_path)
    bench.slot("agent", "cpu")
    bench.full()
    sources = publish.Sources(bench.passes, None, {}, bench.selfheal, 0.0)
    revision = bench.passes.progress.revision
    bench.hal0.install("0822")
    bench.full()
    assert revision != bench.passes.progress.revision, "a hal0 update was not published"
    snapshot, _ = publish.compose(sources, [], ready=True)
    assert "1.2.0" == (snapshot["hal0"] or {}).get("version"), f"status: {snapshot['hal0']}"


def test_the_worker_keeps_nothing_about_slots_that_are_gone(tmp_path: Path) -> None:
    """What the worker remembers per slot (its last status entry) is bounded by the slot
    files that exist: a slot seen gone drops out at once, and slots that vanished unseen (their
    events lost) at the next full pass; a partial pass keeps the other slots' entries."""
    bench = Bench(tmp_path)
    slots = [bench.slot(f"s{n}", "gpu-rocm") for n in range(4)]
    bench.full()
    remembered = bench.passes._book.entries
    assert {str(p) for p in slots} == set(remembered), "setup: every slot remembered"
    bench.changed(slots[0])
    assert {str(p) for p in slots} == set(bench.passes._book.entries), (
        "a partial pass forgot the slots it did not cover"
    )
    slots[1].unlink()
    bench.changed(slots[1])
    assert str(slots[1]) not in bench.passes._book.entries, "a slot seen gone is still remembered"
    slots[2].unlink()  # its event lost
    bench.full()
    assert {str(slots[0]), str(slots[3])} == set(bench.passes._book.entries), (
        "a full pass kept what it remembered about slots that vanished unseen"
    )


def _settle() -> None:
    """Let the slot files' last change age past the settle time: from then on a pass may judge
    an unchanged file by its identity alone (the fast path), as on a host at rest."""
    threading.Event().wait(seen.SETTLED_NS / 1e9 + 0.2)


def test_settled_unchanged_slots_stay_in_the_status(tmp_path: Path) -> None:
    """On a host at rest, full passes find every slot unchanged (the fast path): each stays in
    the status as it was, the worker still remembers each, and a slot edited meanwhile shows
    its new entry."""
    bench = Bench(tmp_path)
    slots = [bench.slot(f"s{n}", "gpu-rocm") for n in range(3)]
    _settle()
    bench.full()
    shown = {p.name: bench.status(p) for p in slots}
    for _ in range(2):  # every file the same as at the settled read: the outcomes are reused
        bench.full()
        again = {p.name: bench.status(p) for p in slots}
        assert all(e is not None for e in again.values()), f"a settled slot dropped out: {again}"
        assert shown == again, f"settled unchanged slots changed in the status: {again}"
        assert {str(p) for p in slots} == set(bench.passes._book.entries), (
            "the worker forgot settled unchanged slots"
        )
    bench.slot("s0", "cpu")
    bench.full()
    assert "cpu" == (bench.status(slots[0]) or {}).get("device"), "an edit after rest not shown"


def test_problems_coming_and_going_are_published(tmp_path: Path) -> None:
    """A problem appearing, its detail changing and it clearing each move the revision the
    main loop republishes on; the same problem again, or clearing one that is not there, do
    not (status.json is not rewritten for nothing)."""
    bench = Bench(tmp_path)
    moves = []
    for step in (
        lambda: bench.passes.problem("metrics", "cannot write x"),
        lambda: bench.passes.problem("metrics", "cannot write x"),
        lambda: bench.passes.problem("metrics", "cannot write y"),
        lambda: bench.passes.clear_problem("metrics"),
        lambda: bench.passes.clear_problem("metrics"),
    ):
        revision = bench.passes.progress.revision
        step()
        moves.append(bench.passes.progress.revision != revision)
    assert [True, False, True, True, False] == moves, f"published or not, step by step: {moves}"


def test_after_the_echo_of_a_relabel_an_edit_is_news(tmp_path: Path) -> None:
    """The pass after a relabel finds the file as written: the status still says relabelled.
    An operator's edit of that slot afterwards (its name) is shown at once."""
    bench = Bench(tmp_path)
    slot = bench.slot("agent")
    bench.full()
    bench.changed(slot)  # the echo of our own write
    entry = bench.status(slot) or {}
    assert ("relabeled", "agent") == (entry.get("status"), entry.get("name")), entry
    slot.write_text(slot.read_text().replace('name = "agent"', 'name = "helper"'))
    bench.changed(slot)
    entry = bench.status(slot) or {}
    assert ("unchanged", "helper") == (entry.get("status"), entry.get("name")), (
        f"an edit after the echo was not shown: {entry}"
    )
