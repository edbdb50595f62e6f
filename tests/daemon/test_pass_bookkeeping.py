"""The worker's bookkeeping across passes: status entries, counters, problems, fight memory and
a reload's new settings. Driven batch by batch on the real engine, with a fake clock and fake
host facts (no threads: each ``process`` call is one pass, as the worker thread runs it)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hal0_reconciler.aiter import monitor
from hal0_reconciler.daemon import publish, selfheal
from hal0_reconciler.daemon.workqueue import Batch, Special
from hal0_reconciler.host.restarts import units
from hal0_reconciler.model import HostFacts, LaneState, SlotKey
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from hal0_reconciler.slots import seen
from helpers.daemon_host import device_of, slot_text
from helpers.pass_bench import UNUSABLE, USABLE, Bench, fight_until_hands_off


def test_hands_off_slots_stay_in_the_status_on_a_full_pass(tmp_path: Path) -> None:
    """A slot the daemon stopped fighting over is still listed (as hands-off) after a full pass,
    and a partial pass keeps what was known about it (its name and device)."""
    bench = Bench(tmp_path, fight_limit=1)
    slot = bench.slot("agent")
    fight_until_hands_off(bench, slot, "agent")
    bench.changed(slot)
    partial = bench.status(slot)
    assert partial is not None, "a hands-off slot dropped out of the status on a partial pass"
    assert ("hands-off", "agent") == (partial["status"], partial.get("name")), (
        "a partial pass forgot what was known about a hands-off slot"
    )
    bench.full()
    entry = bench.status(slot)
    assert entry is not None, "a hands-off slot dropped out of the status on a full pass"
    assert "hands-off" == entry["status"], f"hands-off slot shown as {entry['status']}"
    assert 1 == bench.passes.progress.metrics.hands_off["fight"], "metrics miscount hands-off slots"


def test_the_pass_counter_counts_each_pass_once(tmp_path: Path) -> None:
    """passes/full_passes count exactly the passes run; a probe that changed nothing is none."""
    bench = Bench(tmp_path)
    slot = bench.slot("agent")
    bench.full()
    bench.changed(slot)
    bench.changed(slot)
    bench.probe()  # same facts: no pass
    stats = bench.passes.stats()
    assert (3, 1) == (stats.passes, stats.full_passes), f"pass counters off: {stats}"
    assert 3 == bench.passes.progress.metrics.passes, "the metrics' pass counter is off"
    assert 4 == bench.passes.progress.batches, "every batch, pass or not, is counted as finished"
    assert 1 == stats.relabels, "relabels counted wrongly"


def test_a_vanished_slot_leaves_the_status_and_the_fight_memory(tmp_path: Path) -> None:
    """A slot file that went away is not reported (not even as hands-off) and nothing about its
    fight is remembered: a new file at that path starts with a clean slate."""
    bench = Bench(tmp_path, fight_limit=1)
    slot = bench.slot("agent")
    fight_until_hands_off(bench, slot, "agent")
    slot.unlink()
    bench.changed(slot)
    assert bench.status(slot) is None, "a vanished slot is still listed in the status"
    assert frozenset() == bench.passes.fights.hands_off, "a vanished slot is still hands-off"
    assert frozenset() == bench.passes.fights.tracked_keys(), "its fight memory was kept"
    # a slot relabelled once, then deleted: its relabel does not count against a new file
    other = bench.slot("coder")
    bench.changed(other)
    assert SlotKey(str(other.absolute())) in bench.passes.fights.tracked_keys()
    other.unlink()
    bench.changed(other)
    assert frozenset() == bench.passes.fights.tracked_keys(), (
        "a vanished slot's recent relabels were kept"
    )


def test_a_problem_that_is_fixed_leaves_the_status(tmp_path: Path) -> None:
    """The metrics file cannot be written (a file where its folder should be): a problem; once
    the folder can be made, the next pass clears it without a restart."""
    blocker = tmp_path / "textfiles"
    blocker.write_text("not a folder\n")
    bench = Bench(tmp_path, metrics_textfile=str(blocker / "hal0.prom"))
    bench.slot("agent")
    bench.full()
    problem = bench.passes.progress.problems.get("metrics", "")
    assert "is not a folder" in problem, f"a failing metrics write is no problem: {problem!r}"
    blocker.unlink()
    bench.full()
    assert (blocker / "hal0.prom").is_file(), "the metrics file was not written once it could be"
    assert {} == bench.passes.progress.problems, "a fixed problem stays in the status"


def test_a_reload_to_another_state_dir_uses_that_dirs_demotions(tmp_path: Path) -> None:
    """SIGHUP with a new state_dir: the engine is rebuilt with that folder's demotion ledger (a
    slot demoted by us per the new ledger is restored); the same state_dir keeps the engine."""
    bench = Bench(tmp_path)
    slot = bench.slot("agent", "cpu")
    bench.full()
    assert "cpu" == device_of(slot), "setup: a cpu slot not demoted by us is kept"
    same = bench.make_settings(fight_limit=5)
    bench.passes.update_settings(same)
    bench.full()
    assert 1 == len(bench.built), "a reload with the same state_dir rebuilt the engine"
    other_state = tmp_path / "state2"
    other_state.mkdir()
    key = str(slot.absolute())
    ledger = {key: {"slot": "agent", "old": "gpu-vulkan", "at": 1.0}}
    (other_state / "demotions.json").write_text(json.dumps(ledger))
    bench.passes.update_settings(bench.make_settings(state_dir=str(other_state)))
    bench.full()
    assert 2 == len(bench.built), "a reload to another state_dir kept the old engine"
    assert other_state == bench.built[-1].state_dir
    assert "gpu-rocm" == device_of(slot), "the new state_dir's demotion record was ignored"


def test_a_reload_applies_a_new_demote_grace(tmp_path: Path) -> None:
    """SIGHUP shortening demote_grace takes effect at the next probe (no restart needed)."""
    bench = Bench(tmp_path, demote_grace=3600)
    slot = bench.slot("agent")
    bench.facts = UNUSABLE
    bench.full()
    assert "gpu-vulkan" == device_of(slot), "demoted inside a one-hour grace"
    bench.passes.update_settings(bench.make_settings(demote_grace=10))
    bench.clock.now += 11
    bench.probe()
    assert "cpu" == device_of(slot), "a reloaded, shorter demote_grace was ignored"


def test_a_reload_applies_a_new_fight_limit(tmp_path: Path) -> None:
    """SIGHUP lowering fight_limit: the next revert over the new limit ends the fight."""
    bench = Bench(tmp_path, fight_limit=50)
    slot = bench.slot("agent")
    bench.changed(slot)
    bench.passes.update_settings(bench.make_settings(fight_limit=1))
    for _ in range(2):
        bench.slot("agent")
        bench.changed(slot)
    assert SlotKey(str(slot.absolute())) in bench.passes.fights.hands_off, (
        "a reloaded fight_limit was ignored"
    )


@pytest.mark.parametrize("facts", [USABLE, UNUSABLE], ids=["usable", "unusable"])
def test_the_lane_metric_says_whether_rocm_is_usable(tmp_path: Path, facts: HostFacts) -> None:
    """rocm_lane_usable is true only on an AMD host whose lane is usable."""
    bench = Bench(tmp_path)
    bench.facts = facts
    bench.full()
    expected = facts.lane is LaneState.USABLE
    assert expected == bench.passes.progress.metrics.rocm_lane_usable


def test_a_reload_applies_a_new_fight_window(tmp_path: Path) -> None:
    """SIGHUP shortening fight_window: reverts older than the new window no longer count."""
    bench = Bench(tmp_path, fight_limit=1, fight_window=1000)
    slot = bench.slot("agent")
    bench.changed(slot)
    bench.clock.now += 10
    bench.slot("agent")
    bench.changed(slot)  # one revert: not more than the limit
    bench.passes.update_settings(bench.make_settings(fight_limit=1, fight_window=5))
    bench.clock.now += 10
    bench.slot("agent")
    bench.changed(slot)
    assert frozenset() == bench.passes.fights.hands_off, (
        "a reloaded fight_window was ignored: reverts outside it still counted"
    )


def test_a_hands_off_slot_is_no_longer_fingerprinted(tmp_path: Path) -> None:
    """Once the daemon stops fighting, the slot leaves the relabel memory: it is not hashed
    before every pass (it is never relabelled while hands off)."""
    bench = Bench(tmp_path, fight_limit=1)
    slot = bench.slot("agent")
    fight_until_hands_off(bench, slot, "agent")
    assert frozenset() == bench.passes.fights.tracked_keys(), (
        "a hands-off slot is still fingerprinted before each pass"
    )


def test_the_status_says_the_first_pass_is_pending_until_it_ran(tmp_path: Path) -> None:
    """Before the first pass STATUS= says "last pass pending" and status.json has no last pass;
    after it, how long ago it ran."""
    bench = Bench(tmp_path)
    bench.slot("agent")
    sources = publish.Sources(bench.passes, None, {}, bench.selfheal, 0.0)
    snapshot, line = publish.compose(sources, [], ready=False)
    assert line.endswith("last pass pending"), f"STATUS= before any pass: {line}"
    assert snapshot["last_pass"] is None
    bench.full()
    snapshot, line = publish.compose(sources, [], ready=True)
    assert "last pass 0s ago" in line, f"STATUS= after a pass: {line}"
    assert 1 == snapshot["last_pass"]["slots"]


def test_status_and_metrics_after_a_pass_say_what_happened(tmp_path: Path) -> None:
    """Per slot: status, name, device now and the reason; an unreadable file's message. Metrics:
    relabels by target, unreadable files, slots, the lane, the pass's time. The active slot
    relabelled is handed to the restarter under its name and unit token."""
    bench = Bench(tmp_path)
    agent = bench.slot("agent")
    kept = bench.slot("coder", "gpu-rocm")
    broken = bench.slots / "broken.toml"
    broken.write_text("name = [\n")
    bench.clock.now = 2000.0
    bench.full()
    relabelled, unchanged, unreadable = (bench.status(p) for p in (agent, kept, broken))
    assert relabelled is not None
    assert unchanged is not None
    assert unreadable is not None
    assert ("relabeled", "agent", "gpu-rocm") == (
        relabelled["status"],
        relabelled.get("name"),
        relabelled.get("device"),
    ), f"a relabelled slot's status entry: {relabelled}"
    assert relabelled.get("reason"), "the status does not say why the slot was relabelled"
    assert ("unchanged", "gpu-rocm") == (unchanged["status"], unchanged.get("device"))
    assert "message" not in unchanged
    assert ("unreadable", None) == (unreadable["status"], unreadable.get("name"))
    assert unreadable.get("message"), "an unreadable slot's status says not why"
    m = bench.passes.progress.metrics
    assert ({"gpu-rocm": 1}, 1, 3, {"fight": 0, "operator": 0}, True) == (
        {k: n for k, n in m.relabels.items() if n},
        m.unreadable_files,
        m.slots,
        m.hands_off,
        m.rocm_lane_usable,
    ), f"metrics after the pass: {m}"
    assert m.last_pass_timestamp > 0
    assert m.pass_duration == bench.passes.progress.last_duration
    assert 2000.0 == bench.passes.progress.last_full_pass
    bench.clock.now = 2100.0
    bench.changed(kept)
    assert 2000.0 == bench.passes.progress.last_full_pass, "a partial pass counted as full"
    requests = bench.passes._restarter.requests  # type: ignore[attr-defined]
    assert [("agent", "agent")] == [(r.name, r.token) for r in requests]


def test_the_metrics_folder_is_made_readable_for_node_exporter(tmp_path: Path) -> None:
    """A metrics folder that does not exist (its parent does) is created 0755 even under the
    unit's UMask=0077, and the textfile is written after every pass. Never its parents: see
    test_metrics_file."""
    import os
    import stat

    folder = tmp_path / "textfiles"
    bench = Bench(tmp_path, metrics_textfile=str(folder / "hal0.prom"))
    bench.slot("agent")
    old = os.umask(0o077)
    try:
        bench.full()
    finally:
        os.umask(old)
    assert 0o755 == stat.S_IMODE(folder.stat().st_mode), "node_exporter cannot read the folder"
    assert "hal0_reconciler_passes_total 1" in (folder / "hal0.prom").read_text()


def test_a_problem_is_logged_once_until_it_changes(tmp_path: Path) -> None:
    """The same problem on every pass is one warning; a different detail is a new one."""
    from structlog.testing import capture_logs

    bench = Bench(tmp_path)
    with capture_logs() as logs:
        bench.passes.problem("metrics", "cannot write x")
        bench.passes.problem("metrics", "cannot write x")
        bench.passes.problem("metrics", "cannot write y")
    details = [e["detail"] for e in logs if e["event"] == "daemon.problem"]
    assert ["cannot write x", "cannot write y"] == details
    assert {"metrics": "cannot write y"} == bench.passes.progress.problems


def test_a_lane_change_is_logged_at_its_weight_and_reconciles_everything(tmp_path: Path) -> None:
    """The lane going down is an info while its demotion grace runs (named ``unusable``, with
    the time left), a warning when the grace ends and demotions start; coming back an info;
    either way every slot is reconciled at once (a full pass). Only the four lane names."""
    from structlog.testing import capture_logs

    bench = Bench(tmp_path, demote_grace=30)
    bench.slot("agent", "gpu-rocm")
    bench.full()
    fulls = bench.passes.stats().full_passes
    with capture_logs() as logs:
        bench.facts = UNUSABLE
        bench.probe()
        bench.clock.now += 31
        bench.probe()
        bench.facts = USABLE
        bench.probe()
    changes = [
        (
            e["event"],
            e.get("old"),
            e.get("new", e.get("lane")),
            e["log_level"],
            e.get("demotion_in"),
        )
        for e in logs
        if e["event"].startswith("host.rocm_lane_")
    ]
    assert [
        ("host.rocm_lane_changed", "usable", "unusable", "info", "30s"),
        ("host.rocm_lane_demoting", None, "unusable", "warning", None),
        ("host.rocm_lane_changed", "unusable", "usable", "info", None),
    ] == changes, f"lane changes logged as {changes}"
    assert fulls + 3 == bench.passes.stats().full_passes, "a lane change did not reconcile all"


def test_the_first_probe_of_a_non_amd_host_logs_no_lane_change(tmp_path: Path) -> None:
    """Without amdgpu there is no lane to speak of: nothing is logged about it."""
    from structlog.testing import capture_logs

    bench = Bench(tmp_path)
    bench.facts = HostFacts(amd=False, lane=LaneState.UNUSABLE)
    with capture_logs() as logs:
        bench.full()
        bench.facts = HostFacts(amd=False, lane=LaneState.USABLE)
        bench.probe()
    assert [] == [e for e in logs if e["event"] == "host.rocm_lane_changed"]


def test_each_finished_batch_wakes_the_main_loop_and_clears_busy(tmp_path: Path) -> None:
    """After every batch (a pass or not) the main loop is woken to republish, and the worker is
    no longer seen busy (else the health rule would call an idle worker stuck)."""
    bench = Bench(tmp_path)
    slot = bench.slot("agent")
    busy_during: list[float | None] = []
    real = bench.passes._gather

    def gather(settings: Settings) -> HostFacts:
        busy_during.append(bench.passes.progress.busy_since)
        return real(settings)

    bench.passes._gather = gather
    bench.full()
    bench.changed(slot)
    bench.probe()
    assert 3 == bench.wakes, f"{bench.wakes} wakes for 3 batches"
    assert [1000.0, 1000.0] == busy_during, "the worker was not seen busy during a batch"
    assert bench.passes.progress.busy_since is None, "an idle worker is still seen busy"


def test_a_reload_in_the_same_state_dir_gives_the_engine_the_new_settings(tmp_path: Path) -> None:
    """SIGHUP pointing slots_dir at another folder (same state_dir): the next full pass
    reconciles the new folder (the engine kept its memory but took the settings)."""
    bench = Bench(tmp_path)
    bench.full()
    other = tmp_path / "other-slots"
    other.mkdir()
    (other / "agent.toml").write_text(slot_text("agent", "gpu-vulkan"))
    bench.passes.update_settings(bench.make_settings(slots_dir=str(other)))
    bench.full()
    assert 1 == len(bench.built), "setup: the same state_dir keeps the engine"
    assert "gpu-rocm" == device_of(other / "agent.toml"), "the reloaded slots_dir was ignored"


class _FlakyMonitor:
    """An aiter check that fails ``failures`` times, then finds a quiet tree."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def watch_paths(self) -> list[Path]:
        return []

    def check(self, *, heal: bool) -> monitor.MonitorReport:
        del heal
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("the tree cannot be read")
        return monitor.MonitorReport(())


