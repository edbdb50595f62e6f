"""A restart with nothing changed does not parse the slot files again (the engine's memory is
kept in the state folder), and still judges every slot in the context of the day."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler.reconcile import OutcomeStatus, Reconciler
from hal0_reconciler.slots import document, seen, store
from helpers.daemon_host import slot_text
from helpers.hosts import NOT_AMD, ROCM_UNUSABLE, ROCM_USABLE

NAMES = ("agent", "chat", "coder")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many slot files were read and parsed."""
    counts = {"read": 0, "parsed": 0}
    read, parse = store.read_slot, document.parse_slot

    def counting_read(*args: Any, **kwargs: Any) -> Any:
        counts["read"] += 1
        return read(*args, **kwargs)

    def counting_parse(*args: Any, **kwargs: Any) -> Any:
        counts["parsed"] += 1
        return parse(*args, **kwargs)

    monkeypatch.setattr(store, "read_slot", counting_read)
    monkeypatch.setattr(document, "parse_slot", counting_parse)
    monkeypatch.setattr(seen, "SETTLED_NS", 0)  # every read is settled: trusted by identity
    return counts


def _engine(make_settings: Any, state_dir: Path) -> Reconciler:
    return Reconciler(make_settings(), seen_file=state_dir / "seen-slots.json")


def _fill(slots_dir: Path, device: str = "gpu-rocm") -> None:
    for name in NAMES:
        (slots_dir / f"{name}.toml").write_text(slot_text(name, device))


def test_a_restart_with_nothing_changed_reads_no_slot_file(
    host_dirs: dict[str, Path], make_settings: Any, counted: dict[str, int]
) -> None:
    _fill(host_dirs["slots_dir"])
    first = _engine(make_settings, host_dirs["state_dir"]).reconcile(ROCM_USABLE)
    assert (3, 3) == (counted["read"], counted["parsed"])
    counted.update(read=0, parsed=0)
    again = _engine(make_settings, host_dirs["state_dir"]).reconcile(ROCM_USABLE)
    assert (0, 0) == (counted["read"], counted["parsed"])
    assert [(o.key, o.status, o.verdict) for o in first.outcomes] == [
        (o.key, o.status, o.verdict) for o in again.outcomes
    ]


def test_without_the_memory_file_every_slot_is_parsed(
    host_dirs: dict[str, Path], make_settings: Any, counted: dict[str, int]
) -> None:
    """The counterpart: a plain engine (``once``, ``plan``) keeps nothing."""
    _fill(host_dirs["slots_dir"])
    Reconciler(make_settings()).reconcile(ROCM_USABLE)
    Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert 6 == counted["parsed"]
    assert not (host_dirs["state_dir"] / "seen-slots.json").exists()


def test_new_host_facts_after_a_restart_rejudge_every_slot_from_the_memory(
    host_dirs: dict[str, Path], make_settings: Any, counted: dict[str, int]
) -> None:
    """Saved on a host without amdgpu (nothing to do), restarted on an AMD host whose lane is
    usable: every unpinned gpu-vulkan slot is relabelled (this hal0's default image is not
    Vulkan-capable), its file read under the lock and parsed for the edit, the others not."""
    _fill(host_dirs["slots_dir"], "gpu-vulkan")
    _engine(make_settings, host_dirs["state_dir"]).reconcile(NOT_AMD)
    counted.update(read=0, parsed=0)
    report = _engine(make_settings, host_dirs["state_dir"]).reconcile(ROCM_USABLE)
    assert [OutcomeStatus.RELABELED] * 3 == [o.status for o in report.outcomes]
    for name in NAMES:
        assert 'device = "gpu-rocm"' in (host_dirs["slots_dir"] / f"{name}.toml").read_text()
    assert 3 == counted["read"], "each relabel re-reads its file under the lock"
    counted.update(read=0, parsed=0)
    report = _engine(make_settings, host_dirs["state_dir"]).reconcile(ROCM_UNUSABLE)
    assert [OutcomeStatus.UNCHANGED] * 3 == [o.status for o in report.outcomes]
    # what the relabels wrote is remembered with the edit's verified parse, as unsettled reads:
    # after a restart each is read again and known by its bytes, not parsed
    assert (3, 0) == (counted["read"], counted["parsed"]), "rewritten files not known by bytes"


def test_a_file_changed_while_stopped_is_judged_from_its_new_bytes(
    host_dirs: dict[str, Path], make_settings: Any, counted: dict[str, int]
) -> None:
    _fill(host_dirs["slots_dir"])
    _engine(make_settings, host_dirs["state_dir"]).reconcile(ROCM_USABLE)
    changed = host_dirs["slots_dir"] / "chat.toml"
    changed.write_text(slot_text("chat", "gpu-vulkan"))  # same size class, other bytes
    (host_dirs["slots_dir"] / "coder.toml").unlink()
    counted.update(read=0, parsed=0)
    report = _engine(make_settings, host_dirs["state_dir"]).reconcile(ROCM_USABLE)
    by_name = {o.name: o for o in report.outcomes}
    assert {"agent", "chat"} == set(by_name)
    assert OutcomeStatus.RELABELED is by_name["chat"].status
    assert OutcomeStatus.UNCHANGED is by_name["agent"].status
    assert 1 == counted["parsed"], "only the changed file is parsed"


def test_a_spoilt_memory_file_costs_a_parse_not_a_wrong_verdict(
    host_dirs: dict[str, Path], make_settings: Any, counted: dict[str, int]
) -> None:
    _fill(host_dirs["slots_dir"], "gpu-vulkan")
    _engine(make_settings, host_dirs["state_dir"]).reconcile(NOT_AMD)
    (host_dirs["state_dir"] / "seen-slots.json").write_text('{"format": "hal0-reconciler se')
    counted.update(read=0, parsed=0)
    report = _engine(make_settings, host_dirs["state_dir"]).reconcile(ROCM_USABLE)
    assert [OutcomeStatus.RELABELED] * 3 == [o.status for o in report.outcomes]
    assert 3 <= counted["parsed"]


def test_new_limits_forget_every_parse_made_under_the_old_ones(
    host_dirs: dict[str, Path], make_settings: Any, counted: dict[str, int]
) -> None:
    """A reload that lowers slot_max_bytes: an unchanged file now over it is reported, not
    judged from the parse made when it was allowed (nor from the saved memory at a restart)."""
    big = host_dirs["slots_dir"] / "agent.toml"
    big.write_text(slot_text("agent", "gpu-rocm") + "# padding\n" * 200)
    engine = _engine(make_settings, host_dirs["state_dir"])
    assert [OutcomeStatus.UNCHANGED] == [o.status for o in engine.reconcile(ROCM_USABLE).outcomes]
    small = make_settings(slot_max_bytes=1024)
    engine.update_settings(small)
    report = engine.reconcile(ROCM_USABLE)
    assert [OutcomeStatus.UNREADABLE] == [o.status for o in report.outcomes]
    restarted = Reconciler(small, seen_file=host_dirs["state_dir"] / "seen-slots.json")
    report = restarted.reconcile(ROCM_USABLE)
    assert [OutcomeStatus.UNREADABLE] == [o.status for o in report.outcomes]
