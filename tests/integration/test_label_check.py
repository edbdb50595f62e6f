"""Reading hal0's rendered slot units and the memory of restarts made: real files in a temp tree."""

from __future__ import annotations

from pathlib import Path

from hal0_reconciler.host.restarts import label_check, running_lane
from hal0_reconciler.host.restarts.running_lane import Intent, LabelState
from hal0_reconciler.slots import document
from helpers import hal0_facts

STALE = "ghcr.io/hal0ai/hal0-combined:0822"  # a stale former default: hal0's retag would move it


def _candidate(tmp_path: Path, text: str, label: str = "gpu-rocm") -> label_check.Candidate:
    path = tmp_path / "slots/agent.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return label_check.Candidate("agent", "agent", label, path)


def _look(tmp_path: Path, candidate: label_check.Candidate) -> list[label_check.Looked]:
    return label_check.look(
        [candidate],
        quadlet_dir=tmp_path / "quadlet",
        facts=hal0_facts.ALLOWLIST_13,
        memory=label_check.AppliedMemory(tmp_path / "state" / label_check.MEMORY_FILE),
        intent=Intent(),
        slot_max_bytes=16384,
    )


def test_a_stale_pin_launches_as_written_not_as_the_retag_would_make_it() -> None:
    """hal0 launches a stale pinned image as it is (its update retags it later): that is the
    image its renderer writes, for both GPU lanes."""
    doc = document.parse_slot(f'name = "agent"\nimage_pin = "{STALE}"\n', stem="agent")
    assert {"gpu-vulkan": STALE, "gpu-rocm": STALE} == label_check.launch_images(
        doc, hal0_facts.ALLOWLIST_13
    )


def test_a_slot_hal0_has_not_rendered_is_not_looked_at(tmp_path: Path) -> None:
    """No .container file: nothing runs, nothing to say."""
    (tmp_path / "quadlet").mkdir()
    assert [] == _look(tmp_path, _candidate(tmp_path, 'name = "agent"\ndevice = "gpu-rocm"\n'))


def test_a_symlinked_unit_is_not_followed_and_cannot_be_told(tmp_path: Path) -> None:
    """A .container that is a symlink is never read through: "cannot tell", nothing applied."""
    folder = tmp_path / "quadlet"
    folder.mkdir()
    real = tmp_path / "elsewhere.container"
    real.write_text("[Container]\nImage=x\n")
    (folder / "hal0-slot@agent.container").symlink_to(real)
    (looked,) = _look(tmp_path, _candidate(tmp_path, 'name = "agent"\ndevice = "gpu-rocm"\n'))
    assert LabelState.CANNOT_TELL == looked.check.state
    assert "symlink" in looked.check.reason


def test_the_memory_of_restarts_survives_and_forgets_slots_that_are_gone(tmp_path: Path) -> None:
    """What was restarted for is read back by the next daemon; a full look drops slots that
    are gone; the file is the daemon's own (0600)."""
    path = tmp_path / "state" / label_check.MEMORY_FILE
    memory = label_check.AppliedMemory(path)
    memory.note_restarted("agent", "cpu", "abc")
    memory.note_written([("coder", "gpu-rocm")])
    again = label_check.AppliedMemory(path)
    assert (True, False) == (again.tried("agent", "cpu", "abc"), again.tried("agent", "cpu", "x"))
    assert (True, True) == (again.ours("coder", "gpu-rocm"), again.tried("coder", "gpu-rocm", "f"))
    again.keep_only(["agent"])
    last = label_check.AppliedMemory(path)
    assert (False, True) == (last.ours("coder", "gpu-rocm"), last.tried("agent", "cpu", "abc"))
    assert 0o600 == path.stat().st_mode & 0o777


def test_the_unit_file_decides_the_running_lane(tmp_path: Path) -> None:
    """A real rendered unit with no device lines under a gpu-rocm label: running cpu, not
    applied (not written by the daemon, not hal0's relabel)."""
    folder = tmp_path / "quadlet"
    folder.mkdir()
    (folder / "hal0-slot@agent.container").write_text(
        "[Container]\nImage=ghcr.io/hal0ai/hal0-toolbox-cpu:v1\nPublishPort=127.0.0.1:1:1\n"
    )
    (looked,) = _look(tmp_path, _candidate(tmp_path, 'name = "agent"\ndevice = "gpu-rocm"\n'))
    assert (running_lane.CPU, LabelState.NOT_APPLIED) == (looked.check.running, looked.check.state)
