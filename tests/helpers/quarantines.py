"""Quarantines for tests: a digest book in a tree's state, module plans without a survey, and
a JIT folder with module files of known bytes."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePath
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.rules import routing

if TYPE_CHECKING:
    from hal0_reconciler.aiter.quarantine import digests as manifest_digest


def book_for(state_dir: Path) -> manifest_digest.DigestBook:
    """The book the monitor of a tree whose ``state_dir`` this is uses."""
    from hal0_reconciler.aiter.quarantine import digests as manifest_digest

    return manifest_digest.DigestBook(state_dir / "aiter")


def module_plan(jit: Path, module: str) -> plan.ModulePlan:
    """A heal verdict for ``module`` (what the manifest records of it)."""
    return plan.ModulePlan(
        module,
        PurePath(jit / f"{module}.so"),
        routing.Keyed.NAME,
        plan.Status.UNCOVERED,
        plan.Action.HEAL,
        1,
        (),
        "digest-1",
        "test",
    )


def install(jit: Path, module: str, payload: bytes) -> None:
    """``<jit>/<module>.so`` with ``payload`` and a ``build/<module>/blob/gen.cpp``."""
    jit.mkdir(parents=True, exist_ok=True)
    (jit / f"{module}.so").write_bytes(payload)
    blob = jit / "build" / module / "blob"
    blob.mkdir(parents=True, exist_ok=True)
    (blob / "gen.cpp").write_bytes(payload + b"-src")


def snapshot(root: Path) -> dict[str, bytes | None]:
    """relative path → bytes (None for a folder, the target for a link), nothing followed."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = os.readlink(path).encode()
            elif path.is_dir():
                found[rel] = None
            else:
                found[rel] = path.read_bytes()
    return found


def heal_modules(
    jit: Path, state_dir: Path, modules: list[str], *, day: int = 1
) -> heal.Quarantine:
    """A real heal of ``modules`` (their files must exist) on 2020-01-``day``."""
    now = dt.datetime(2020, 1, day, tzinfo=dt.UTC)
    plans = {m: module_plan(jit, m) for m in modules}
    return heal.quarantine(jit, plans, book=book_for(state_dir), now=now)


def aiter_support() -> ModuleType:
    """``tests/aiter/aiter_support.py`` (trees with real tables, gcc-built modules) for suites
    outside ``tests/aiter``; one module object whichever suite imported it first."""
    if "aiter_support" in sys.modules:
        return sys.modules["aiter_support"]
    folder = Path(__file__).resolve().parents[1] / "aiter"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # aiter_support imports its neighbours (tablegen)
    path = folder / "aiter_support.py"
    spec = importlib.util.spec_from_file_location("aiter_support", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["aiter_support"] = module
    spec.loader.exec_module(module)
    return module


def heal_kwargs(state_dir: Path) -> dict[str, Any]:
    """The keyword arguments this version's heal functions take (none before 0.2.0)."""
    return {"book": book_for(state_dir)} if hasattr(heal, "recover") else {}


def as_user(uid: int, gid: int, code: str) -> None:
    """Run Python ``code`` as that user (starts as root, drops its credentials first)."""
    drop = f"import json, os, shutil\nos.setgroups([]); os.setgid({gid}); os.setuid({uid})\n"
    result = subprocess.run(
        [sys.executable, "-c", drop + code], capture_output=True, timeout=60, check=False
    )
    assert 0 == result.returncode, result.stderr.decode(errors="replace")


@contextlib.contextmanager
def reachable_dir() -> Iterator[Path]:
    """A fresh 0755 folder under /tmp that another user can reach (pytest's tmp_path sits in a
    0700 folder of root's); removed after."""
    path = Path(tempfile.mkdtemp(prefix="hal0-q-"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def owner_io(jit: Path, *, timeout: float = 10.0) -> Any:
    """The tree I/O of ``jit`` with its owner's credentials (the owner's child when the owner is
    not root), judged as the daemon judges it: the tree's owner is the JIT folder's."""
    from hal0_reconciler.aiter.trees import owner as treeowner
    from hal0_reconciler.aiter.trees import owner_io as treeio

    found = treeowner.owner_of(jit, jit.parent)
    assert None is found.refused
    p = PurePath(jit)
    roots = (treeio.Root(p, p),)  # type: ignore[arg-type]
    return treeio.open_tree(roots, found.credentials, timeout=timeout)
