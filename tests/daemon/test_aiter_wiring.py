"""The aiter self-heal inside the daemon: real inotify on a temp aiter tree, gcc-built modules."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import aiter_support  # on sys.path via conftest.py: the aiter suite's helpers and fixtures
import pytest
from aiter_support import BPS, BPS_CK, BPS_CKTILE, GFX950
from structlog.testing import capture_logs

from hal0_reconciler.aiter import monitor
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.daemon import selfheal, status
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers.clock import FakeClock
from helpers.daemon_host import Host, device_of, drop_slot, running, slot_text, wait_until

SMALL_TABLES = (f"{BPS}.csv", f"model_configs/{BPS}_glm5.2.csv")
HEADER = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
NEW_KERNEL = "a8w8_blockscale_bpreshuffle_1x128x128_999x999_hal0_test_only_v1"


@pytest.fixture
def tree(tmp_path: Path, so_builder: aiter_support.SoBuilder, rules: Any) -> aiter_support.Tree:
    """Two small tables copied from the aiter suite, both modules built to cover them."""
    configs = tmp_path / "configs-src"
    for name in SMALL_TABLES:
        (configs / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(aiter_support.DATA_CONFIGS / name, configs / name)
    built = aiter_support.Tree(tmp_path / "aiter", configs)
    for module, names in aiter_support.names_for(built.configs, rules, GFX950).items():
        built.install(module, so_builder.build(names))
    return built


def _with_aiter(settings: Settings, tree: aiter_support.Tree, **options: Any) -> Settings:
    aiter_tree = AiterTree(package_dir=tree.package, target="gfx950:256")
    options.setdefault("settle_window", 0.3)
    return dataclasses.replace(settings, aiter=AiterSettings(trees=(aiter_tree,), **options))


def _aiter_status(settings: Settings) -> dict[str, Any]:
    try:
        snapshot = json.loads(status.status_path(settings).read_text())
    except (OSError, ValueError):
        return {}
    return dict(snapshot.get("aiter") or {})


def _quarantined(tree: aiter_support.Tree) -> list[list[str]]:
    return [sorted(p.name for p in q.iterdir()) for q in heal.list_quarantines(tree.jit)]


def _drop_overlay(tree: aiter_support.Tree) -> None:
    """An operator drops a model overlay naming a ck kernel the built module lacks (by rename)."""
    row = f"gfx950,256,8,7168,2048,ck,1,0,5.0,{NEW_KERNEL},1.0,1.0,0.0"
    overlays = tree.configs / "model_configs"
    tmp = overlays / ".new-overlay.tmp"
    tmp.write_text(f"{HEADER}\n{row}\n")
    tmp.rename(overlays / f"{BPS}_hal0test.csv")


def test_an_overlay_naming_a_missing_kernel_quarantines_exactly_that_module(
    host: Host, notify_socket: Any, tree: aiter_support.Tree, tmp_path: Path
) -> None:
    """inotify on model_configs/ → aiter key → check → only the ck module is quarantined."""
    metrics_file = tmp_path / "metrics/hal0.prom"
    settings = _with_aiter(host.settings(metrics_textfile=str(metrics_file)), tree)
    with capture_logs() as logs, running(settings):
        notify_socket.wait_for("READY=1")
        wait_until(lambda: _aiter_status(settings).get("checks", 0) >= 1, what="first check")
        assert {"covered": 2} == _aiter_status(settings)["verdicts"]
        _drop_overlay(tree)
        wait_until(lambda: _quarantined(tree), timeout=20, what="the quarantine")
        wait_until(lambda: _aiter_status(settings).get("heals") == 1, what="status updated")
        aiter_status = _aiter_status(settings)
        # the textfile is written after the check, apart from status.json: wait for it too
        wait_until(
            lambda: "hal0_reconciler_aiter_heals_total 1" in metrics_file.read_text().splitlines(),
            what="the heal in the metrics textfile",
        )
        metrics_text = metrics_file.read_text()
    assert [["build", "manifest.json", f"{BPS_CK}.so"]] == _quarantined(tree)
    assert (False, True) == (
        (tree.jit / f"{BPS_CK}.so").exists(),
        (tree.jit / f"{BPS_CKTILE}.so").exists(),
    )
    assert ["aiter.module_quarantined"] == [
        e["event"] for e in logs if e["event"].endswith("quarantined")
    ]
    assert {"covered": 1, "not-built": 1} == aiter_status["verdicts"]
    assert (False, []) == (aiter_status["heal_pending"], aiter_status["not_converging"])
    assert "hal0_reconciler_aiter_heals_total 1" in metrics_text.splitlines()


def test_an_unchanged_tree_is_not_healed_again_on_resync(
    host: Host, notify_socket: Any, tree: aiter_support.Tree
) -> None:
    """After one heal, resyncs do not heal again, nor does a rebuild that still lacks the kernel."""
    settings = _with_aiter(host.settings(resync_interval=0.5), tree)
    stale_ck = tree.jit / f"{BPS_CK}.so"
    stale_copy = tree.root / "stale-ck.so"
    shutil.copyfile(stale_ck, stale_copy)
    with running(settings) as daemon:
        notify_socket.wait_for("READY=1")
        _drop_overlay(tree)
        wait_until(lambda: _quarantined(tree), timeout=20, what="the first heal")
        checks = _aiter_status(settings).get("checks", 0)
        fulls = daemon.stats().full_passes
        wait_until(lambda: daemon.stats().full_passes >= fulls + 2, timeout=30, what="resyncs")
        wait_until(lambda: _aiter_status(settings).get("checks", 0) >= checks + 2, timeout=30)
        assert 1 == len(_quarantined(tree))
        tree.install(BPS_CK, stale_copy)  # "aiter rebuilt it" from the same tables: still short
        wait_until(
            lambda: _aiter_status(settings).get("not_converging"), timeout=20, what="the guard"
        )
        fulls = daemon.stats().full_passes
        wait_until(lambda: daemon.stats().full_passes >= fulls + 2, timeout=30, what="more resyncs")
        aiter_status = _aiter_status(settings)
    assert 1 == len(_quarantined(tree))
    assert (1, True) == (aiter_status["heals"], stale_ck.exists())
    assert [f"base:{BPS_CK}"] == aiter_status["not_converging"]


def test_a_slot_env_pinning_other_tables_is_checked_on_its_save(
    host: Host, notify_socket: Any, tree: aiter_support.Tree
) -> None:
    """A slot saved with [server].env pinning a table the module lacks → that module is healed."""
    pinned = tree.package / "pinned.csv"  # beneath the tree: a slot path outside is not read
    pinned.write_text(f"{HEADER}\ngfx950,256,8,7168,2048,ck,1,0,5.0,{NEW_KERNEL},1.0,1.0,0.0\n")
    settings = _with_aiter(host.settings(), tree)
    with running(settings):
        notify_socket.wait_for("READY=1")
        wait_until(lambda: _aiter_status(settings).get("checks", 0) >= 1, what="first check")
        tmp = host.slots / ".pinned.toml.tmp"
        tmp.write_text(
            slot_text("pinned")
            + f'\n[server]\nenv = {{ AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE = "{pinned}" }}\n'
        )
        tmp.rename(host.slots / "pinned.toml")
        wait_until(lambda: _quarantined(tree), timeout=20, what="the quarantine")
    assert [["build", "manifest.json", f"{BPS_CK}.so"]] == _quarantined(tree)


def test_a_slot_whose_boot_dies_makes_the_daemon_degraded_with_a_metric(
    host: Host, notify_socket: Any, tree: aiter_support.Tree, tmp_path: Path
) -> None:
    """A slot saved with a whitespace-only AITER_CONFIG_* value (its boot dies at the first
    lookup): the status says degraded with the slot's environment and the reason, the metrics
    textfile counts one fatal boot, and nothing is quarantined."""
    metrics_file = tmp_path / "metrics/hal0.prom"
    settings = _with_aiter(host.settings(metrics_textfile=str(metrics_file)), tree)
    with running(settings):
        notify_socket.wait_for("READY=1")
        wait_until(lambda: _aiter_status(settings).get("checks", 0) >= 1, what="first check")
        tmp = host.slots / ".dies.toml.tmp"
        tmp.write_text(
            slot_text("dies")
            + '\n[server]\nenv = { AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE = " " }\n'
        )
        tmp.rename(host.slots / "dies.toml")
        wait_until(lambda: _aiter_status(settings).get("fatal_boots"), timeout=20, what="fatal")
        wait_until(
            lambda: "hal0_reconciler_aiter_fatal_boots 1" in metrics_file.read_text().splitlines(),
            timeout=20,
            what="the fatal boot in the metrics textfile",
        )
        wait_until(
            lambda: (
                json.loads(status.status_path(settings).read_text()).get("health") == "degraded"
            ),
            timeout=20,
            what="degraded",
        )
        snapshot = json.loads(status.status_path(settings).read_text())
    (fatal,) = snapshot["aiter"]["fatal_boots"]
    assert fatal.startswith("slot:dies: AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE")
    assert any("a boot dies" in p and "whitespace only" in p for p in snapshot["problems"])
    assert [] == _quarantined(tree)


class _ExplodingMonitor:
    """A monitor whose every check raises (a bug in it, or a tree it cannot cope with)."""

    def __init__(self, watched: Path) -> None:
        self.watched = watched
        self.calls = 0

    def watch_paths(self) -> list[Path]:
        return [self.watched]

    def check(self, *, heal: bool) -> monitor.MonitorReport:
        self.calls += 1
        raise RuntimeError(f"a bug in the monitor (heal={heal})")


def test_a_failing_aiter_check_does_not_stop_slot_relabels(
    host: Host, notify_socket: Any, tree: aiter_support.Tree
) -> None:
    """Each failed check is one event; slots are still relabelled; repeated failures show up,
    and the daemon says it is degraded (alive, but a check cannot run)."""
    exploding = _ExplodingMonitor(tree.configs)
    settings = _with_aiter(host.settings(), tree, settle_window=0.05)
    with capture_logs() as logs, running(settings, aiter_factory=lambda _s: exploding):
        notify_socket.wait_for("READY=1")
        for name in ("one", "two", "three"):
            calls = exploding.calls
            slot = drop_slot(host.slots, name)
            wait_until(lambda slot=slot: device_of(slot) == "gpu-rocm", what=f"relabel {name}")
            # a whole file is relabelled at once: its aiter check follows its own window
            wait_until(lambda calls=calls: exploding.calls > calls, what=f"the check for {name}")
        wait_until(lambda: exploding.calls >= selfheal.FAILING_AFTER, what="repeated failures")
        snapshot = wait_until(
            lambda: (
                (s := json.loads(status.status_path(settings).read_text()))
                and any("aiter check failed" in p for p in s["problems"])
                and s
            ),
            what="the problem in status.json",
        )
    failed = [e for e in logs if e["event"] == "aiter.check_failed"]
    assert exploding.calls == len(failed)
    assert ("error", False, "degraded") == (
        failed[0]["log_level"],
        snapshot["healthy"],
        snapshot["health"],
    )
    assert 3 == sum(1 for e in logs if e["event"] == "slot.relabeled")


class _BusyMonitor:
    """Reports a build in progress for the first ``busy`` checks, then a quiet tree."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.calls = 0

    def watch_paths(self) -> list[Path]:
        return []

    def check(self, *, heal: bool) -> monitor.MonitorReport:
        self.calls += 1
        if self.calls > self.busy:
            return monitor.MonitorReport(())
        refused = monitor.HealResult(Path("/jit"), ("m",), refused=("compiler pid 1",))
        return monitor.MonitorReport((), heals=(refused,) if heal else ())


