"""The restarter's queue: deferred restarts run once each, at their turn, in due order, however
many are pending and however often their due time moved (a real systemctl stand-in, a real
HTTP server for hal0's API)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import units
from helpers.daemon_host import wait_until
from helpers.fake_systemctl import FakeSystemctl, restarter_overrides
from helpers.hal0_api_server import Hal0Api


def _settings(
    tmp_path: Path, systemctl: FakeSystemctl, api: Hal0Api, interval: float
) -> settings_mod.Settings:
    return settings_mod.load(
        None, {**_overrides(tmp_path, systemctl, api), "restart_min_interval": interval}
    )


def _request(name: str) -> units.RestartRequest:
    return units.RestartRequest(name=name, token=name)


def _active(tmp_path: Path, names: list[str]) -> FakeSystemctl:
    return FakeSystemctl(tmp_path / "bin", {units.unit_name(n): "active" for n in names})


def _restarted(api: Hal0Api) -> list[str]:
    return [path.split("/")[3] for _, path, _ in api.requests]


def _slow(tmp_path: Path, systemctl: FakeSystemctl, seconds: float) -> Path:
    """A systemctl that answers as ``systemctl`` does, ``seconds`` late."""
    slow = tmp_path / "slow"
    slow.write_text(f'#!/bin/sh\nsleep {seconds}\nexec {systemctl.path} "$@"\n')
    slow.chmod(0o755)
    return slow


def test_a_flood_of_deferred_restarts_runs_each_unit_once_at_its_turn(tmp_path: Path) -> None:
    """100 slots restarted, then each relabelled twice more at once: every one waits out
    restart_min_interval (pending says so), then is restarted exactly once more."""
    names = [f"s{n:03d}" for n in range(100)]
    systemctl = _active(tmp_path, names)
    with (
        Hal0Api() as api,
        units.Restarter(_settings(tmp_path, systemctl, api, 12)) as restarter,
    ):  # 12 s: the interval counts from when the batch was taken, and 100 careful restarts
        # (health, state, load, restart each; some 30-50 ms apiece here) end well inside it
        for name in names:
            restarter.submit(_request(name))
        wait_until(lambda: len(api.requests) == 100, timeout=30, what="the first restarts")
        took = api.requested_at[-1] - api.requested_at[0]
        started = time.monotonic()
        for _ in range(2):
            for name in names:
                restarter.submit(_request(name))
        pending = restarter.pending()
        assert sorted(names) == sorted(pending)
        assert all(0 < wait <= 12 for wait in pending.values()), (took, pending)
        wait_until(lambda: len(api.requests) == 200, timeout=30, what="the second restarts")
        waited = time.monotonic() - started
        time.sleep(0.3)  # nothing more comes
        assert {} == restarter.pending()
    assert dict.fromkeys(names, 2) == dict(Counter(_restarted(api)))
    assert waited > 0.5, "the deferred restarts did not wait their turn"


def test_restarts_due_at_once_run_in_token_order_and_later_ones_in_due_order(
    tmp_path: Path,
) -> None:
    """A request is due when asked (so fresh ones run in the order asked); requests due at
    the same time (slots restarted in one batch, deferred together) run in token order;
    deferred ones run in the order their turns come, whatever the order they were asked in."""
    names = ["c-first", "b-second", "a-third"]
    systemctl = _active(tmp_path, names)
    with Hal0Api() as api:
        restarter = units.Restarter(_settings(tmp_path, systemctl, api, 1.2))
        for name in names:  # before the thread runs: one batch
            restarter.submit(_request(name))
        with restarter:
            wait_until(lambda: len(api.requests) == 3, timeout=20, what="the batch")
            assert names == _restarted(api)
            for name in ["b-second", "c-first", "a-third"]:  # restarted together: due together
                restarter.submit(_request(name))
            wait_until(lambda: len(api.requests) == 6, timeout=20, what="the second batch")
            assert sorted(names) == _restarted(api)[3:]
    with (
        Hal0Api() as api,
        units.Restarter(_settings(tmp_path, systemctl, api, 1.2)) as restarter,
    ):
        for name in names:  # one at a time: their turns come in this order
            restarter.submit(_request(name))
            wait_until(lambda n=name: n in _restarted(api), timeout=20, what=name)
            time.sleep(0.15)
        for name in reversed(names):
            restarter.submit(_request(name))
        wait_until(lambda: len(api.requests) == 6, timeout=20, what="the deferred restarts")
    assert names == _restarted(api)[3:]


def test_a_waiting_restart_follows_its_due_time_when_the_interval_changes(
    tmp_path: Path,
) -> None:
    """A reload that shortens restart_min_interval lets a waiting restart run at the new,
    earlier time, once; its due time may move many times while it waits (here 40 reloads for
    three slots, many more due times than slots) and the order of turns still holds."""
    names = ["c-first", "b-second", "a-third"]
    systemctl = _active(tmp_path, names)
    with Hal0Api() as api:
        settings = _settings(tmp_path, systemctl, api, 60)
        with units.Restarter(settings) as restarter:
            for name in names:
                restarter.submit(_request(name))
                wait_until(lambda n=name: n in _restarted(api), timeout=20, what=name)
                time.sleep(0.15)
            first_done = time.monotonic()
            for name in reversed(names):
                restarter.submit(_request(name))
            for step in range(40):
                restarter.update_settings(
                    settings_mod.load(
                        None,
                        {
                            **_overrides(tmp_path, systemctl, api),
                            "restart_min_interval": 60 + step,
                        },
                    )
                )
                for name in reversed(names):
                    restarter.submit(_request(name))
            assert sorted(names) == sorted(restarter.pending())
            soon = time.monotonic() - first_done + 0.8  # the first turn in 0.8 s
            restarter.update_settings(
                settings_mod.load(
                    None, {**_overrides(tmp_path, systemctl, api), "restart_min_interval": soon}
                )
            )
            for name in reversed(names):
                restarter.submit(_request(name))
            wait_until(lambda: len(api.requests) == 6, timeout=20, what="the restarts")
            time.sleep(0.3)
            assert {} == restarter.pending()
            assert restarter.is_alive(), "the stale turns left behind broke the restarter"
    assert names == _restarted(api)[3:]


def _overrides(tmp_path: Path, systemctl: FakeSystemctl, api: Hal0Api) -> dict[str, object]:
    return restarter_overrides(tmp_path, api.url, systemctl.path)


def test_a_deferred_restart_is_said_once_with_its_wait(tmp_path: Path) -> None:
    """unit.restart_deferred is logged when a slot first has to wait (slot, unit, seconds to
    wait), not again for more requests while it waits, and never for a restart due now."""
    systemctl = _active(tmp_path, ["agent", "coder"])
    with (
        Hal0Api() as api,
        units.Restarter(_settings(tmp_path, systemctl, api, 60)) as restarter,
        capture_logs() as logs,
    ):
        restarter.submit(_request("agent"))
        wait_until(lambda: len(api.requests) == 1, timeout=20, what="the restart")
        restarter.submit(_request("agent"))
        said = [e["event"] for e in logs].count("unit.restart_deferred")
        assert 1 == said, "the first request that must wait was not said"
        restarter.submit(_request("agent"))
        restarter.submit(_request("coder"))
        wait_until(lambda: len(api.requests) == 2, timeout=20, what="coder's restart")
    deferred = [e for e in logs if e["event"] == "unit.restart_deferred"]
    assert [("agent", units.unit_name("agent"), "info")] == [
        (e["slot"], e["unit"], e["log_level"]) for e in deferred
    ]
    assert 55 < deferred[0]["due_in"] <= 60
    assert round(deferred[0]["due_in"], 1) == deferred[0]["due_in"], "said to a tenth of a second"
    assert "restart_min_interval" in deferred[0]["reason"]
    assert ["agent", "coder"] == _restarted(api)


def test_a_restarter_left_running_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """A process that ends without stopping its restarter (a crash path) still ends: the
    restarter's thread never holds it."""
    import subprocess
    import sys

    code = (
        "from hal0_reconciler import settings\n"
        "from hal0_reconciler.host.restarts import units\n"
        "r = units.Restarter(settings.load(None, {}))\n"
        "r.start()\n"
        "print('started', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=15, check=False
    )
    assert (0, "started\n") == (done.returncode, done.stdout), done.stderr


