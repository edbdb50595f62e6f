"""A heal never runs blind: when the process table cannot be listed, the checks that need it
(builds in progress, processes holding a module) fail loudly instead of finding nothing."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from hal0_reconciler.aiter.quarantine import heal


@pytest.fixture
def no_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """psutil looking at a /proc that is not mounted (a bare container, a broken sandbox)."""
    absent = tmp_path / "proc"
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(absent))  # the module heal imports to scan
    return absent


def test_builds_in_progress_cannot_be_ruled_out_without_the_process_table(
    tmp_path: Path, no_proc: Path
) -> None:
    jit = tmp_path / "jit"
    (jit / "build").mkdir(parents=True)
    try:
        busy = heal.build_activity(jit, tmp_path, ["module_x"])
    except heal.ProcessScanUnavailable as exc:
        said = str(exc)
    else:
        said = f"nothing said; busy = {busy}"
    assert said.startswith("cannot list processes ("), (
        f"an unreadable process table did not stop the build check: {said}"
    )
    assert "ProcSubset=pid" in said, f"the likely cause is not named: {said}"


def test_holders_of_a_module_cannot_be_ruled_out_without_the_process_table(
    tmp_path: Path, no_proc: Path
) -> None:
    with pytest.raises(heal.ProcessScanUnavailable, match="cannot list processes"):
        heal.mapped_by([tmp_path / "module_x.so"])
