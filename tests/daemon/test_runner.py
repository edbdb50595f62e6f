"""The daemon loop in-process: real threads, real inotify, a real NOTIFY_SOCKET, real probe."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import reconcile
from hal0_reconciler.daemon import notify
from hal0_reconciler.daemon.watch import Trigger
from hal0_reconciler.model import LaneState
from hal0_reconciler.settings import Settings
from helpers import inotify_queue
from helpers.daemon_host import Host, device_of, drop_slot, running, wait_until


class WedgedReconciler(reconcile.Reconciler):
    """The real engine, held at the start of each pass while ``gate`` is closed."""

    def __init__(self, settings: Settings, gate: threading.Event) -> None:
        super().__init__(settings)
        self.gate = gate
        self.entered = threading.Event()

    def reconcile(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.entered.set()
        assert self.gate.wait(20), "the test never released the wedged pass"
        return super().reconcile(*args, **kwargs)


def test_ready_only_after_the_first_full_pass(host: Host, notify_socket) -> None:
    """READY=1 is not sent while the first pass is still running, and is sent once it is done."""
    drop_slot(host.slots, "agent")
    gate = threading.Event()
    engines: list[WedgedReconciler] = []

    def factory(s: Settings) -> WedgedReconciler:
        engines.append(WedgedReconciler(s, gate))
        return engines[-1]

    with running(host.settings(), reconciler_factory=factory):
        wait_until(lambda: engines and engines[0].entered.is_set(), what="first pass started")
        wait_until(lambda: any(m.startswith("STATUS=") for m in notify_socket.messages()))
        threading.Event().wait(0.5)  # the main loop ticks meanwhile
        assert [] == notify_socket.lifecycle()
        assert "gpu-vulkan" == device_of(host.slots / "agent.toml")
        gate.set()
        notify_socket.wait_for("READY=1")
        assert "gpu-rocm" == device_of(host.slots / "agent.toml")
    notify_socket.wait_for("STOPPING=1")  # sent; the socket's reader may not have it yet
    assert ["READY=1", "STOPPING=1"] == notify_socket.lifecycle()


def test_watchdog_pings_stop_while_a_pass_is_wedged(
    host: Host, notify_socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WATCHDOG=1 comes every WATCHDOG_USEC/2 while healthy and stops when the worker is stuck."""
    import os

    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    gate = threading.Event()
    gate.set()
    engines: list[WedgedReconciler] = []

    def factory(s: Settings) -> WedgedReconciler:
        engines.append(WedgedReconciler(s, gate))
        return engines[-1]

    with running(host.settings(stuck_after=0.5), reconciler_factory=factory):
        notify_socket.wait_for("READY=1")
        notify_socket.wait_for("WATCHDOG=1", count=3)
        gate.clear()
        engines[0].entered.clear()
        try:
            drop_slot(host.slots, "agent")
            wait_until(engines[0].entered.is_set, what="the wedged pass")
            # stuck_after passes: the main loop reports UNHEALTHY, and pings stop from then on
            # (one socket, in order: every ping sent before that STATUS= is already received)
            wait_until(
                lambda: any(
                    m.startswith("STATUS=") and "UNHEALTHY" in m for m in notify_socket.messages()
                ),
                what="the UNHEALTHY status",
            )
            before = notify_socket.messages().count("WATCHDOG=1")
            threading.Event().wait(1.0)  # 10 ping intervals
            after = notify_socket.messages().count("WATCHDOG=1")
            assert before == after
            statuses = [m for m in notify_socket.messages() if m.startswith("STATUS=")]
            assert "UNHEALTHY" in statuses[-1]
        finally:
            gate.set()
        notify_socket.wait_for("WATCHDOG=1", count=after + 2)


def test_a_slot_dropped_in_by_rename_is_relabelled(host: Host, notify_socket) -> None:
    """Temp file + rename onto agent.toml is a change of agent.toml: it is relabelled."""
    with running(host.settings()) as daemon, capture_logs() as logs:
        notify_socket.wait_for("READY=1")
        target = drop_slot(host.slots, "agent")
        wait_until(lambda: device_of(target) == "gpu-rocm", what="relabel")
        wait_until(lambda: daemon.stats().relabels == 1)
    events = [e["event"] for e in logs]
    assert 1 == events.count("slot.relabeled")
    assert [] == [p.name for p in host.slots.iterdir() if p.name.startswith(".")]