def test_a_due_time_moved_many_times_leaves_a_bounded_queue(tmp_path: Path) -> None:
    """Slots whose turns move on every reload (here 1,000 times) keep a bounded queue, not one
    entry per move: stale entries are dropped once they outnumber the live ones, and the queue
    stays ordered by due time (its heap order holds)."""
    names = ["c-first", "b-second", "a-third"]
    systemctl = _active(tmp_path, names)
    with Hal0Api() as api:
        restarter = units.Restarter(_settings(tmp_path, systemctl, api, 60))
        now = time.monotonic()
        for n, name in enumerate(names):  # restarted one after another: c's turn comes first
            restarter._last[name] = now + n
        for step in range(1000):
            restarter.update_settings(
                settings_mod.load(
                    None,
                    {**_overrides(tmp_path, systemctl, api), "restart_min_interval": 60 + step},
                )
            )
            for name in reversed(names):  # asked latest turn first
                restarter.submit(_request(name))
        assert sorted(names) == sorted(restarter.pending())
        dues = restarter._dues
        assert len(dues) <= 2 * len(names) + 64 + 1
        assert all(
            dues[i] <= dues[child]
            for i in range(len(dues))
            for child in (2 * i + 1, 2 * i + 2)
            if child < len(dues)
        ), "the queue lost its order"