def test_a_running_build_asks_for_a_retry_after_a_bounded_back_off(
    tree: aiter_support.Tree,
) -> None:
    """retry_soon: the next check is asked for after 5, 10, 20, 40, 60, 60 s; then no more."""
    busy = _BusyMonitor(busy=6)
    clock = FakeClock(50.0)
    heal_state = selfheal.SelfHeal(
        _with_aiter(Settings(), tree), factory=lambda _s: busy, clock=clock
    )
    delays: list[float | None] = []
    for _ in range(7):
        assert heal_state.check()
        retry_at = heal_state.retry_at()
        delays.append(None if retry_at is None else retry_at - clock.now)
    assert [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, None] == delays


def test_the_daemon_checks_again_when_a_build_was_running(
    host: Host, notify_socket: Any, tree: aiter_support.Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused heal re-queues the aiter key by itself (no file event needed)."""
    monkeypatch.setattr(selfheal, "RETRY_FIRST", 0.2)
    busy = _BusyMonitor(busy=2)
    with running(_with_aiter(host.settings(), tree), aiter_factory=lambda _s: busy):
        notify_socket.wait_for("READY=1")
        wait_until(lambda: busy.calls >= 3, what="two retries")


def test_the_daemon_settles_the_aiter_key_with_its_own_window(tree: aiter_support.Tree) -> None:
    """The runner's queue holds an aiter event for [aiter].settle_window, not the slot window."""
    from hal0_reconciler.daemon import notify, runner, workqueue

    clock = FakeClock(50.0)
    settings = dataclasses.replace(
        _with_aiter(Settings(), tree, settle_window=2.5), settle_window=0.1
    )
    daemon = runner.Runner(settings, notifier=notify.NullNotifier(), clock=clock)
    try:
        daemon._queue.add(workqueue.Special.AITER)
        assert 2.5 == daemon._queue.ready_at() - clock.now
    finally:
        daemon.close()


def test_a_row_no_rebuild_fixes_is_reported_for_a_person_and_never_healed(
    host: Host, notify_socket: Any, tree: aiter_support.Tree
) -> None:
    """An overlay with an empty ck kernelName: status.json lists the module under fix_tables,
    and nothing is quarantined (no rebuild fixes such a row)."""
    settings = _with_aiter(host.settings(), tree)
    with running(settings):
        notify_socket.wait_for("READY=1")
        wait_until(lambda: _aiter_status(settings).get("checks", 0) >= 1, what="first check")
        overlays = tree.configs / "model_configs"
        tmp = overlays / ".broken.tmp"
        tmp.write_text(f"{HEADER}\ngfx950,256,8,7168,2048,ck,1,0,5.0,,1.0,1.0,0.0\n")
        tmp.rename(overlays / f"{BPS}_broken.csv")
        wait_until(
            lambda: _aiter_status(settings).get("fix_tables"), timeout=20, what="the broken row"
        )
        aiter_status = _aiter_status(settings)
    assert [f"base:{BPS_CK}"] == aiter_status["fix_tables"]
    assert ([], 0) == (_quarantined(tree), aiter_status["heals"])
