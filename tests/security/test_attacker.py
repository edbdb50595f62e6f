"""The attacker fixture is a real unprivileged user: the premise of every test here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.attacker import Attacker, Tally


def test_the_attacker_cannot_read_what_only_root_reads(
    attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    """A process as the attacker is refused a 0600 root file: the attacker really is unprivileged."""
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    attacks.tried("premise")
    code = (
        f"import os; os.setgroups([]); os.setgid({attacker.gid}); os.setuid({attacker.uid}); "
        f"open({str(secret)!r}).read()"
    )
    result = subprocess.run(  # the interpreter may sit in a root-only venv: drop after start
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert 0 != result.returncode
    assert b"PermissionError" in result.stderr
    assert 0 != attacker.uid
    assert os.geteuid() == 0
    attacks.held("premise")
