"""A heal waits while aiter builds: its build locks, and compilers working in the tree (found
in the real process table: real processes named like compilers, started by the test)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hal0_reconciler.aiter.quarantine import heal

SLEEP = shutil.which("sleep") or "/bin/sleep"
SHELL = "/bin/sh"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    package, jit = tmp_path / "aiter", tmp_path / "aiter" / "jit"
    (jit / "build").mkdir(parents=True)
    return package, jit


class Procs:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *, cwd: Path, argv0: str | None = None, args: tuple[str, ...] = ()):
        """A process whose executable is called ``name`` (its comm), argv[0] ``argv0``, and
        ``args`` on its command line (a copy of sh, then, that waits)."""
        exe = self.bin_dir / name
        if not exe.exists():
            shutil.copy(SHELL if args else SLEEP, exe)
        argv = [argv0 or str(exe), *(("-c", "sleep 30; :", name, *args) if args else ("30",))]
        proc = subprocess.Popen(argv, executable=exe, cwd=cwd)
        self.started.append(proc)
        deadline = time.monotonic() + 5
        # exec done: the name is the new one, and so is argv (the kernel sets the name first,
        # the argument area a moment later: an empty command line is an exec still under way)
        while not _execed(psutil.Process(proc.pid), name, argv[0]):
            assert time.monotonic() < deadline, f"{name} did not start"
            time.sleep(0.01)
        return proc


def _execed(proc: psutil.Process, name: str, argv0: str) -> bool:
    with proc.oneshot():
        cmdline = proc.cmdline()
        return proc.name() == name and bool(cmdline) and cmdline[0] == argv0


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    p = Procs(bin_dir)
    yield p
    for proc in p.started:
        proc.kill()
        proc.wait()


def _compilers(busy: list[str]) -> list[str]:
    return [b for b in busy if b.startswith("compiler pid ")]


def test_a_compiler_working_in_the_jit_folder_holds_the_heal(tree, procs: Procs) -> None:
    """A compiler whose working directory is inside the JIT folder is named, with its pid."""
    package, jit = tree
    (jit / "build" / "module_x").mkdir()
    proc = procs.start("ninja", cwd=jit / "build" / "module_x")
    busy = _compilers(heal.build_activity(jit, package, []))
    assert [f"compiler pid {proc.pid}"] == [b.split(" (")[0] for b in busy], (
        f"a compiler building in the tree was not seen: {busy}"
    )


def test_a_compiler_named_only_by_its_executable_or_its_argv0_is_seen(tree, procs: Procs) -> None:
    """Either the process name or argv[0] naming a compiler is enough (hipcc runs clang under
    another argv[0]; wrappers exec compilers under their own name)."""
    package, jit = tree
    by_name = procs.start("clang++", cwd=jit, argv0="wrapper")
    by_argv0 = procs.start("not-a-compiler", cwd=jit, argv0="/opt/rocm/bin/hipcc")
    busy = _compilers(heal.build_activity(jit, package, []))
    pids = {b.split(" (")[0] for b in busy}
    assert {f"compiler pid {by_name.pid}", f"compiler pid {by_argv0.pid}"} == pids, (
        f"compilers named by executable or by argv[0] were missed: {busy}"
    )


def test_a_compiler_given_the_tree_on_its_command_line_holds_the_heal(
    tree, procs: Procs, tmp_path: Path
) -> None:
    """A compiler elsewhere whose arguments name a file of the package is building it too."""
    package, jit = tree
    proc = procs.start("gcc", cwd=tmp_path, args=(str(package / "csrc" / "x.cu"),))
    busy = _compilers(heal.build_activity(jit, package, []))
    assert [f"compiler pid {proc.pid}"] == [b.split(" (")[0] for b in busy]


def test_unrelated_processes_do_not_hold_the_heal(tree, procs: Procs, tmp_path: Path) -> None:
    """A compiler working in another tree (even one whose name starts like the JIT folder's)
    and a non-compiler inside the tree hold nothing."""
    package, jit = tree
    lookalike = tmp_path / "aiter-other"
    lookalike.mkdir()
    procs.start("make", cwd=lookalike)
    procs.start("sleep", cwd=jit)
    assert [] == heal.build_activity(jit, package, []), "an unrelated process held the heal"


def test_only_the_build_locks_of_the_modules_to_heal_count(tree) -> None:
    """build/lock_<module> of a module to heal holds it; another module's lock does not."""
    package, jit = tree
    (jit / "build" / "lock_module_a").touch()
    (jit / "build" / "lock_module_b").touch()
    busy = heal.build_activity(jit, package, ["module_a", "module_c", "module_a"])
    assert [f"build lock {jit / 'build' / 'lock_module_a'}"] == busy