def test_a_burst_of_files_takes_far_fewer_passes_than_events(host: Host, notify_socket) -> None:
    """500 slot files saved by rename (1000+ events) are reconciled in a handful of passes."""
    with running(host.settings(settle_window=0.1, settle_cap=2.0)) as daemon:
        notify_socket.wait_for("READY=1")
        start = daemon.stats().passes
        for i in range(500):
            drop_slot(host.slots, f"s{i:03d}")
        wait_until(lambda: daemon.stats().relabels == 500, timeout=60, what="500 relabels")
        wait_until(lambda: daemon._queue.pending() == 0)
        passes = daemon.stats().passes - start
    assert all(device_of(p) == "gpu-rocm" for p in host.slots.glob("*.toml"))
    assert passes <= 25, f"{passes} passes for 500 files"


def test_an_inotify_overflow_triggers_a_full_pass(host: Host, notify_socket) -> None:
    """watchdog's overflow warning (events were lost) makes the daemon reconcile everything."""
    import logging

    with running(host.settings()) as daemon, capture_logs() as logs:
        notify_socket.wait_for("READY=1")
        fulls = daemon.stats().full_passes
        logging.getLogger("watchdog.observers.inotify_c").warning(
            "Inotify queue overflowed; filesystem events were lost"
        )
        wait_until(lambda: daemon.stats().full_passes > fulls, what="a full pass")
    reasons = [e.get("reason") for e in logs if e["event"] == "daemon.resync_started"]
    assert Trigger.OVERFLOW.value in reasons


