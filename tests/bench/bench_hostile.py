"""Worst-case cost of one slot file: adversarial shapes just inside (and just over) the limits,
each reconciled on disk by the real engine (read, limits, parse, decide, lock, edit, re-parse,
atomic write). Prints the cost per shape and the worst; asserts nothing.

Run: ``python tests/bench/bench_hostile.py [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.model import HostFacts, LaneState
from hal0_reconciler.reconcile import Reconciler
from hal0_reconciler.slots import limits

HEAD = 'name = "w"\ntype = "llm"\ndevice = "gpu-vulkan"\n'
CAP = limits.DEFAULT.max_bytes
AGENT = Path(__file__).resolve().parents[1] / "data/slots/agent.toml"


def _fill(unit: str) -> str:
    return HEAD + unit * ((CAP - len(HEAD) - 8) // len(unit))


def shapes() -> dict[str, str]:
    items = limits.DEFAULT.max_items - 4
    depth = limits.DEFAULT.max_depth - 2
    return {
        "a real slot (tests/data/slots/agent.toml)": AGENT.read_text(),
        f"{items} keys": HEAD + "".join(f"k{i} = 1\n" for i in range(items)),
        f"{items} table headers": HEAD + "".join(f"[t{i}]\n" for i in range(items)),
        f"an array of {items} numbers": HEAD + "n = [" + "1," * items + "]\n",
        f"headers of {depth} dotted parts": HEAD
        + "".join("[" + ".".join(["a"] * depth) + f".b{i}]\n" for i in range(CAP // 70)),
        f"inline tables {depth} deep": HEAD + "[s]\nv = " + "{a = " * depth + "1" + "}" * depth,
        "blank lines to the size cap": _fill("\n"),
        "comment lines to the size cap": _fill("#\n"),
        "CRLF lines to the size cap": _fill("\r\n"),
        "one string to the size cap": HEAD + 'x = "' + "a" * (CAP - 80) + '"\n',
        "escapes to the size cap": HEAD + 'x = "' + "\\n" * ((CAP - 80) // 2) + '"\n',
        "over the size cap (refused)": HEAD + 'x = "' + "a" * CAP + '"\n',
        "a 5,000-digit number (refused)": HEAD + "port = " + "9" * 5000 + "\n",
        "arrays 2,000 deep (refused)": HEAD + "v = " + "[" * 2000 + "]" * 2000 + "\n",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    facts = HostFacts(amd=True, lane=LaneState.USABLE)
    worst = (0.0, "")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        slots = root / "slots"
        slots.mkdir()
        settings = settings_mod.load(
            None, {"slots_dir": str(slots), "state_dir": str(root / "state"), "lock_timeout": 2}
        )
        engine = Reconciler(settings)
        for name, text in shapes().items():
            path = slots / "w.toml"
            best = float("inf")
            status = ""
            for _ in range(args.repeat):
                path.write_text(text)
                started = time.perf_counter()
                report = engine.reconcile(facts, [path])
                best = min(best, time.perf_counter() - started)
                status = report.outcomes[0].status.value
            worst = max(worst, (best, name))
            size = len(text.encode())
            print(f"{name:36} {size:7} B  {best * 1000:8.1f} ms  {status}")
    print(f"\nworst case per file: {worst[0] * 1000:.0f} ms ({worst[1]})")


if __name__ == "__main__":
    main()
