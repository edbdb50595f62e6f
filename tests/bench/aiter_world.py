"""An aiter tree for the benchmarks: the real tables (the shared fixtures when present, else the
project's test data), and every module their rows route to, built with gcc: the registered
names plus a padding array of ``mb`` MB (a compiled module is mostly code and data, few names).

``check_in_child`` times ``AiterMonitor.check`` in a fresh interpreter (the on-disk caches in
the state dir are all it has); ``upstream_preflight`` is the baseline aiter's own preflight
stands for: for every table, re-read every module it routes to and search each name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

import world as world_mod

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("HAL0_SHARED_DIR", HERE.parents[1].parent / "shared"))
FIXTURES = SHARED / "fixtures/aiter/e4048607/aiter/configs"


def _own_tables() -> Path:
    """The suite's own tables (tests/aiter/tablegen.py), written once, when no fixture is there."""
    sys.path.insert(0, str(HERE.parent / "aiter"))
    import tablegen  # only when the shared fixtures are absent

    return tablegen.WRITTEN_CONFIGS


_CHILD = """
import sys, time
from pathlib import Path
from typing import Self
from hal0_reconciler.aiter import monitor
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
root = Path(sys.argv[1])
settings = Settings(slots_dir=root / "slots", state_dir=root / "state",
    aiter=AiterSettings(trees=(AiterTree(package_dir=root / "aiter", target="gfx950:256"),)))
t = time.perf_counter()
report = monitor.AiterMonitor(settings, log_findings=False).check(heal=False)  # as `aiter plan`
print(time.perf_counter() - t)
"""


class AiterWorld:
    def __init__(self, *, mb: int) -> None:
        self.mb = mb
        self.root = Path(tempfile.mkdtemp(prefix="hal0-bench-aiter-"))
        self.pkg = self.root / "aiter"
        tables = FIXTURES if FIXTURES.is_dir() else _own_tables()
        shutil.copytree(tables, self.pkg / "configs")
        self.jit = self.pkg / "jit"
        (self.jit / "build").mkdir(parents=True)
        (self.root / "slots").mkdir()
        self.needs = self._needs()
        for module, names in self.needs.items():
            _build_so(self.jit / f"{module}.so", names, mb)
        self.modules = sorted(self.jit.glob("*.so"))
        self.table_files = sorted((self.pkg / "configs").rglob("*.csv"))

    def _needs(self) -> dict[str, set[str]]:
        sys.path.insert(0, str(world_mod.REPO / "src"))
        from hal0_reconciler.aiter import monitor
        from hal0_reconciler.settings import AiterSettings, AiterTree, Settings

        settings = Settings(
            slots_dir=self.root / "slots",
            state_dir=self.root / "scratch",
            aiter=AiterSettings(trees=(AiterTree(package_dir=self.pkg, target="gfx950:256"),)),
        )
        report = monitor.AiterMonitor(settings).check(heal=False)
        shutil.rmtree(self.root / "scratch", ignore_errors=True)
        needs: dict[str, set[str]] = {}
        for p in report.plans:
            for src in p.sources:
                for row in src.table.rows if src.table is not None else ():
                    needs.setdefault(row.module, set()).add(row.name)
        self.routes = {  # table path -> the modules its rows route to, with the names
            str(s.file.path): {r.module: set() for r in s.table.rows}
            for p in report.plans
            for s in p.sources
            if s.table is not None
        }
        for p in report.plans:
            for s in p.sources:
                if s.table is not None:
                    for r in s.table.rows:
                        self.routes[str(s.file.path)][r.module].add(r.name)
        return {m: set(names) for m, names in needs.items()}

    def describe(self) -> str:
        total = sum(p.stat().st_size for p in self.modules) / 1e6
        names = sum(len(n) for n in self.needs.values())
        return (
            f"{len(self.modules)} modules, {total:.0f} MB, {names} names, "
            f"{len(self.table_files)} tables"
        )

    def drop_caches(self) -> None:
        shutil.rmtree(self.root / "state", ignore_errors=True)

    def python_read(self) -> float:
        t = time.perf_counter()
        for path in self.modules:
            with path.open("rb") as fh:
                fh.read()
        return time.perf_counter() - t

    def registry_scan(self) -> float:
        """The registry's part alone: every module scanned for the names routed to it."""
        sys.path.insert(0, str(world_mod.REPO / "src"))
        from hal0_reconciler.aiter.registry import cache as registry

        reg = registry.Registry(None)
        t = time.perf_counter()
        for module, names in self.needs.items():
            reg.scan(self.jit / f"{module}.so", names)
        return time.perf_counter() - t

    def check_in_child(self) -> float:
        done = world_mod.run([sys.executable, "-c", _CHILD, str(self.root)], timeout=600)
        if done.returncode != 0:
            raise SystemExit(done.stderr.decode()[-2000:])
        return float(done.stdout.split()[-1])

    def plan_argv(self) -> list[str]:
        """``hal0-reconciler aiter plan`` over this tree, with its state dir."""
        return [
            sys.executable, "-m", "hal0_reconciler", "aiter", "plan",
            "--package-dir", str(self.pkg), "--target", "gfx950:256",
            "--state-dir", str(self.root / "state"), "--slots-dir", str(self.root / "slots"),
        ]  # fmt: skip

    def upstream_preflight(self) -> float:
        """For every table: parse it, re-read each module it routes to, search every name."""
        import csv

        t = time.perf_counter()
        for table, modules in self.routes.items():
            with open(table, newline="", encoding="utf-8", errors="replace") as fh:
                list(csv.reader(fh))
            for module, names in modules.items():
                data = (self.jit / f"{module}.so").read_bytes()
                for name in names:
                    _ = (name.encode() + b"\x00") in data
        return time.perf_counter() - t

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _build_so(out: Path, names: set[str], mb: int) -> None:
    src = out.with_suffix(".c")
    body = ",\n".join(
        '"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in sorted(names)
    )
    src.write_text(
        f"__attribute__((used)) const char *const names[] = {{{body}}};\n"
        f"__attribute__((used)) const char pad[{mb * 1024 * 1024}] = {{1}};\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    src.unlink()
