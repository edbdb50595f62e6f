"""Benchmark: the restarter draining a flood of deferred restarts (not part of the test run).

    PYTHONPATH=src python tests/bench/bench_restarter.py [--sizes 1000,10000,20000]

A relabel flood (a resync after hal0 changed, a fight) asks to restart slots that were
restarted less than ``restart_min_interval`` ago, one after another: every request waits its
own turn, and the turns come spread over the next interval. What is measured is the queue
alone, in this process: ``n`` slots restarted one after another over the last ``INTERVAL``
(their restart times are set in the restarter: reaching that state through it would take
minutes), each asked again at once, and the CPU of this process (the submitter and the
restarter thread) from the first request until the last is applied, about ``INTERVAL`` later.
Unit states and the careful restart itself are stubbed (one ``systemctl is-active`` per batch;
the idle check, the restart and its confirmation through hal0's API per slot) and structlog drops its events. The baseline is the
queue it replaced: on every wake-up (each turn, at most every 10 ms) a scan and sort of every
pending request, for the whole interval (60 s by default; 10 s here).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import world as world_mod

sys.path.insert(0, str(world_mod.REPO / "src"))

import structlog

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host.restarts import flow as restart_flow
from hal0_reconciler.host.restarts import units

INTERVAL = 10.0


class ScanningRestarter(units.Restarter):
    """The queue before the heap: every wake-up scans and sorts all pending requests."""

    def _put(self, request: units.RestartRequest, due: float) -> None:
        """Pending at ``due``, no heap (``submit`` is the real one: it starts the workers)."""
        self._pending[request.token] = (due, request)
        self._cond.notify_all()

    def _next_due(
        self, worker: int
    ) -> tuple[list[units.RestartRequest], settings_mod.Settings] | units._Stop:
        with self._cond:
            while True:
                if self._stop is not None:
                    return self._stop
                now = time.monotonic()
                if now - self._pruned_at >= 1.0:
                    interval = self._settings.restart_min_interval
                    self._last = {t: at for t, at in self._last.items() if now - at < interval}
                    self._pruned_at = now
                due = sorted((d, t) for t, (d, _) in self._pending.items() if d <= now)
                if due:
                    requests = []
                    for _, token in due:
                        _, request = self._pending.pop(token)
                        self._running.add(token)
                        self._previous[token] = self._last.get(token)
                        self._last[token] = now
                        requests.append(request)
                    self._busy_since[worker] = now
                    return requests, self._settings
                soonest = min((d for d, _ in self._pending.values()), default=None)
                self._cond.wait(None if soonest is None else max(0.01, soonest - now))


@contextmanager
def _stubbed() -> Iterator[None]:
    """Every unit active, every restart accepted, no event rendered."""
    saved = (units.active_states, restart_flow.RestartFlow.step)

    def active_states(_s: settings_mod.Settings, tokens: Iterable[str]) -> dict[str, bool | None]:
        return dict.fromkeys(tokens, True)

    def step(
        _flow: restart_flow.RestartFlow, _r: units.RestartRequest, *, active: object, now: float
    ) -> units.RestartResult:
        _ = active, now
        return units.RestartResult.RESTARTED

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    units.active_states, restart_flow.RestartFlow.step = active_states, step  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        units.active_states, restart_flow.RestartFlow.step = saved  # type: ignore[method-assign]


def _wait(restarter: units.Restarter, total: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(restarter.results.values()) < total:
        if time.monotonic() > deadline:
            raise SystemExit(f"the restarter applied {sum(restarter.results.values())} of {total}")
        time.sleep(0.05)


def drain(n: int, *, scanning: bool = False, timeout: float = 900) -> tuple[float, float]:
    """(CPU, wall) seconds for a flood of ``n`` deferred restarts, submitted and drained."""
    settings = settings_mod.load(
        None, {"restart_min_interval": INTERVAL, "systemctl": "/bin/false"}
    )
    kind = ScanningRestarter if scanning else units.Restarter
    requests = [units.RestartRequest(name=f"s{i}", token=f"s{i}") for i in range(n)]
    restarter = kind(settings)
    now = time.monotonic()
    step = INTERVAL / n
    # the state a trickle of restarts over the last interval leaves: one restart time per slot
    restarter._last = {r.token: now - INTERVAL + (i + 1) * step for i, r in enumerate(requests)}
    with _stubbed(), restarter:
        cpu0, t0 = time.process_time(), time.perf_counter()
        for request in requests:  # each restarted in the last interval: each waits its turn
            restarter.submit(request)
        _wait(restarter, n, timeout)
        return time.process_time() - cpu0, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,20000")
    ap.add_argument("--baseline", action="store_true", help="also the scanning queue")
    opts = ap.parse_args()
    for n in (int(s) for s in opts.sizes.split(",")):
        cpu, wall = drain(n)
        line = f"{n:>6} pending: {cpu * 1000:9.1f} ms CPU ({cpu / n * 1e6:6.1f} us each)"
        if opts.baseline:
            base_cpu, _ = drain(n, scanning=True)
            line += f", scanning queue {base_cpu * 1000:9.1f} ms CPU"
        print(f"{line}, wall {wall:.2f} s (of which {INTERVAL} s waiting the interval)")


if __name__ == "__main__":
    main()
