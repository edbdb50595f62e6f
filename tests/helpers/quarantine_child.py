"""A heal or restore in a process of its own that stops at a chosen rename, for a SIGKILL there.

``python -m helpers.quarantine_child JIT STATE VERB KILL_AT ARG [owner]``: VERB ``heal``
quarantines the modules named (comma-separated) in ARG, ``restore`` puts quarantine ARG back.
With ``owner`` the verb runs in the tree owner's child (``owner_heal``) and prints ``failed``
when that child was killed (by the test's ``strace`` fault injection, KILL_AT then unused). At rename number
KILL_AT (0-based, module renames only) it prints the number and blocks reading stdin: the test
kills it there. Written against the public ``heal`` functions, with a fallback for 0.1.0's
(path renames, no journal, no digest book), so the same test can be run against either.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hal0_reconciler.aiter.quarantine import heal
from helpers import quarantines


def _barrier(kill_at: int) -> Callable[[], None]:
    count = [0]

    def arrive() -> None:
        n = count[0]
        count[0] += 1
        if n == kill_at:
            sys.stdout.write(f"{n}\n")
            sys.stdout.flush()
            sys.stdin.read()  # the test SIGKILLs this process here

    return arrive


def arm(kill_at: int, state: Path) -> dict[str, Any]:
    """Install the barrier; returns the keyword arguments the heal functions take here."""
    arrive = _barrier(kill_at)
    try:
        from hal0_reconciler.aiter.quarantine import digests as manifest_digest
        from hal0_reconciler.aiter.quarantine import folder as qfs
    except ImportError:  # 0.1.0: every module move is an os.rename of a path
        real = os.rename

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if not str(src).endswith(".tmp"):
                arrive()
            real(src, dst, *args, **kwargs)

        os.rename = rename
        return {}
    qfs.rename_hook = lambda _n: arrive()
    return {"book": manifest_digest.DigestBook(state / "aiter")}


def main(argv: list[str]) -> int:
    jit, state, verb, kill_at, arg = Path(argv[0]), Path(argv[1]), argv[2], int(argv[3]), argv[4]
    if argv[5:] == ["owner"]:
        return _as_owner(jit, state, verb, arg)
    kwargs = arm(kill_at, state)
    now = dt.datetime(2020, 2, 1, tzinfo=dt.UTC)
    if verb == "heal":
        plans = {m: quarantines.module_plan(jit, m) for m in arg.split(",")}
        heal.quarantine(jit, plans, now=now, **kwargs)
    else:
        heal.restore(jit, arg, now=now, **kwargs)
    sys.stdout.write("done\n")
    return 0


def _as_owner(jit: Path, state: Path, verb: str, arg: str) -> int:
    from hal0_reconciler.aiter.quarantine import as_owner as owner_heal
    from hal0_reconciler.aiter.quarantine import digests as manifest_digest

    book = manifest_digest.DigestBook(state / "aiter")
    io = quarantines.owner_io(jit)
    now = dt.datetime(2020, 2, 1, tzinfo=dt.UTC)
    try:
        if verb == "heal":
            plans = {m: quarantines.module_plan(jit, m) for m in arg.split(",")}
            owner_heal.quarantine(io, jit, plans, book=book, now=now)
        else:
            owner_heal.restore(io, jit, arg, book=book, now=now)
    except heal.HealFailed as exc:
        sys.stdout.write(f"failed\n{exc}\n")
        return 3
    finally:
        io.close()
    sys.stdout.write("done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
