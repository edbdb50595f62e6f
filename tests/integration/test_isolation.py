"""One bad file never stops the rest: limits, any exception, hostile profiles, temp files,
a stop between two files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import structlog.testing

from hal0_reconciler import fsio
from hal0_reconciler.reconcile import OutcomeStatus, Reconciler
from hal0_reconciler.slots import edit, policy
from helpers.hosts import ROCM_USABLE
from helpers.lock_holder import holding_lock

CORPUS = Path(__file__).resolve().parents[1] / "reliability" / "corpus"
CANDIDATE = 'name = "{0}"\ntype = "llm"\ndevice = "gpu-vulkan"\n'


def _candidates(folder: Path, names: list[str]) -> list[Path]:
    paths = []
    for name in names:
        path = folder / f"{name}.toml"
        path.write_text(CANDIDATE.format(name))
        paths.append(path)
    return paths


def test_the_regression_corpus_is_reported_and_the_rest_relabelled(
    make_settings, host_dirs
) -> None:  # type: ignore[no-untyped-def]
    """Every hostile file is one reported problem (no traceback), its bytes untouched; the
    valid candidates around it are relabelled."""
    slots = host_dirs["slots_dir"]
    for path in CORPUS.glob("*.toml"):
        shutil.copy(path, slots / f"hostile-{path.name}")
    hostile = {p: p.read_bytes() for p in slots.iterdir()}
    good = _candidates(slots, ["a", "m", "z"])
    with structlog.testing.capture_logs() as logs:
        report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert all(b'"gpu-rocm"' in p.read_bytes() for p in good)
    assert hostile == {p: p.read_bytes() for p in hostile}
    by_name = {o.path.name: o for o in report.outcomes}
    assert (
        "over the number length limit: 5000 digits > 64"
        == by_name["hostile-int-5000-digits.toml"].message
    )
    assert "over the size limit" in str(by_name["hostile-header-70k.toml"].message)
    assert "over the nesting limit" in str(by_name["hostile-table-nested-500.toml"].message)
    reported = [e for e in logs if e["event"] == "slot.unreadable"]
    assert len(reported) == len(hostile)  # once each
    assert not any("exc_info" in e or "exception" in e for e in logs)


@pytest.mark.parametrize(
    "error",
    [MemoryError(), RecursionError("maximum recursion depth"), ValueError("x"), KeyError("k")],
)
def test_any_exception_in_one_file_is_that_files_problem(
    make_settings,
    host_dirs,
    monkeypatch: pytest.MonkeyPatch,
    error: BaseException,  # type: ignore[no-untyped-def]
) -> None:
    slots = host_dirs["slots_dir"]
    first, poisoned, last = _candidates(slots, ["a", "poisoned", "z"])
    real_decide = policy.decide

    def decide(doc, **kwargs):  # type: ignore[no-untyped-def]
        if doc.name == "poisoned":
            raise error
        return real_decide(doc, **kwargs)

    monkeypatch.setattr(policy, "decide", decide)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    outcome = {o.path: o for o in report.outcomes}[poisoned]
    assert OutcomeStatus.UNREADABLE is outcome.status
    assert outcome.message
    assert "Traceback" not in outcome.message
    assert b'"gpu-rocm"' in first.read_bytes()
    assert b'"gpu-rocm"' in last.read_bytes()
    assert b'"gpu-vulkan"' in poisoned.read_bytes()


def test_an_editor_crash_is_a_failed_write_of_that_file_only(
    make_settings,
    host_dirs,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    slots = host_dirs["slots_dir"]
    first, poisoned, last = _candidates(slots, ["a", "poisoned", "z"])
    real = edit.set_device

    def set_device(text: str, **kwargs):  # type: ignore[no-untyped-def]
        if "poisoned" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return real(text, **kwargs)

    monkeypatch.setattr(edit, "set_device", set_device)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    outcome = {o.path: o for o in report.outcomes}[poisoned]
    assert (OutcomeStatus.WRITE_FAILED, "nested too deeply to process") == (
        outcome.status,
        outcome.message,
    )
    assert [True, True] == [b'"gpu-rocm"' in p.read_bytes() for p in (first, last)]


@pytest.mark.parametrize("kind", ["fifo", "huge-int", "deep", "bad-utf8", "directory"])
def test_a_hostile_profiles_file_falls_back_to_the_builtins(
    make_settings,
    host_dirs,
    kind: str,  # type: ignore[no-untyped-def]
) -> None:
    """A FIFO never blocks the pass; every other kind is one error naming the file."""
    profiles = host_dirs["profiles_file"]
    if kind == "fifo":
        os.mkfifo(profiles)
    elif kind == "directory":
        profiles.mkdir()
    else:
        data = {
            "huge-int": b"[profile.x]\nn = " + b"9" * 5000,
            "deep": b"[profile.x]\nv = " + b"[" * 3000,
            "bad-utf8": b"[profile.x]\nv = '\xff'",
        }[kind]
        profiles.write_bytes(data)
    (good,) = _candidates(host_dirs["slots_dir"], ["agent"])
    with structlog.testing.capture_logs() as logs:
        Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert b'"gpu-rocm"' in good.read_bytes()
    errors = [e for e in logs if e["event"] == "profiles.unreadable"]
    assert 1 == len(errors)
    assert str(profiles) in errors[0]["error"]


def test_own_temp_files_go_hal0s_stay(make_settings, host_dirs) -> None:  # type: ignore[no-untyped-def]
    """Leftovers of this package's writes are removed at the start of an applying pass; hal0's
    own `.<name>.XXXX.tmp` and other hidden files are never touched."""
    slots = host_dirs["slots_dir"]
    ours = fsio.temp_path_for(slots / "agent.toml")
    ours.write_text("half")
    hal0s = slots / ".agent.toml.a1b2.tmp"
    hal0s.write_text("hal0 is writing")
    _candidates(slots, ["agent"])
    Reconciler(make_settings()).reconcile(ROCM_USABLE, apply=False)
    assert ours.exists(), "a dry run removes nothing"
    Reconciler(make_settings()).reconcile(ROCM_USABLE)
    assert (False, True) == (ours.exists(), hal0s.exists())


def test_own_temp_files_stay_while_another_writer_holds_the_lock(make_settings, host_dirs) -> None:  # type: ignore[no-untyped-def]
    """Under someone else's lock a temp file may be a write in flight: it is left alone."""
    slots = host_dirs["slots_dir"]
    ours = fsio.temp_path_for(slots / "agent.toml")
    ours.write_text("maybe in flight")
    with holding_lock(Path(f"{slots}.lock")):
        Reconciler(make_settings()).reconcile(ROCM_USABLE)
        assert ours.exists()


def test_a_cancelled_pass_stops_between_two_files(make_settings, host_dirs) -> None:  # type: ignore[no-untyped-def]
    paths = _candidates(host_dirs["slots_dir"], [f"s{n}" for n in range(5)])
    seen: list[int] = []

    def cancelled() -> bool:
        seen.append(1)
        return len(seen) > 2

    report = Reconciler(make_settings(), cancelled=cancelled).reconcile(ROCM_USABLE)
    assert 2 == len(report.relabeled)
    assert [b'"gpu-rocm"' in p.read_bytes() for p in paths] == [True, True, False, False, False]
