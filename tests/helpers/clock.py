"""A clock the test moves by hand: ``clock.now += 0.2``; passed where the code takes a
``monotonic`` source (the fight detector, the work queue, the self-heal back-off)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


class FakeTime(FakeClock):
    """``time`` for code that waits: ``sleep`` records the wait and moves the clock instead of
    sleeping; a wait that never gives up fails the test after ``max_sleeps``."""

    def __init__(self, now: float = 100.0, *, max_sleeps: int = 1000) -> None:
        super().__init__(now)
        self.sleeps: list[float] = []
        self._max_sleeps = max_sleeps

    def sleep(self, seconds: float) -> None:
        if len(self.sleeps) > self._max_sleeps:
            raise AssertionError("the wait never gives up")
        self.sleeps.append(seconds)
        self.now += seconds
