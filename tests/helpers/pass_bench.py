"""One :class:`~hal0_reconciler.daemon.passes.Passes` on temp host paths, driven batch by batch
on the real engine with a fake clock and fake host facts (each ``process`` call is one pass, as
the worker thread runs it; the aiter check it asks for is waited for, its thread ended)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.daemon import passes, runner, selfheal
from hal0_reconciler.daemon.workqueue import Batch, Special, WorkKey
from hal0_reconciler.host.restarts import units
from hal0_reconciler.model import SlotKey
from hal0_reconciler.settings import Settings
from helpers.clock import FakeClock
from helpers.daemon_host import slot_text
from helpers.hal0_tree import Hal0Tree
from helpers.hosts import ROCM_UNUSABLE, ROCM_USABLE

USABLE, UNUSABLE = ROCM_USABLE, ROCM_UNUSABLE  # the names the pass tests import


class FakeRestarter:
    def __init__(self) -> None:
        self.requests: list[units.RestartRequest] = []
        self.results: Counter[units.RestartResult] = Counter()

    def submit(self, request: units.RestartRequest) -> None:
        self.requests.append(request)

    def report(self) -> dict[str, object]:
        return {"waiting": {}, "failed": {}, "busy_past_bound": [], "api_unavailable": None}


class Bench:
    """One Passes object on temp host paths; ``facts`` is what the next probe finds."""

    def __init__(self, tmp_path: Path, **overrides: object) -> None:
        self.root = tmp_path
        self.slots = tmp_path / "slots"
        self.slots.mkdir()
        self.hal0 = Hal0Tree(tmp_path).install("ade07ba")  # unpinned gpu-vulkan is not capable
        self.facts = USABLE
        self.clock = FakeClock()
        self.built: list[Settings] = []
        self.wakes = 0
        self.settings = self.make_settings(**overrides)
        self.selfheal = selfheal.SelfHeal(self.settings, factory=no_aiter, clock=self.clock)
        self.passes = passes.Passes(
            self.settings,
            clock=self.clock,
            gather=lambda _s: self.facts,
            reconciler_factory=self._factory,
            restarter=FakeRestarter(),  # type: ignore[arg-type]
            selfheal_=self.selfheal,
            wake=self._wake,
        )

    def _wake(self) -> None:
        self.wakes += 1

    def make_settings(self, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "slots_dir": str(self.slots),
            "state_dir": str(self.root / "state"),
            "runtime_dir": str(self.root / "run"),
            "profiles_file": str(self.root / "profiles.toml"),
            "lock_timeout": 2.0,
            "demote_grace": 0,
            **self.hal0.settings(),
        }
        values.update(overrides)
        return settings_mod.load(None, values)

    def _factory(self, settings: Settings):  # type: ignore[no-untyped-def]
        self.built.append(settings)
        return runner.default_reconciler(settings)

    def slot(self, name: str, device: str = "gpu-vulkan", *, port: int = 8081) -> Path:
        path = self.slots / f"{name}.toml"
        path.write_text(slot_text(name, device, port=port))
        return path

    def process(self, batch: Batch) -> None:
        """One pass, then the aiter check it asked for (on its own thread) to its end."""
        self.passes.process(batch)
        assert self.passes.aiter_worker.drain(60), "the aiter check did not end in 60 s"

    def full(self) -> None:
        self.process(Batch(frozenset({Special.EVERYTHING}), 1))

    def changed(self, *paths: Path) -> None:
        keys: frozenset[WorkKey] = frozenset(SlotKey(str(p.absolute())) for p in paths)
        self.process(Batch(keys, 1))

    def probe(self) -> None:
        self.process(Batch(frozenset({Special.HOST_FACTS}), 1))

    def status(self, path: Path) -> dict[str, object] | None:
        with self.passes.lock:
            return self.passes.progress.slots.get(SlotKey(str(path.absolute())))


def no_aiter(_settings: Settings) -> selfheal.AiterCheck:
    raise AssertionError("no aiter tree is configured: the aiter check must not be built")


def fight_until_hands_off(bench: Bench, slot: Path, name: str) -> None:
    """Another writer reverts the slot after each relabel until the daemon stops fighting."""
    bench.changed(slot)
    for _ in range(bench.settings.fight_limit + 1):
        bench.slot(name)  # reverted to gpu-vulkan
        bench.changed(slot)
    assert SlotKey(str(slot.absolute())) in bench.passes.fights.hands_off, (
        "setup: the slot should be hands off after more than fight_limit reverts"
    )
