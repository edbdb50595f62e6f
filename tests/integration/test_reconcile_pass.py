"""One reconcile pass over a slots directory: right, byte-minimal, idempotent, quiet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
from pathlib import Path

import pytest
import structlog.testing

from hal0_reconciler.model import (
    FailureKind,
    HostFacts,
    LaneState,
    NodeFailure,
    ProbeResult,
    SlotKey,
)
from hal0_reconciler.reconcile import OutcomeStatus, Reconciler
from hal0_reconciler.slots import edit
from hal0_reconciler.state import DemotionLedger
from helpers.hosts import NOT_AMD, ROCM_UNSETTLED, ROCM_UNUSABLE, ROCM_USABLE, shared_path
from helpers.lock_holder import holding_lock

# legacy.toml (backend = "vulkan", no device) is kept: hal0 1.0-1.3's relabel reads `device`
# alone (1.4+ converts the backend into a device first; tests/integration/test_hal0_eras.py)
RELABELLED = {"agent", "coder", "embed", "rerank", "nested", "crlf"}
UNTOUCHED = {"img", "npu", "tts", "voice", "validated", "0042"}


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def expected_text(old: bytes, new_device: str) -> bytes:
    """The old bytes with only the launched device value changed (and the top-level one of a
    nested file when it says the same: hal0's own pass reads that one)."""
    text = old.decode()
    if "\n[slot]\n" in text:
        head, _, tail = text.partition("\n[slot]\n")
        if 'device = "gpu-vulkan"' in tail:
            head = head.replace('device = "gpu-vulkan"', f'device = "{new_device}"', 1)
        return (head + "\n[slot]\n" + tail.replace('"gpu-vulkan"', f'"{new_device}"', 1)).encode()
    if 'backend = "vulkan"' in text:
        return text.replace('backend = "vulkan"', f'device = "{new_device}"').encode()
    for quoted in ('"gpu-vulkan"', "'gpu-vulkan'"):
        if quoted in text:
            q = quoted[0]
            return text.replace(quoted, f"{q}{new_device}{q}", 1).encode()
    raise AssertionError("fixture has no vulkan label")


@pytest.mark.parametrize(("facts", "target"), [(ROCM_USABLE, "gpu-rocm"), (ROCM_UNUSABLE, "cpu")])
def test_pass_relabels_exactly_the_llama_cpp_vulkan_slots(
    seeded_slots: Path, make_settings, facts: HostFacts, target: str
) -> None:
    """Every llama.cpp vulkan slot moves, byte-minimally; every other file keeps its bytes."""
    before = snapshot(seeded_slots)
    report = Reconciler(make_settings()).reconcile(facts)
    after = snapshot(seeded_slots)
    assert RELABELLED == {o.path.stem for o in report.relabeled}
    for name, old in before.items():
        stem = name.removesuffix(".toml")
        if stem in RELABELLED:
            assert expected_text(old, target) == after[name], name
        else:
            assert old == after[name], name
    assert set(before) == set(after)


def test_second_pass_is_byte_identical_and_silent(seeded_slots: Path, make_settings) -> None:
    """A second pass over its own output changes nothing and logs nothing."""
    reconciler = Reconciler(make_settings())
    reconciler.reconcile(ROCM_UNUSABLE)
    first = snapshot(seeded_slots)
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(ROCM_UNUSABLE)
        reconciler.reconcile(ROCM_UNUSABLE)
    assert [] == logs
    assert first == snapshot(seeded_slots)
    assert () == report.relabeled


def test_events_name_each_decision(seeded_slots: Path, make_settings) -> None:
    """gpu-rocm relabels are info events; cpu demotions are their own warning event."""
    with structlog.testing.capture_logs() as rocm_logs:
        Reconciler(make_settings()).reconcile(ROCM_USABLE, [seeded_slots / "coder.toml"])
    with structlog.testing.capture_logs() as cpu_logs:
        Reconciler(make_settings()).reconcile(ROCM_UNUSABLE, [seeded_slots / "embed.toml"])
    assert [("slot.relabeled", "info", "coder", "gpu-vulkan", "gpu-rocm")] == [
        (e["event"], e["log_level"], e["slot"], e["old"], e["new"]) for e in rocm_logs
    ]
    assert [("slot.demoted_to_cpu", "warning", "embed", "gpu-vulkan", "cpu")] == [
        (e["event"], e["log_level"], e["slot"], e["old"], e["new"]) for e in cpu_logs
    ]
    assert "behaviour_change" in cpu_logs[0]


def test_non_amd_host_touches_nothing_and_says_nothing(seeded_slots: Path, make_settings) -> None:
    """Without amdgpu, a pass changes no byte and logs no event, even for broken files."""
    (seeded_slots / "broken.toml").write_text("name = \n")
    before = snapshot(seeded_slots)
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(NOT_AMD)
    assert [] == logs
    assert before == snapshot(seeded_slots)
    assert () == report.relabeled


def test_unreadable_file_is_reported_once_and_left_untouched(
    seeded_slots: Path, make_settings
) -> None:
    """A file that cannot be parsed or decoded is reported by path and left byte-for-byte."""
    bad_toml = seeded_slots / "bad.toml"
    bad_toml.write_bytes(b'name = "bad"\ndevice = "gpu-vulkan\n')
    bad_utf8 = seeded_slots / "latin.toml"
    bad_utf8.write_bytes(b'name = "caf\xe9"\ndevice = "gpu-vulkan"\n')
    before = {p: p.read_bytes() for p in (bad_toml, bad_utf8)}
    reconciler = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        report = reconciler.reconcile(ROCM_USABLE)
        reconciler.reconcile(ROCM_USABLE)
    unreadable = [e for e in logs if e["event"] == "slot.unreadable"]
    assert sorted([str(bad_toml), str(bad_utf8)]) == sorted(e["path"] for e in unreadable)
    assert all(e["error"] for e in unreadable)
    assert before == {p: p.read_bytes() for p in before}
    assert RELABELLED == {o.path.stem for o in report.relabeled} - {"0042"}


def test_unresolved_runtime_is_reported_once(
    seeded_slots: Path, make_settings, host_dirs: dict[str, Path]
) -> None:
    """A slot whose profile names an unknown runtime family is skipped and reported once."""
    host_dirs["profiles_file"].write_text('[profile.exotic]\nruntime_family = "vllm"\n')
    (seeded_slots / "exotic.toml").write_text(
        'name = "exotic"\ndevice = "gpu-vulkan"\nprofile = "exotic"\n'
    )
    reconciler = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        first = reconciler.reconcile(ROCM_USABLE)
        reconciler.reconcile(ROCM_USABLE)
    assert ["exotic"] == [e["slot"] for e in logs if e["event"] == "slot.runtime_unresolved"]
    assert OutcomeStatus.SKIPPED == next(o.status for o in first.outcomes if o.name == "exotic")
    assert 'device = "gpu-vulkan"' in (seeded_slots / "exotic.toml").read_text()


def test_own_demotions_are_restored_and_operator_changes_win(
    seeded_slots: Path, make_settings, host_dirs: dict[str, Path]
) -> None:
    """Slots demoted to cpu by us return to gpu-rocm with the lane; an operator's choice drops the record."""
    settings = make_settings()
    ledger = DemotionLedger.in_state_dir(host_dirs["state_dir"])
    Reconciler(settings, ledger=ledger).reconcile(ROCM_UNUSABLE)
    assert {"agent", "coder"} <= {v.slot for v in _ledger_entries(host_dirs)}
    # the operator moves coder to gpu-cuda by hand: our record of coder must go
    coder = seeded_slots / "coder.toml"
    coder.write_text(coder.read_text().replace('"cpu"', '"gpu-cuda"'))
    reloaded = DemotionLedger.in_state_dir(host_dirs["state_dir"])  # survives a restart
    with structlog.testing.capture_logs() as logs:
        Reconciler(settings, ledger=reloaded).reconcile(ROCM_USABLE)
    restored = sorted(e["slot"] for e in logs if e["event"] == "slot.restored_to_rocm")
    assert sorted(RELABELLED - {"coder"}) == restored
    assert 'device    =   "gpu-cuda"' in coder.read_text()
    assert 'device = "gpu-rocm"' in (seeded_slots / "agent.toml").read_text()
    assert frozenset() == DemotionLedger.in_state_dir(host_dirs["state_dir"]).keys()


def _ledger_entries(host_dirs: dict[str, Path]):  # type: ignore[no-untyped-def]
    import json

    raw = json.loads((host_dirs["state_dir"] / "demotions.json").read_text())
    from hal0_reconciler.state import Demotion

    return [Demotion(**v) for v in raw.values()]


def test_grace_keeps_vulkan_slots(seeded_slots: Path, make_settings) -> None:
    """While the lane is unsettled, no slot is demoted."""
    before = snapshot(seeded_slots)
    report = Reconciler(make_settings()).reconcile(ROCM_UNSETTLED)
    assert before == snapshot(seeded_slots)
    assert () == report.relabeled


def test_dry_run_writes_nothing(seeded_slots: Path, make_settings) -> None:
    """apply=False reports pending relabels and changes no byte."""
    before = snapshot(seeded_slots)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE, apply=False)
    assert before == snapshot(seeded_slots)
    assert RELABELLED == {o.path.stem for o in report.pending}