def test_an_aiter_problem_leaves_the_status_once_the_check_works(tmp_path: Path) -> None:
    """A check that kept failing is a problem in the status; the first check that works again
    clears it (no restart needed)."""
    flaky = _FlakyMonitor(selfheal.FAILING_AFTER)
    bench = Bench(tmp_path)
    tree = AiterTree(package_dir=tmp_path / "aiter", target="gfx950:256")
    bench.settings = dataclasses.replace(bench.settings, aiter=AiterSettings(trees=(tree,)))
    bench.selfheal = selfheal.SelfHeal(bench.settings, factory=lambda _s: flaky, clock=bench.clock)
    bench.passes._aiter = bench.selfheal
    bench.passes.update_settings(bench.settings)
    for _ in range(selfheal.FAILING_AFTER):
        bench.full()
    assert "aiter" in bench.passes.progress.problems, "a failing aiter check is no problem"
    bench.full()
    assert "aiter" not in bench.passes.progress.problems, "a fixed aiter problem stays"


def test_a_fight_released_is_said(tmp_path: Path) -> None:
    """A hands-off slot whose file changed some other way is released, and the log says so."""
    from structlog.testing import capture_logs

    bench = Bench(tmp_path, fight_limit=1)
    slot = bench.slot("agent")
    fight_until_hands_off(bench, slot, "agent")
    bench.slot("agent", port=9999)  # an operator edit: neither version of the fight
    with capture_logs() as logs:
        bench.changed(slot)
    released = [e for e in logs if e["event"] == "slot.fight_released"]
    assert [str(slot.absolute())] == [e["path"] for e in released], "a release was not logged"
    assert "gpu-rocm" == device_of(slot), "the released slot was not relabelled"


