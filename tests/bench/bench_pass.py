"""Slot-engine figures: one pass over N slot files, when every file is relabelled and when
nothing changes (the daemon's steady state at every resync). Prints figures, asserts nothing.

Run: ``python tests/bench/bench_pass.py [--slots 1000]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.model import HostFacts, LaneState
from hal0_reconciler.reconcile import Reconciler

SLOT = """# bench slot {n}: a comment the edit must keep
name = "s{n}"
type = "llm"
device = "gpu-vulkan"
profile = "coding"
port = {port}

[model]
context_size = 4096

[server]
extra_args = "--flash-attn on"
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        slots = Path(tmp, "slots")
        slots.mkdir()
        for n in range(args.slots):
            (slots / f"s{n}.toml").write_text(SLOT.format(n=n, port=9000 + n))
        settings = settings_mod.load(
            None,
            {
                "slots_dir": str(slots),
                "profiles_file": str(Path(tmp, "p.toml")),
                "state_dir": str(Path(tmp, "state")),
                # since issue 7 an unpinned gpu-vulkan slot is relabelled only when hal0's
                # default image is not Vulkan-capable: make it so, or nothing is relabelled
                "default_runner_image": "example.org/not-capable:1",
            },
        )
        facts = HostFacts(amd=True, lane=LaneState.USABLE)
        reconciler = Reconciler(settings)
        import structlog

        structlog.configure(
            logger_factory=structlog.ReturnLoggerFactory()
        )  # time the work, not the logs
        started = time.perf_counter()
        first = reconciler.reconcile(facts)
        relabel = time.perf_counter() - started
        if len(first.relabeled) != args.slots:
            raise SystemExit(f"{len(first.relabeled)} of {args.slots} relabelled: wrong world")
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            reconciler.reconcile(facts)
            runs.append(time.perf_counter() - started)
    n = args.slots
    print(f"slots: {n}")
    print(
        f"pass relabelling every slot (lock, edit, verify, fsync, rename each): {relabel * 1000:.0f} ms "
        f"({relabel / n * 1e6:.0f} us/slot, {len(first.relabeled)} relabelled)"
    )
    best = min(runs)
    print(
        f"pass with nothing to change (best of 5): {best * 1000:.1f} ms ({best / n * 1e6:.0f} us/slot)"
    )


if __name__ == "__main__":
    main()
