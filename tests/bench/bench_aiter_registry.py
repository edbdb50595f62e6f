"""Benchmark: a cold vs warm `aiter plan` over a tree with big modules (not part of the test run).

    PYTHONPATH=src python tests/bench/bench_aiter_registry.py [--mb 200] [--tables DIR]

Builds two ~N MB modules with gcc (a padding array plus the registered names), a tree from the
real tables (the fixtures when present, else the suite's own, tests/aiter/tablegen.py), then times: a cold check (empty
cache: every module read once), a warm check in the same process, and a warm check in a new
process (cache from the state dir: stat calls only).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hal0_reconciler.aiter import monitor, survey
from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.tables import rows as tables
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("HAL0_SHARED_DIR", HERE.parents[1].parent / "shared"))
FIXTURES = SHARED / "fixtures/aiter/e4048607/aiter/configs"


def _own_tables() -> Path:
    """The suite's own tables (tests/aiter/tablegen.py), written once, when no fixture is there."""
    sys.path.insert(0, str(HERE.parent / "aiter"))
    import tablegen  # only when the shared fixtures are absent

    return tablegen.WRITTEN_CONFIGS


STEM = "a8w8_blockscale_bpreshuffle_tuned_gemm"


def build_so(out: Path, names: set[str], mb: int) -> None:
    src = out.with_suffix(".c")
    body = ",\n".join(f'"{n}"' for n in sorted(names))
    src.write_text(
        f"__attribute__((used)) const char *const names[] = {{{body}}};\n"
        f"__attribute__((used)) const char pad[{mb * 1024 * 1024}] = {{1}};\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--tables", type=Path, default=FIXTURES if FIXTURES.is_dir() else _own_tables())
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pkg = root / "aiter"
        shutil.copytree(opts.tables, pkg / "configs")
        jit = pkg / "jit"
        (jit / "build").mkdir(parents=True)
        settings = Settings(
            slots_dir=root / "slots",
            state_dir=root / "state",
            aiter=AiterSettings(trees=(AiterTree(package_dir=pkg, target="gfx950:256"),)),
        )
        mon = monitor.AiterMonitor(settings)
        rules = mon.routing()
        route = next(t for t in rules.tables if t.stem == STEM)
        need: dict[str, set[str]] = {}
        for path in [
            pkg / "configs" / f"{STEM}.csv",
            *(pkg / "configs" / "model_configs").glob(f"*{STEM}*.csv"),
        ]:
            if "untuned" in path.name:
                continue
            table = tables.parse_table(
                path.read_bytes(), route=route, targets=frozenset({tables.Target("gfx950", 256)})
            )
            for row in table.rows:
                need.setdefault(row.module, set()).add(row.name)
        t0 = time.perf_counter()
        for module, names in need.items():
            build_so(jit / f"{module}.so", names, opts.mb)
        sizes = sum((jit / f"{m}.so").stat().st_size for m in need) / 1e6
        print(
            f"built {len(need)} modules, {sizes:.0f} MB total, in {time.perf_counter() - t0:.1f} s"
        )

        def timed(label: str, m: monitor.AiterMonitor) -> None:
            t = time.perf_counter()
            report = m.check(heal=False)
            dt = time.perf_counter() - t
            verdicts = {mp.module: str(mp.status) for p in report.plans for mp in p.modules}
            print(
                f"{label:<34} {dt * 1000:9.1f} ms  module reads={m.surveyor.registry.reads} "
                f"table reads={m.surveyor.table_reads}  {verdicts}"
            )

        timed("cold (empty cache)", mon)
        timed("warm (same process)", mon)
        timed("warm (new process, cache on disk)", monitor.AiterMonitor(settings))
        _ = (routing, survey)


if __name__ == "__main__":
    main()