def test_the_metrics_carry_restart_results_and_aiter_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The textfile counts restarts by result and shows the aiter self-heal's counters."""
    bench = Bench(tmp_path, metrics_textfile=str(tmp_path / "m" / "hal0.prom"))
    restarter = bench.passes._restarter
    restarter.results[units.RestartResult.RESTARTED] = 2  # type: ignore[attr-defined]
    restarter.results[units.RestartResult.INACTIVE] = 1  # type: ignore[attr-defined]
    monkeypatch.setattr(bench.selfheal, "counters", lambda: (3, 4, 5))
    bench.full()
    m = bench.passes.progress.metrics
    restarts = {k: n for k, n in m.restarts.items() if n}
    assert {"restarted": 2, "inactive": 1} == restarts, f"restart metrics: {m.restarts}"
    assert (3, 4, 5) == (m.aiter_modules_uncovered, m.aiter_heals, m.aiter_check_failures)
    text = (tmp_path / "m" / "hal0.prom").read_text()
    assert 'result="restarted"} 2' in text, "restarts missing from the metrics textfile"


def test_the_status_says_what_hal0_believes_and_when_it_cannot_be_understood(
    tmp_path: Path,
) -> None:
    """After a pass the status carries the installed hal0's facts (its version); a hal0 file
    that cannot be understood is a problem until it is fixed."""
    bench = Bench(tmp_path)
    bench.slot("agent")
    bench.full()
    assert (bench.passes.progress.hal0 or {}).get("version") == "1.1.0", (
        f"the status lacks hal0's facts: {bench.passes.progress.hal0}"
    )
    schema = next(bench.hal0.venv.rglob("config/schema.py"))
    good = schema.read_text()
    schema.write_text("IMAGES = (\n")  # cut short: not Python
    bench.full()
    assert "hal0" in bench.passes.progress.problems, "a garbled hal0 file is no problem"
    schema.write_text(good)
    bench.full()
    assert "hal0" not in bench.passes.progress.problems, "a fixed hal0 problem stays"