def test_the_restarter_says_whether_it_runs_and_how_long_it_has_been_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not running before start (stopping it then is harmless), running after, and joined by
    the time stop returns; idle it has been busy for 0 s, during a slow restart for as long as
    that restart took so far; a request due now waits 0 s."""
    systemctl = _active(tmp_path, ["agent"])
    with Hal0Api() as api:
        never_started = units.Restarter(_settings(tmp_path, systemctl, api, 60))
        never_started.stop()
        assert not never_started.is_alive()
    slow = _slow(tmp_path, systemctl, 1.5)
    with Hal0Api() as api:
        settings = settings_mod.load(
            None, {**_overrides(tmp_path, systemctl, api), "systemctl": str(slow)}
        )
        restarter = units.Restarter(settings)
        restarter.submit(_request("agent"))
        assert ({"agent": 0.0}, 0.0, False) == (
            restarter.pending(),
            restarter.busy_for(),
            restarter.is_alive(),
        )
        crashes: list[object] = []
        monkeypatch.setattr(threading, "excepthook", crashes.append)
        restarter.start()
        try:
            assert restarter.is_alive()
            time.sleep(0.8)  # the state query takes 1.5 s
            assert 0.5 < restarter.busy_for() < 1.5
            wait_until(lambda: api.requests, timeout=20, what="the restart")
            wait_until(lambda: restarter.busy_for() == 0.0, timeout=20, what="idle again")
        finally:
            restarter.stop()
        assert not restarter.is_alive(), "stop returned before the thread ended"
        assert [] == crashes, "the thread did not end cleanly"


def test_restart_times_older_than_the_interval_are_forgotten_and_recent_ones_kept(
    tmp_path: Path,
) -> None:
    """Once a second the restarter forgets restarts older than restart_min_interval (its
    memory stays bounded by the slots restarted lately), never a recent one: a slot restarted
    moments ago still waits its turn after that cleanup."""
    old = [f"old{n}" for n in range(20)]
    systemctl = _active(tmp_path, [*old, "x", "agent"])
    with Hal0Api() as api:
        with units.Restarter(_settings(tmp_path, systemctl, api, 0.3)) as restarter:
            for name in old:
                restarter.submit(_request(name))
            wait_until(lambda: len(api.requests) == 20, timeout=20, what="the old restarts")
            # its last turn ended (a cleanup may come with the next wait, not after the sleep)
            wait_until(lambda: restarter.busy_for() == 0.0, timeout=20, what="an idle restarter")
            time.sleep(1.2)  # over the interval, and over a second since the last cleanup
            restarter.submit(_request("x"))
            wait_until(lambda: len(api.requests) == 21, timeout=20, what="x's restart")
            assert ["x"] == list(restarter._last)
            # x's restart ended: stopped in flight, the next restarter would confirm it (and
            # count it against x's interval)
            wait_until(lambda: restarter.busy_for() == 0.0, timeout=20, what="x's restart ended")
        with units.Restarter(_settings(tmp_path, systemctl, api, 60)) as restarter:
            restarter.submit(_request("agent"))
            wait_until(lambda: len(api.requests) == 22, timeout=20, what="agent's restart")
            time.sleep(1.2)
            restarter.submit(_request("x"))  # a wake-up, a second after the last cleanup
            wait_until(lambda: len(api.requests) == 23, timeout=20, what="x's restart")
            restarter.submit(_request("agent"))
            assert 55 < restarter.pending().get("agent", 0) <= 60, restarter.pending()


def _interval(
    restarter: units.Restarter, tmp_path: Path, systemctl: FakeSystemctl, api: Hal0Api, s: float
) -> None:
    """A reload that sets restart_min_interval to ``s``."""
    overrides = {**_overrides(tmp_path, systemctl, api), "restart_min_interval": s}
    restarter.update_settings(settings_mod.load(None, overrides))


def test_a_turn_moved_later_is_not_taken_at_its_old_time(tmp_path: Path) -> None:
    """A waiting restart whose turn a reload moved later runs at the later time, not at the
    earlier one it had first."""
    systemctl = _active(tmp_path, ["agent"])
    with Hal0Api() as api, units.Restarter(_settings(tmp_path, systemctl, api, 60)) as r:
        r.submit(_request("agent"))
        wait_until(lambda: len(api.requests) == 1, timeout=20, what="the restart")
        restarted = r._last["agent"]  # when its turn was taken
        _interval(r, tmp_path, systemctl, api, 0.5)
        r.submit(_request("agent"))  # its turn: half a second after the restart
        _interval(r, tmp_path, systemctl, api, 2.5)
        r.submit(_request("agent"))  # moved: 2.5 s after the restart
        time.sleep(max(0.0, restarted + 1.5 - time.monotonic()))
        assert 1 == len(api.requests), "taken at its old turn"
        wait_until(lambda: len(api.requests) == 2, timeout=20, what="the later turn")
        assert time.monotonic() - restarted >= 2.5


def test_a_turn_that_found_the_slot_inactive_keeps_the_restart_before_it(tmp_path: Path) -> None:
    """A slot restarted, then taken again (a short interval) while inactive: nothing was done,
    so its last restart is still the first one, and with the interval back at 60 s the next
    request waits for that."""
    systemctl = _active(tmp_path, ["agent"])
    with Hal0Api() as api, units.Restarter(_settings(tmp_path, systemctl, api, 60)) as r:
        r.submit(_request("agent"))
        wait_until(lambda: len(api.requests) == 1, timeout=20, what="the restart")
        restarted_by = time.monotonic()  # the first turn was taken before this
        systemctl.set_states({})  # inactive now
        _interval(r, tmp_path, systemctl, api, 0.3)
        time.sleep(0.4)  # the skipped turn comes well after the restart
        r.submit(_request("agent"))
        wait_until(
            lambda: r.results[units.RestartResult.INACTIVE] == 1, timeout=20, what="the skip"
        )
        systemctl.set_states({units.unit_name("agent"): "active"})
        _interval(r, tmp_path, systemctl, api, 60)
        r.submit(_request("agent"))
        asked = time.monotonic()
        # counted from the restart, not from the skipped turn 0.4 s later
        assert 55 < r.pending().get("agent", 0) <= 60 - (asked - restarted_by), r.pending()
    assert 1 == len(api.requests)


def test_a_turn_moved_later_while_the_restarter_is_busy_is_not_taken_early(
    tmp_path: Path,
) -> None:
    """The restarter is busy with another slot while a waiting slot's turn moves later (two
    reloads), and its first turn passes meanwhile: it still runs at its later turn."""
    systemctl = _active(tmp_path, ["agent", "other"])
    slow = _slow(tmp_path, systemctl, 1)
    with Hal0Api() as api:
        settings = settings_mod.load(
            None, {**_overrides(tmp_path, systemctl, api), "systemctl": str(slow)}
        )
        with units.Restarter(settings) as r:
            r.submit(_request("agent"))
            wait_until(lambda: len(api.requests) == 1, timeout=20, what="agent's restart")
            restarted = r._last["agent"]  # when its turn was taken
            r.submit(_request("other"))  # busy for a second from now
            time.sleep(0.1)
            start = time.monotonic()
            for later in (0.3, 3.0):
                wanted = start - restarted + later
                r.update_settings(
                    settings_mod.load(
                        None,
                        {
                            **_overrides(tmp_path, systemctl, api),
                            "systemctl": str(slow),
                            "restart_min_interval": wanted,
                        },
                    )
                )
                r.submit(_request("agent"))
            wait_until(lambda: len(api.requests) == 3, timeout=20, what="agent's later turn")
            assert time.monotonic() - start >= 3.0, "agent taken at its old turn"
    assert ["agent", "other", "agent"] == _restarted(api)


def _workers(
    tmp_path: Path, systemctl: FakeSystemctl, api: Hal0Api, n: int
) -> settings_mod.Settings:
    """Settings with ``n`` restart workers."""
    overrides = {**_overrides(tmp_path, systemctl, api), "restart_concurrency": str(n)}
    return settings_mod.load(None, overrides)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_the_restarter_is_alive_while_its_workers_are_being_started(
    tmp_path: Path, concurrency: int
) -> None:
    """The first request starts the workers: while they are being started, the main loop's
    health look (from another thread) finds the restarter alive, not "the restarter thread
    died" (a moment's unhealthy, WATCHDOG paused, an error in the journal)."""
    systemctl = _active(tmp_path, ["agent"])
    with Hal0Api() as api:
        restarter = units.Restarter(_workers(tmp_path, systemctl, api, concurrency))
        seen: list[bool] = []
        for thread in restarter._threads:
            start = thread.start

            def looked_at_then_started(start: Callable[[], None] = start) -> None:
                seen.append(restarter.is_alive())
                start()

            thread.start = looked_at_then_started  # type: ignore[method-assign]
        restarter.start()
        try:
            restarter.submit(_request("agent"))
            wait_until(lambda: api.requests, timeout=20, what="the restart")
            assert [True] * concurrency == seen
            assert restarter.is_alive()
        finally:
            restarter.stop()


