"""Fight detector and demote grace: the daemon's in-memory judgement, with a fake clock."""

from __future__ import annotations

from hal0_reconciler.daemon.fights import FightDetector, LaneTracker
from hal0_reconciler.model import HostFacts, LaneState, SlotKey
from helpers.clock import FakeClock
from helpers.hosts import ROCM_UNUSABLE as UNUSABLE
from helpers.hosts import ROCM_USABLE as USABLE

K = SlotKey("/s/agent.toml")


def _relabel(f: FightDetector, before: str = "theirs", after: str = "ours") -> int | None:
    return f.relabeled(K, old="gpu-vulkan", new="gpu-rocm", before=before, after=after)


def test_more_than_limit_reverts_make_the_slot_hands_off() -> None:
    """The first relabel is ours; the 4th revert by another writer (limit 3) ends the fight."""
    clock = FakeClock()
    f = FightDetector(limit=3, window=600, clock=clock)
    results = []
    for _ in range(5):
        results.append(_relabel(f))
        clock.now += 10
    assert [None, None, None, None, 4] == results
    assert frozenset({K}) == f.hands_off


def test_reverts_outside_the_window_do_not_count() -> None:
    """Relabels further apart than the window never add up to a fight."""
    clock = FakeClock()
    f = FightDetector(limit=3, window=600, clock=clock)
    for _ in range(10):
        assert _relabel(f) is None
        clock.now += 601
    assert frozenset() == f.hands_off


def test_a_different_version_of_the_file_releases_the_slot() -> None:
    """Hands off lasts while the file is one of the fought-over versions, no longer."""
    clock = FakeClock()
    f = FightDetector(limit=0, window=600, clock=clock)
    _relabel(f)
    assert 1 == _relabel(f)
    assert f.still_fighting(K, "theirs")
    assert f.still_fighting(K, "ours")
    assert not f.still_fighting(K, "an operator edit")


def test_an_unusable_lane_is_unsettled_for_the_grace() -> None:
    """Within demote_grace of continuous unusable probes the policy sees UNSETTLED, then UNUSABLE."""
    clock = FakeClock()
    lane = LaneTracker(grace=60, clock=clock)
    first = lane.observe(UNUSABLE)
    assert LaneState.UNSETTLED == first.facts.lane
    assert first.recheck_at is not None
    clock.now += 59
    assert LaneState.UNSETTLED == lane.observe(UNUSABLE).facts.lane
    clock.now += 1
    last = lane.observe(UNUSABLE)
    assert LaneState.UNUSABLE == last.facts.lane
    assert (LaneState.UNSETTLED, LaneState.UNUSABLE) == last.changed


def test_a_usable_probe_restarts_the_grace() -> None:
    """A usable probe in between means the lane was not unusable continuously."""
    clock = FakeClock()
    lane = LaneTracker(grace=60, clock=clock)
    lane.observe(UNUSABLE)
    clock.now += 50
    assert LaneState.USABLE == lane.observe(USABLE).facts.lane
    clock.now += 50
    assert LaneState.UNSETTLED == lane.observe(UNUSABLE).facts.lane


def test_a_non_amd_host_has_no_grace() -> None:
    """Without amdgpu nothing is decided on the lane: it is passed through as probed."""
    lane = LaneTracker(grace=60, clock=FakeClock())
    facts = HostFacts(amd=False, lane=LaneState.UNUSABLE)
    assert facts == lane.observe(facts).facts


def test_a_probe_that_could_not_run_passes_through_and_restarts_the_grace() -> None:
    """UNKNOWN reaches the policy as it is (no demotion), and a later unusable probe gets a new grace."""
    clock = FakeClock()
    lane = LaneTracker(grace=60, clock=clock)
    lane.observe(UNUSABLE)
    clock.now += 30
    assert LaneState.UNKNOWN == lane.observe(HostFacts(amd=True, lane=LaneState.UNKNOWN)).facts.lane
    clock.now += 600
    assert LaneState.UNSETTLED == lane.observe(UNUSABLE).facts.lane


def test_during_the_grace_the_lane_is_probed_every_5_s_and_at_its_end() -> None:
    """While the grace runs, the next probe is due 5 s later, or when the grace ends if sooner
    (a lane that stays down is demoted on time, not up to a recheck late)."""
    clock = FakeClock()
    lane = LaneTracker(grace=60, clock=clock)
    assert 1005.0 == lane.observe(UNUSABLE).recheck_at, "recheck not 5 s after the probe"
    clock.now = 1058.0
    assert 1060.0 == lane.observe(UNUSABLE).recheck_at, "recheck not at the end of the grace"
    clock.now = 1060.0
    assert lane.observe(UNUSABLE).recheck_at is None, "rechecks go on after the grace"