def test_a_big_batch_with_more_work_behind_it_gives_its_memory_back_after_that_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a burst the files still coming are not kept waiting for a collection: a big batch
    taken while other keys were dirty leaves the release to the first batch taken with none
    behind it, however small, even one that reads no slot."""
    from hal0_reconciler.daemon import memory

    released: list[int] = []
    monkeypatch.setattr(memory, "BIG_BATCH", 3)
    monkeypatch.setattr(memory, "release", lambda: released.append(1))
    bench = Bench(tmp_path)
    slots = [bench.slot(f"s{n}", "gpu-rocm", port=8100 + n) for n in range(5)]
    keys = frozenset(SlotKey(str(p.absolute())) for p in slots)
    bench.passes.process(Batch(keys, 5, behind=7))  # five new outcomes, more work waiting
    assert [] == released, "a big batch collected with more work waiting"
    bench.passes.process(Batch(frozenset({SlotKey(str(slots[0].absolute()))}), 1, behind=2))
    assert [] == released
    bench.passes.process(Batch(frozenset({Special.HOST_FACTS}), 1))  # nothing behind it
    assert [1] == released, "the burst's memory was not given back once it was over"
    bench.passes.process(Batch(frozenset({Special.HOST_FACTS}), 1))
    assert [1] == released, "given back twice"


def test_memory_is_given_back_after_a_batch_that_did_much_not_a_pass_that_only_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood's garbage is returned; a full pass that found every file as it was (the steady
    state at every resync) made none, and does not pay for a collection."""
    from hal0_reconciler.daemon import memory

    released: list[int] = []
    monkeypatch.setattr(memory, "BIG_BATCH", 3)
    monkeypatch.setattr(memory, "release", lambda: released.append(1))
    monkeypatch.setattr(seen, "SETTLED_NS", 0)
    bench = Bench(tmp_path)
    slots = [bench.slot(f"s{n}", "gpu-rocm", port=8100 + n) for n in range(5)]
    bench.full()  # five files read and judged
    assert 1 == len(released)
    bench.full()  # the same five, recognised: nothing new
    bench.changed(*slots)
    assert 1 == len(released)

    def relabel(paths: list[Path]) -> None:
        for path in paths:
            path.write_text(slot_text(path.stem, "gpu-vulkan", port=8200))
        bench.changed(*paths)

    relabel(slots[:2])  # two relabels: under the batch size
    assert 1 == len(released)
    relabel(slots[:3])  # three: a big batch
    assert 2 == len(released)
    for path in slots[:2]:
        path.unlink()
    bench.changed(*slots[:2])  # two gone
    assert 2 == len(released)
    for path in slots[2:]:
        path.unlink()
    bench.changed(*slots[2:])  # three gone
    assert 3 == len(released)


