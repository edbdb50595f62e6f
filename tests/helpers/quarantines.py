"""Quarantines for tests: a digest book in a tree's state, module plans without a survey, and
a JIT folder with module files of known bytes."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path, PurePath

from typing import TYPE_CHECKING

from hal0_reconciler.aiter import heal, plan, routing

if TYPE_CHECKING:
    from hal0_reconciler.aiter import manifest_digest


def book_for(state_dir: Path) -> manifest_digest.DigestBook:
    """The book the monitor of a tree whose ``state_dir`` this is uses."""
    from hal0_reconciler.aiter import manifest_digest  # noqa: PLC0415 - absent in 0.1.0

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