EDIT_UNDER_LOCK = textwrap.dedent(
    """
    import fcntl, os, sys, time
    lock, slot = sys.argv[1], sys.argv[2]
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o664)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(0.8)
    text = open(slot).read().replace("port = 8082", "port = 9999")
    tmp = slot + ".writer.tmp"
    open(tmp, "w").write(text)
    os.rename(tmp, slot)
    fcntl.flock(fd, fcntl.LOCK_UN)
    """
)


@pytest.mark.timeout(30)
def test_lock_holders_edits_are_never_lost(seeded_slots: Path, make_settings) -> None:
    """A writer holding hal0's lock delays our write, and its edit survives ours."""
    settings = make_settings(lock_timeout=10.0)
    coder = seeded_slots / "coder.toml"
    with subprocess.Popen(
        [sys.executable, "-c", EDIT_UNDER_LOCK, str(settings.effective_lock_file), str(coder)],
        stdout=subprocess.PIPE,
    ) as writer:
        assert writer.stdout is not None
        assert b"locked\n" == writer.stdout.readline()
        report = Reconciler(settings).reconcile(ROCM_USABLE, [coder])
        writer.wait(timeout=10)
    text = coder.read_text()
    assert "port = 9999" in text
    assert 'device    =   "gpu-rocm"' in text
    assert [OutcomeStatus.RELABELED] == [o.status for o in report.outcomes]