def test_requests_while_the_workers_are_being_started_start_each_once(tmp_path: Path) -> None:
    """A second request that comes while the first one is still starting the workers starts
    none of them again (a thread started twice raises in the caller: a relabel's restart lost)."""
    systemctl = _active(tmp_path, ["agent", "coder"])
    with Hal0Api() as api:
        restarter = units.Restarter(_workers(tmp_path, systemctl, api, 2))
        first = restarter._threads[0]
        start = first.start
        starting = threading.Event()
        go_on = threading.Event()

        def slow_start() -> None:
            starting.set()
            go_on.wait(10)
            start()

        first.start = slow_start  # type: ignore[method-assign]
        restarter.start()
        failures: list[BaseException] = []

        def submit_first() -> None:
            try:
                restarter.submit(_request("agent"))
            except BaseException as error:
                failures.append(error)

        submitter = threading.Thread(target=submit_first, daemon=True)
        submitter.start()
        try:
            assert starting.wait(10), "the first request did not start the workers"
            restarter.submit(_request("coder"))  # while the first worker is starting
            go_on.set()
            submitter.join(10)
            assert not submitter.is_alive()
            assert [] == failures
            wait_until(lambda: len(api.requests) == 2, timeout=20, what="both restarts")
            assert restarter.is_alive()
        finally:
            go_on.set()
            restarter.stop()


def test_a_restarter_whose_worker_ended_is_not_alive(tmp_path: Path) -> None:
    """Once its workers run, one that ends (here: told to stop by its queue alone) makes the
    restarter not alive: the daemon's health says "the restarter thread died"."""
    systemctl = _active(tmp_path, ["agent"])
    with Hal0Api() as api:
        restarter = units.Restarter(_settings(tmp_path, systemctl, api, 0))
        restarter._next_due = lambda _worker: units._Stop.TOKEN  # type: ignore[method-assign]
        restarter.start()
        try:
            assert restarter.is_alive()  # nothing asked yet: no worker, nothing died
            restarter.submit(_request("agent"))
            wait_until(lambda: not restarter._threads[0].is_alive(), timeout=20, what="the end")
            assert not restarter.is_alive()
        finally:
            restarter.stop()
