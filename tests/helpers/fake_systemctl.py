"""A fake ``systemctl`` on PATH: records every argv, answers ``is-active`` per unit (one line
each, for one or many units, as systemctl does)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

_SCRIPT = """\
    #!{python}
    import json, sys
    from pathlib import Path
    here = Path({here!r})
    with (here / "calls.jsonl").open("a") as fh:
        fh.write(json.dumps(sys.argv[1:]) + "\\n")
    states = json.loads((here / "states.json").read_text())
    if len(sys.argv) > 2 and sys.argv[1] == "is-active":
        # like systemctl: one line per unit, in order; 0 when any of them is active
        answers = [states.get(unit, "inactive") for unit in sys.argv[2:]]
        print("\\n".join(answers))
        sys.exit(0 if "active" in answers else 3)
    sys.exit(0)
"""


class FakeSystemctl:
    """``path`` is the script; ``calls()`` every argv (without argv[0]) in order."""

    def __init__(self, folder: Path, states: dict[str, str] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.path = folder / "systemctl"
        self.path.write_text(
            textwrap.dedent(_SCRIPT).format(python=sys.executable, here=str(folder))
        )
        self.path.chmod(0o755)
        self.set_states(states or {})

    def set_states(self, states: dict[str, str]) -> None:
        (self.folder / "states.json").write_text(json.dumps(states))

    def calls(self) -> list[list[str]]:
        log = self.folder / "calls.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line]

    def actions(self) -> list[list[str]]:
        """Every call except ``is-active`` look-ups."""
        return [c for c in self.calls() if c[:1] != ["is-active"]]


def restarter_overrides(
    tmp_path: Path, api_url: str, systemctl: Path, *, api_timeout: float = 5
) -> dict[str, object]:
    """Settings for a Restarter in ``tmp_path`` that talks to a test's hal0 API and systemctl."""
    return {
        "slots_dir": str(tmp_path / "slots"),
        "state_dir": str(tmp_path / "state"),
        "runtime_dir": str(tmp_path / "run"),
        "systemctl": str(systemctl),
        "api_url": api_url,
        "api_env_file": str(tmp_path / "api.env"),
        "api_timeout": api_timeout,
        "update_jobs_dir": str(tmp_path / "update-jobs"),
        "idle_recheck": 0.05,
        "idle_confirm": 0.3,
    }
