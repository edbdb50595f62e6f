"""Mutation testing: do the tests notice when one line of a module is broken?

    .venv/bin/python tests/mutation/run.py daemon/watch.py [slots/store.py ...]
    .venv/bin/python tests/mutation/run.py --changed [--base main]
    .venv/bin/python tests/mutation/run.py slots/store.py --list
    .venv/bin/python tests/mutation/run.py slots/store.py --lines 58,60-70

For each module (a path under ``src/hal0_reconciler/``, or ``--changed``: the modules that
differ from ``--base``), every single-line mutant (``mutants.py`` says which) is applied, one at
a time, to a private copy of the checkout in a temporary folder (the checkout itself is never
edited, so runs can go side by side), and the module's tests (``targets.toml``; every test when
the module has no entry) run with ``-x`` and a timeout. A mutant is *killed* when they fail (or
time out), and *survives* when they pass. The mutants that behave exactly like the original are
listed in ``equivalent.toml``, each with its reason, and left out of the kill rate.

Prints per-module kill rates and every surviving mutant; exits 1 when a module is under
``--fail-under`` (default 0: report only). Not part of the default test run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutants import Mutant, mutants_of

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PACKAGE = Path("src/hal0_reconciler")
_SKIP_COPY = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    outcome: str  # killed | timeout | survived | equivalent
    seconds: float
    reason: str = ""


# -- configuration --------------------------------------------------------------------------------
def load_targets(path: Path) -> dict[str, list[str]]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {str(k): [str(t) for t in v] for k, v in data.get("tests", {}).items()}


class Equivalents:
    """The mutants listed as behaving like the original: module, stripped source line, the
    mutation as printed, and (to tell apart identical lines) optionally the line above."""

    def __init__(self, path: Path) -> None:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        self._entries: dict[tuple[str, str, str], list[tuple[str | None, str]]] = {}
        self._used: set[tuple[str, str, str]] = set()
        for entry in data.get("equivalent", []):
            key = (entry["module"], entry["line"], entry["mutation"])
            self._entries.setdefault(key, []).append((entry.get("above"), entry["reason"]))

    def reason(self, m: Mutant) -> str | None:
        key = (m.module, m.source_line, m.description)
        for above, reason in self._entries.get(key, []):
            if above is None or above == m.line_above:
                self._used.add(key)
                return reason
        return None

    def unused(self, modules: list[str]) -> list[tuple[str, str, str]]:
        """Entries of these modules that matched no mutant (the code moved on: stale)."""
        return [k for k in self._entries if k[0] in modules and k not in self._used]


def module_name(arg: str) -> str:
    """``src/hal0_reconciler/daemon/watch.py``, ``daemon/watch.py``, ``daemon.watch`` → the 2nd."""
    text = arg.strip()
    if not text.endswith(".py"):
        text = text.replace(".", "/") + ".py"
    for prefix in (f"{PACKAGE}/", "hal0_reconciler/"):
        text = text.removeprefix(prefix)
    if not (REPO / PACKAGE / text).is_file():
        raise SystemExit(f"no module {REPO / PACKAGE / text}")
    return text


def changed_modules(base: str) -> list[str]:
    """Modules of the package that differ from ``base`` (committed or not)."""
    out = subprocess.run(
        ["git", "diff", "--name-only", base, "--", str(PACKAGE)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        module_name(line)
        for line in out.split()
        if line.endswith(".py") and (REPO / line).is_file()
    ]


def parse_lines(text: str | None) -> set[int] | None:
    if not text:
        return None
    lines: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        lines.update(range(int(low), int(high or low) + 1))
    return lines


# -- a private copy of the checkout ---------------------------------------------------------------
def _ignore(folder: str, names: list[str]) -> set[str]:
    del folder
    return {n for n in names if n in _SKIP_COPY or n.endswith(".egg-info")}


class Sandbox:
    """A copy of the checkout in a temp folder, where one module at a time is mutated."""

    def __init__(self, root: Path) -> None:
        self.path = root / "clone"
        self.proc: subprocess.Popen[str] | None = None
        shutil.copytree(REPO, self.path, ignore=_ignore, symlinks=True)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(self.path / "src"),
            "PYTHONDONTWRITEBYTECODE": "1",  # a same-size mutant in the same second: no stale .pyc
            # the shared fixtures of the checkout, not of the temp folder
            "HAL0_SHARED_DIR": os.environ.get("HAL0_SHARED_DIR", str(REPO.parent / "shared")),
        }

    def kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    def pytest(self, tests: list[str], *, timeout: float) -> tuple[str, float, str]:
        """Run the tests; ('passed'|'failed'|'timeout', seconds, last lines of output)."""
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--timeout={max(int(timeout), 5)}",
            *tests,
        ]
        started = time.monotonic()
        with subprocess.Popen(
            argv,
            cwd=self.path,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        ) as proc:
            self.proc = proc
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return "timeout", time.monotonic() - started, ""
            except BaseException:  # interrupted: take the test run (and its children) along
                os.killpg(proc.pid, signal.SIGKILL)
                raise
        seconds = time.monotonic() - started
        tail = "\n".join(out.strip().splitlines()[-15:])
        if proc.returncode == 0:
            return "passed", seconds, tail
        if proc.returncode == 5:
            raise SystemExit(f"no tests collected by {' '.join(tests)}")
        return "failed", seconds, tail

    def check_imports_from_copy(self) -> None:
        code = "import hal0_reconciler; print(hal0_reconciler.__file__)"
        where = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not where.startswith(str(self.path)):
            raise SystemExit(f"the copy imports hal0_reconciler from {where}, not from itself")


# -- one module -----------------------------------------------------------------------------------
def run_module(
    module: str,
    tests: list[str],
    *,
    equivalents: Equivalents,
    lines: set[int] | None,
    jobs: int,
    timeout: float | None,
    verbose: bool,
) -> list[Result]:
    original = (REPO / PACKAGE / module).read_bytes()
    mutants = [m for m in mutants_of(module, original) if lines is None or m.line in lines]
    results: list[Result] = []
    todo: list[Mutant] = []
    for m in mutants:
        reason = equivalents.reason(m)
        if reason is not None:
            results.append(Result(m, "equivalent", 0.0, reason))
        else:
            todo.append(m)
    if not todo:
        return results
    with tempfile.TemporaryDirectory(prefix="hal0-mutation-") as tmp:
        boxes = [Sandbox(Path(tmp) / f"w{i}") for i in range(max(1, min(jobs, len(todo))))]
        boxes[0].check_imports_from_copy()
        state, seconds, tail = boxes[0].pytest(tests, timeout=600)
        if state != "passed":
            raise SystemExit(f"{module}: the tests fail without any mutant:\n{tail}")
        per_mutant = timeout if timeout is not None else max(30.0, 3 * seconds + 10)
        print(
            f"{module}: {len(todo)} mutants, tests {' '.join(tests)} "
            f"({seconds:.1f}s unmutated, {per_mutant:.0f}s timeout)",
            flush=True,
        )
        free = list(boxes)
        lock = threading.Lock()

        def one(m: Mutant) -> Result:
            with lock:
                box = free.pop()
            target = box.path / PACKAGE / module
            try:
                target.write_bytes(m.apply(original))
                state, seconds, tail = box.pytest(tests, timeout=per_mutant)
            finally:
                target.write_bytes(original)
                with lock:
                    free.append(box)
            outcome = {"passed": "survived", "failed": "killed"}.get(state, state)
            result = Result(m, outcome, seconds, tail if verbose else "")
            mark = "SURVIVED" if outcome == "survived" else outcome
            print(f"  {mark:8} {seconds:5.1f}s {m.where:28} {m.description}", flush=True)
            return result

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(boxes))
        try:
            results += list(pool.map(one, todo))
        except BaseException:  # Ctrl-C, SIGTERM: no new mutant, the running ones killed
            pool.shutdown(wait=False, cancel_futures=True)
            for box in boxes:
                box.kill()
            raise
        pool.shutdown()
    return results


# -- report ---------------------------------------------------------------------------------------
def rate(results: list[Result]) -> float:
    counted = [r for r in results if r.outcome != "equivalent"]
    killed = [r for r in counted if r.outcome in {"killed", "timeout"}]
    return 100.0 * len(killed) / len(counted) if counted else 100.0


def report(all_results: dict[str, list[Result]]) -> str:
    header = (
        f"{'module':28} {'mutants':>7} {'killed':>6} {'timeout':>7} {'survived':>8} "
        f"{'equivalent':>10} {'kill rate':>9}"
    )
    rows = [header]
    for module, results in all_results.items():
        count = {
            k: sum(1 for r in results if r.outcome == k)
            for k in ("killed", "timeout", "survived", "equivalent")
        }
        rows.append(
            f"{module:28} {len(results):7} {count['killed']:6} {count['timeout']:7} "
            f"{count['survived']:8} {count['equivalent']:10} {rate(results):8.1f}%"
        )
    survivors = [r for rs in all_results.values() for r in rs if r.outcome == "survived"]
    if survivors:
        rows += ["", "Surviving mutants (no test noticed the change):"]
        for r in survivors:
            rows += [
                f"  {r.mutant.where:28} {r.mutant.description}",
                f"{'':32}| {r.mutant.source_line}",
            ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module paths (e.g. daemon/watch.py)")
    parser.add_argument(
        "--changed", action="store_true", help="the modules that differ from --base"
    )
    parser.add_argument("--base", default="main", help="git ref for --changed (default: main)")
    parser.add_argument("--tests", nargs="+", help="test paths to run (default: targets.toml)")
    parser.add_argument("--lines", help="only mutants on these lines, e.g. 58,60-70")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run side by side (copies)")
    parser.add_argument("--timeout", type=float, help="seconds per mutant (default: from baseline)")
    parser.add_argument("--fail-under", type=float, default=0.0, help="minimum kill rate, percent")
    parser.add_argument("--targets", type=Path, default=HERE / "targets.toml")
    parser.add_argument("--equivalent", type=Path, default=HERE / "equivalent.toml")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: test runs killed, temporary copies removed
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))

    modules = [module_name(m) for m in args.modules]
    if args.changed:
        modules += [m for m in changed_modules(args.base) if m not in modules]
    if not modules:
        parser.error("name a module, or use --changed")
    targets = load_targets(args.targets)
    equivalents = Equivalents(args.equivalent)
    lines = parse_lines(args.lines)

    if args.list:
        for module in modules:
            source = (REPO / PACKAGE / module).read_bytes()
            for m in mutants_of(module, source):
                if lines is None or m.line in lines:
                    eq = " (equivalent)" if equivalents.reason(m) is not None else ""
                    print(f"{m.where:28} {m.kind:8} {m.description}{eq}")
        return 0

    all_results: dict[str, list[Result]] = {}
    for module in modules:
        tests = args.tests or targets.get(module) or ["tests"]
        all_results[module] = run_module(
            module,
            tests,
            equivalents=equivalents,
            lines=lines,
            jobs=args.jobs,
            timeout=args.timeout,
            verbose=args.verbose,
        )
    print()
    print(report(all_results))
    if lines is None:
        for module, line, mutation in equivalents.unused(modules):
            print(f"stale entry in {args.equivalent.name}: {module}: {line!r}: {mutation}")
    low = [m for m, rs in all_results.items() if rate(rs) < args.fail_under]
    if low:
        print(f"\nunder {args.fail_under:g}%: {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