def test_a_lasting_write_failure_leaves_the_problems_once_the_write_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hal0_reconciler import fsio

    bench = Bench(tmp_path)
    slot = bench.slot("agent")
    real = fsio.begin_write

    def refused(*_args: object, **_kwargs: object) -> fsio.PendingWrite:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fsio, "begin_write", refused)
    bench.changed(slot)
    with bench.passes.lock:
        assert "Permission denied" in bench.passes.progress.problems.get("writes", "")
    monkeypatch.setattr(fsio, "begin_write", real)
    bench.changed(slot)
    with bench.passes.lock:
        assert "writes" not in bench.passes.progress.problems
    assert "gpu-rocm" == device_of(slot)


def test_hands_off_slots_are_counted_by_the_outcomes_hold(tmp_path: Path) -> None:
    """hands_off_slots counts by why each slot is held: the operator's hands_off and a fight
    given up are told apart by the outcome's hold, not by its message's wording."""
    bench = Bench(tmp_path, fight_limit=1, hands_off=["agent"])
    agent = bench.slot("agent")
    coder = bench.slot("coder")
    bench.full()
    assert "hands-off" == (bench.status(agent) or {}).get("status")
    fight_until_hands_off(bench, coder, "coder")
    bench.full()
    assert {"fight": 1, "operator": 1} == bench.passes.progress.metrics.hands_off
    assert "gpu-vulkan" == device_of(agent), "a hands_off slot was relabelled"