@pytest.mark.timeout(30)
def test_lock_timeout_is_a_write_failure_and_loses_nothing(
    seeded_slots: Path, make_settings
) -> None:
    """When the lock is never released in time, the file is untouched and the failure logged."""
    settings = make_settings(lock_timeout=0.3)
    coder = seeded_slots / "coder.toml"
    before = coder.read_bytes()
    with holding_lock(settings.effective_lock_file), structlog.testing.capture_logs() as logs:
        report = Reconciler(settings).reconcile(ROCM_USABLE, [coder])
    assert before == coder.read_bytes()
    assert [OutcomeStatus.WRITE_FAILED] == [o.status for o in report.outcomes]
    assert ["slot.write_failed"] == [e["event"] for e in logs]


def test_symlinked_slot_is_reported_and_its_target_untouched(
    seeded_slots: Path, make_settings, tmp_path: Path
) -> None:
    """A slot path that is a symlink is reported and skipped; the pass goes on."""
    outside = tmp_path / "outside.toml"
    outside.write_text('name = "outside"\ndevice = "gpu-vulkan"\n')
    (seeded_slots / "linked.toml").symlink_to(outside)
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert 'device = "gpu-vulkan"' in outside.read_text()
    assert [str(seeded_slots / "linked.toml")] == [
        e["path"] for e in logs if e["event"] == "slot.not_regular_file"
    ]
    assert RELABELLED == {o.path.stem for o in report.relabeled}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_rewrite_keeps_hal0s_owner_and_mode(seeded_slots: Path, make_settings) -> None:
    """The relabelled file keeps hal0's owner, group and 0600 mode."""
    coder = seeded_slots / "coder.toml"
    os.chown(coder, 999, 998)
    os.chmod(coder, 0o600)
    Reconciler(make_settings()).reconcile(ROCM_USABLE, [coder])
    st = coder.stat()
    assert (999, 998, 0o600) == (st.st_uid, st.st_gid, st.st_mode & 0o7777)