def test_a_dead_observer_is_restarted_with_a_full_pass(
    host: Host, notify_socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception in a handler kills watchdog's thread; the daemon notices, rewatches, resyncs."""
    from hal0_reconciler.daemon import watch

    with running(host.settings()) as daemon, capture_logs() as logs:
        notify_socket.wait_for("READY=1")
        fulls = daemon.stats().full_passes
        original = watch._Handler.on_any_event
        calls = {"n": 0}

        def explode_once(self, event):  # type: ignore[no-untyped-def]
            if calls["n"] == 0:
                calls["n"] += 1
                raise RuntimeError("a bug in a handler")
            return original(self, event)

        monkeypatch.setattr(watch._Handler, "on_any_event", explode_once)
        monkeypatch.setattr(threading, "excepthook", lambda _args: None)
        drop_slot(host.slots, "first")
        wait_until(lambda: daemon.stats().full_passes > fulls, what="a full pass")
        wait_until(lambda: device_of(host.slots / "first.toml") == "gpu-rocm")
        # and the new observer works
        target = drop_slot(host.slots, "second")
        wait_until(lambda: device_of(target) == "gpu-rocm", what="relabel after rewatch")
    assert "daemon.observer_died" in [e["event"] for e in logs]


def test_demote_grace_then_demotion_then_restore(host: Host, notify_socket) -> None:
    """Unusable lane: kept within the grace, demoted to cpu after it, restored when usable again."""
    host.lane(usable=False)
    drop_slot(host.slots, "agent")
    slot = host.slots / "agent.toml"
    with running(host.settings(demote_grace=3)) as daemon, capture_logs() as logs:
        notify_socket.wait_for("READY=1")
        assert "gpu-vulkan" == device_of(slot)
        assert LaneState.UNSETTLED == daemon.stats().lane
        wait_until(lambda: device_of(slot) == "cpu", timeout=20, what="demotion after grace")
        host.lane(usable=True)  # a /dev event: re-probe, lane usable, restore our demotion
        wait_until(lambda: device_of(slot) == "gpu-rocm", timeout=20, what="restore")
        wait_until(lambda: any(e["event"] == "slot.restored_to_rocm" for e in logs))
    events = [e["event"] for e in logs]
    assert ["slot.demoted_to_cpu", "slot.restored_to_rocm"] == [
        e for e in events if e.startswith("slot.")
    ]
    changes = [
        (e["event"], e.get("old"), e.get("new", e.get("lane")))
        for e in logs
        if e["event"].startswith("host.rocm_lane_")
    ]
    assert [
        ("host.rocm_lane_demoting", None, "unusable"),
        ("host.rocm_lane_changed", "unusable", "usable"),
    ] == changes


def test_an_operator_edit_inside_the_grace_is_not_demoted(host: Host, notify_socket) -> None:
    """A lane that comes back within the grace never demotes anything."""
    host.lane(usable=False)
    drop_slot(host.slots, "agent")
    slot = host.slots / "agent.toml"
    with running(host.settings(demote_grace=30)) as daemon:
        notify_socket.wait_for("READY=1")
        threading.Event().wait(0.5)
        assert "gpu-vulkan" == device_of(slot)
        host.lane(usable=True)
        wait_until(lambda: device_of(slot) == "gpu-rocm", what="relabel to rocm")
        wait_until(lambda: daemon.stats().relabels >= 1, what="the pass noted")
        assert 1 == daemon.stats().relabels


def test_the_daemon_stops_fighting_another_writer(host: Host, notify_socket) -> None:
    """Another writer reverting the slot: after more than fight_limit reverts the daemon stops."""
    slot = drop_slot(host.slots, "agent")
    with running(host.settings(fight_limit=2)) as daemon, capture_logs() as logs:
        notify_socket.wait_for("READY=1")
        for n in range(1, 5):
            wait_until(lambda n=n: daemon.stats().relabels == n, what=f"relabel {n}")
            drop_slot(host.slots, "agent")  # the other writer puts vulkan back
        # relabel 4 answered the 3rd revert (> fight_limit): the 4th revert stands
        wait_until(lambda: any(e["event"] == "slot.fight_detected" for e in logs))
        threading.Event().wait(0.5)
        assert "gpu-vulkan" == device_of(slot)
        assert 4 == daemon.stats().relabels
        drop_slot(host.slots, "agent", port=9999)  # changed some other way: released
        wait_until(lambda: device_of(slot) == "gpu-rocm", what="released slot relabelled")
    fight = next(e for e in logs if e["event"] == "slot.fight_detected")
    assert ("agent", "error") == (fight["slot"], fight["log_level"])


def test_reload_on_request_sends_reloading_then_ready(
    host: Host, notify_socket, tmp_path: Path
) -> None:
    """A reload: RELOADING=1, new settings applied, READY=1 after the next full pass."""
    config = tmp_path / "reconciler.toml"
    config.write_text("fight_limit = 7\n")
    overrides = host.overrides()
    settings = host.settings()
    with running(settings, config_path=config, overrides=overrides) as daemon:
        notify_socket.wait_for("READY=1")
        fulls = daemon.stats().full_passes
        daemon.request_reload()
        notify_socket.wait_for("READY=1", count=2)
        assert daemon.stats().full_passes > fulls
        assert 7 == daemon._settings.fight_limit
    notify_socket.wait_for("STOPPING=1")  # sent; the socket's reader may not have it yet
    assert ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"] == notify_socket.lifecycle()


def test_null_notifier_says_nothing() -> None:
    """Outside systemd the null notifier is used and asks for no watchdog pings."""
    assert notify.NullNotifier().watchdog_interval() is None


def test_status_lists_slots_that_share_a_display_name(host: Host, notify_socket) -> None:
    """Two files whose slots carry the same name both show in status.json (keyed by file)."""
    import json

    first = drop_slot(host.slots, "twin")
    second = host.slots / "twin-copy.toml"
    second.write_text(first.read_text())
    settings = host.settings()
    with running(settings):
        notify_socket.wait_for("READY=1")
        status_file = settings.runtime_dir / "status.json"
        wait_until(
            lambda: status_file.exists() and len(json.loads(status_file.read_text())["slots"]) == 2,
            what="both slots in status.json",
        )
        slots = json.loads(status_file.read_text())["slots"]
    assert {"twin.toml", "twin-copy.toml"} == set(slots)
    assert {"twin"} == {s["name"] for s in slots.values()}


MAX_QUEUED = inotify_queue.MAX_QUEUED


def _can_shrink_inotify_queue() -> bool:
    try:
        MAX_QUEUED.write_text(MAX_QUEUED.read_text())
    except OSError:
        return False
    return True


@pytest.mark.skipif(
    not _can_shrink_inotify_queue(), reason="needs root and a writable fs.inotify.max_queued_events"
)
def test_a_real_inotify_overflow_triggers_a_full_pass(host: Host, notify_socket) -> None:
    """With a tiny kernel queue, a flood of events overflows it: the daemon notices and resyncs."""
    original = inotify_queue.size_to_restore()
    MAX_QUEUED.write_text("8\n")  # taken by inotify instances created from now on: the daemon's
    restored = False
    try:
        with running(host.settings()), capture_logs() as logs:
            notify_socket.wait_for("READY=1")  # the watches (and their tiny queues) are in place
            MAX_QUEUED.write_text(original)
            restored = True

            def resynced_for_overflow() -> bool:
                return any(
                    e["event"] == "daemon.resync_started"
                    and Trigger.OVERFLOW.value in str(e.get("reason"))
                    for e in list(logs)
                )

            for round_ in range(50):  # a flood of non-slot files: events only, no slot work
                for n in range(200):
                    (host.slots / f".flood-{round_}-{n}.tmp").write_bytes(b"x")
                if resynced_for_overflow():
                    break
            wait_until(resynced_for_overflow, what="a resync for the overflow")
    finally:
        if not restored:
            MAX_QUEUED.write_text(original)
