"""The recorded baseline commits, as source trees a child interpreter can run.

``python run_all.py --base 6aef203`` (the default: 0.2.0) measures each daemon figure for this
checkout and for the baseline's ``src/`` back to back in the same run; ``--base 12f8b41`` is
0.1.0. Each tree is ``git archive``d once into a temp folder (bytecode compiled, as an
installed package has it) and removed at exit. Asserts nothing.
"""

from __future__ import annotations

import atexit
import functools
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

KNOWN = {"6aef203": "0.2.0", "12f8b41": "0.1.0"}
"""The recorded baselines (not tags): 0.2.0 and 0.1.0."""


@dataclass(frozen=True)
class Source:
    """One tree of the package: its ``src`` folder (what PYTHONPATH names) and its label."""

    label: str
    src: Path


OURS = Source("ours", REPO / "src")


def checkout(commit: str) -> Source:
    """The ``src/`` of ``commit``, extracted into a temp folder removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix=f"hal0-bench-base-{commit}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "src"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    src = folder / "src"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True)
    name = KNOWN.get(commit[:7])
    return Source(f"{name} ({commit[:7]})" if name else commit[:7], src)


def knows(source: Source, key: str) -> bool:
    """Whether ``source``'s settings have the top-level setting ``key`` (a baseline refuses a
    setting added since it, exit 78, where it would simply not use it)."""
    return (
        re.search(rf"^\s+{re.escape(key)}\s*:", _settings_text(source.src), re.MULTILINE)
        is not None
    )


@functools.cache
def _settings_text(src: Path) -> str:
    return (src / "hal0_reconciler/settings.py").read_text(encoding="utf-8")


def settable(source: Source, argv: list[str]) -> list[str]:
    """``argv`` without the ``--set KEY=VALUE`` pairs ``source``'s settings do not know."""
    kept: list[str] = []
    skip = False
    for n, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--set" and n + 1 < len(argv) and not knows(source, argv[n + 1].split("=")[0]):
            skip = True
            continue
        kept.append(arg)
    return kept