def test_real_hal0_seed_slots_are_relabelled_byte_minimally(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """On hal0's own seed files, only the device value differs and the long comments survive."""
    seeds = shared_path("fixtures", "hal0", "slots")
    for f in seeds.glob("*.toml"):
        shutil.copyfile(f, host_dirs["slots_dir"] / f.name)
    before = snapshot(host_dirs["slots_dir"])
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    after = snapshot(host_dirs["slots_dir"])
    vulkan = {n for n, b in before.items() if b'device = "gpu-vulkan"' in b}
    assert {"agent.toml", "coder.toml", "embed.toml", "rerank.toml", "utility.toml"} == vulkan
    assert {n.removesuffix(".toml") for n in vulkan} == {o.name for o in report.relabeled}
    for name, old in before.items():
        expected = old.replace(b'device = "gpu-vulkan"', b'device = "gpu-rocm"', 1)
        assert expected == after[name], name


def test_inline_slot_table_is_relabelled_in_place(seeded_slots: Path, make_settings) -> None:
    """An inline `slot = {...}` table keeps its comments: only the label's bytes change."""
    inline = seeded_slots / "inline.toml"
    old = '# kept\nslot = { name = "inline", device = "gpu-vulkan", port = 1 }  # kept too\n'
    inline.write_text(old)
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(ROCM_USABLE, [inline], apply=False)
        Reconciler(make_settings()).reconcile(ROCM_USABLE, [inline])
    assert [(OutcomeStatus.PENDING, None)] == [(o.status, o.message) for o in report.outcomes]
    assert ["slot.relabeled"] == [e["event"] for e in logs]
    assert old.replace('"gpu-vulkan"', '"gpu-rocm"') == inline.read_text()


WHOLE_REWRITE = '# a comment that cannot survive\n[slot]\nname = "x"\ndevice = "gpu-vulkan"\n'
WHOLE_REWRITE += '[slot.backend]\nlane = "vulkan"\n'  # a backend that is a table of its own


def test_exotic_layout_is_rewritten_whole_and_says_comments_were_lost(
    seeded_slots: Path, make_settings
) -> None:
    """A backend given as a table has no one span to delete: the file is re-serialised, the
    dry run says so beforehand, and a warning says so after."""
    exotic = seeded_slots / "exotic.toml"
    exotic.write_text(WHOLE_REWRITE)
    dry = Reconciler(make_settings()).reconcile(ROCM_USABLE, [exotic], apply=False)
    assert [OutcomeStatus.PENDING] == [o.status for o in dry.outcomes]
    assert "is a table of its own" in (dry.outcomes[0].message or "")
    assert WHOLE_REWRITE == exotic.read_text()
    with structlog.testing.capture_logs() as logs:
        Reconciler(make_settings()).reconcile(ROCM_USABLE, [exotic])
    assert ["slot.relabeled", "slot.comments_lost"] == [e["event"] for e in logs]
    assert {"slot": {"name": "x", "device": "gpu-rocm"}} == tomllib.loads(exotic.read_text())


def test_dry_run_says_when_the_write_would_be_refused(
    seeded_slots: Path, make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When neither rewrite could be verified, the dry run predicts the failed write."""
    exotic = seeded_slots / "exotic.toml"
    exotic.write_text(WHOLE_REWRITE)

    def cannot(data: object) -> str:
        raise ValueError("cannot")

    monkeypatch.setattr(edit.tomli_w, "dumps", cannot)
    dry = Reconciler(make_settings()).reconcile(ROCM_USABLE, [exotic], apply=False)
    assert [OutcomeStatus.WRITE_FAILED] == [o.status for o in dry.outcomes]
    assert "tomli_w cannot write" in (dry.outcomes[0].message or "")


def test_demotion_event_says_why_the_lane_is_unusable(seeded_slots: Path, make_settings) -> None:
    """The cpu demotion warning carries the probe's reason, so the operator sees the cause."""
    facts = HostFacts(
        amd=True,
        lane=LaneState.UNUSABLE,
        probe=ProbeResult(
            usable=False,
            credentials=None,
            kfd_ok=False,
            render_node=None,
            failures=(NodeFailure("/dev/kfd", FailureKind.PERMISSION, 13, "Permission denied"),),
        ),
    )
    with structlog.testing.capture_logs() as logs:
        Reconciler(make_settings()).reconcile(facts, [seeded_slots / "coder.toml"])
    assert ["/dev/kfd: permission (Permission denied)"] == [e["rocm_lane"] for e in logs]


def test_new_settings_keep_the_memory_of_reported_problems(
    seeded_slots: Path, make_settings
) -> None:
    """After a settings reload, a problem already reported is not reported again."""
    (seeded_slots / "bad.toml").write_text("name = \n")
    reconciler = Reconciler(make_settings())
    reconciler.reconcile(ROCM_USABLE)
    reconciler.update_settings(make_settings(demote_grace=5))
    with structlog.testing.capture_logs() as logs:
        reconciler.reconcile(ROCM_USABLE)
    assert [] == logs


@pytest.mark.timeout(30)
def test_a_stopping_daemon_stops_waiting_for_the_lock(seeded_slots: Path, make_settings) -> None:
    """A lock wait ends as soon as the daemon is told to stop; the file is left as it was."""
    settings = make_settings(lock_timeout=20.0)
    coder = seeded_slots / "coder.toml"
    before = coder.read_bytes()
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with holding_lock(settings.effective_lock_file):
        started = time.monotonic()
        report = Reconciler(settings, cancelled=stop.is_set).reconcile(ROCM_USABLE, [coder])
        waited = time.monotonic() - started
    assert [OutcomeStatus.WRITE_FAILED] == [o.status for o in report.outcomes]
    assert waited < 10
    assert before == coder.read_bytes()


def test_a_deleted_slot_takes_its_demotion_record_with_it(
    seeded_slots: Path, make_settings, host_dirs: dict[str, Path]
) -> None:
    """A new file at the path of a slot we demoted is the operator's: its cpu is not 'restored'."""
    settings = make_settings()
    ledger = DemotionLedger.in_state_dir(host_dirs["state_dir"])
    coder = seeded_slots / "coder.toml"
    Reconciler(settings, ledger=ledger).reconcile(ROCM_UNUSABLE, [coder])
    coder.unlink()
    Reconciler(settings, ledger=ledger).reconcile(ROCM_UNUSABLE, [coder])
    coder.write_text('# on the CPU on purpose\nname = "coder"\ndevice = "cpu"\n')
    Reconciler(settings, ledger=ledger).reconcile(ROCM_USABLE, [coder])
    assert 'device = "cpu"' in coder.read_text()


def test_a_name_hal0_could_not_run_is_said_once_across_passes(
    make_settings, host_dirs: dict[str, Path]
) -> None:
    """A slot named outside hal0's pattern is reported on the first pass only, and again only
    when its problem changes."""
    (host_dirs["slots_dir"] / "odd.toml").write_text('name = "Odd"\ntype = "llm"\ndevice = "cpu"\n')
    engine = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        engine.reconcile(ROCM_USABLE)
        engine.reconcile(ROCM_USABLE)
        (host_dirs["slots_dir"] / "odd.toml").write_text('name = "Odd2"\ndevice = "cpu"\n')
        engine.reconcile(ROCM_USABLE)
    said = [e["reason"] for e in logs if e["event"] == "slot.name_invalid"]
    assert 2 == len(said), said
    assert "'Odd'" in said[0]
    assert "'Odd2'" in said[1]


def test_a_doubtful_file_that_cannot_be_read_is_held_back_not_reported(
    seeded_slots: Path, make_settings
) -> None:
    """A file read the instant its writer closed it that does not parse is neither an outcome
    of the pass (status, plan, the unreadable count) nor reported: it is handed back in
    ``held``; the same file not doubtful is an unreadable outcome."""
    broken = seeded_slots / "half.toml"
    broken.write_text('name = "half"\ndevice = "gpu-vul')
    key = SlotKey(str(broken.absolute()))
    held = Reconciler(make_settings()).reconcile(ROCM_USABLE, [broken], doubtful={key})
    plain = Reconciler(make_settings()).reconcile(ROCM_USABLE, [broken])
    assert ([], [key]) == ([o.key for o in held.outcomes], [o.key for o in held.held])
    assert [OutcomeStatus.UNREADABLE] == [o.status for o in plain.outcomes]
