"""A clock the test moves by hand: ``clock.now += 0.2``; passed where the code takes a
``monotonic`` source (the fight detector, the work queue, the self-heal back-off)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now
