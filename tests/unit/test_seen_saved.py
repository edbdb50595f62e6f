"""The memory of slot files kept across restarts (``SeenSlots.save`` / ``load``): what comes back
is only what may be trusted, and anything else reads as empty."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog.testing

from hal0_reconciler.model import Action, Reason, Runtime, SlotKey, Verdict
from hal0_reconciler.slots import document, seen

KEY = SlotKey("/etc/hal0/slots/a.toml")
DATA = b'name = "a"\ndevice = "gpu-vulkan"\n[server]\nenv = { AITER_X = "1" }\nport = 9001\n'
DOC = document.parse_slot(DATA.decode(), stem="a")
NOW = 10_000_000_000_000
OLD = NOW - 2 * seen.SETTLED_NS
SCOPE = "0.1.0 Limits(...) /etc/hal0/slots"


def _stat(ctime_ns: int = OLD, *, size: int = len(DATA)) -> Any:
    return SimpleNamespace(st_dev=1, st_ino=2, st_size=size, st_mtime_ns=5, st_ctime_ns=ctime_ns)


def _decide(calls: list[str], reason: Reason = Reason.NOT_AMD_HOST) -> seen.Decide:
    def decide(doc: document.SlotDoc) -> Verdict:
        calls.append(doc.name)
        return Verdict(Action.KEEP, reason, Runtime.LLAMA_SERVER, doc.device)

    return decide


def _saved(path: Path, *, data: bytes = DATA, doc: document.SlotDoc = DOC, ctime_ns: int = OLD,
           scope: str = SCOPE) -> seen.SeenSlots:  # fmt: skip
    slots = seen.SeenSlots(path, scope=scope)
    slots.judge_with("context")
    verdict = _decide([])(doc)
    slots.remember(KEY, data, _stat(ctime_ns), doc, verdict, read_at_ns=NOW, demoted=False)
    slots.keep_only({KEY})  # the end of a full pass: saved
    return slots


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return tmp_path / "state" / "seen-slots.json"


def test_an_unchanged_file_comes_back_with_its_parse_and_is_judged_again(saved: Path) -> None:
    """After a restart the same identity is a hit without reading the file; the verdict is
    made again (in whatever context the new process has), never taken from the file."""
    _saved(saved)
    loaded = seen.SeenSlots.load(saved, scope=SCOPE)
    assert 1 == len(loaded)
    loaded.judge_with("another context")
    calls: list[str] = []
    hit = loaded.by_identity(KEY, _stat(), demoted=False, decide=_decide(calls, Reason.NOT_VULKAN))
    assert hit is not None
    assert (DOC, ["a"], Reason.NOT_VULKAN) == (hit.doc, calls, hit.verdict.reason)
    assert {"AITER_X": "1"} == hit.doc.server_env


def test_a_loaded_file_is_judged_even_in_the_context_it_was_saved_in(saved: Path) -> None:
    _saved(saved)
    loaded = seen.SeenSlots.load(saved, scope=SCOPE)
    loaded.judge_with("context")
    calls: list[str] = []
    assert loaded.by_identity(KEY, _stat(), demoted=False, decide=_decide(calls)) is not None
    assert ["a"] == calls
    assert loaded.same_outcome(KEY, apply=True) is None


def test_a_file_changed_while_stopped_is_read_again(saved: Path) -> None:
    """Another identity misses; other bytes miss by content: the caller parses them."""
    _saved(saved)
    loaded = seen.SeenSlots.load(saved, scope=SCOPE)
    loaded.judge_with("context")
    assert loaded.by_identity(KEY, _stat(OLD + 1), demoted=False, decide=_decide([])) is None
    changed = DATA.replace(b"9001", b"9002")
    assert (
        loaded.by_content(
            KEY, changed, _stat(OLD + 1), read_at_ns=NOW, demoted=False, decide=_decide([])
        )
        is None
    )
    same = loaded.by_content(KEY, DATA, _stat(OLD + 1), read_at_ns=NOW, demoted=False,
                             decide=_decide([]))  # fmt: skip
    assert same is not None


def test_a_racy_read_stays_untrusted_by_identity_after_a_restart(saved: Path) -> None:
    _saved(saved, ctime_ns=NOW)
    loaded = seen.SeenSlots.load(saved, scope=SCOPE)
    assert loaded.by_identity(KEY, _stat(NOW), demoted=False, decide=_decide([])) is None


def test_a_memory_of_another_boot_is_trusted_by_content_only(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a reboot a clock step could give a new write an old ctime: no identity is trusted."""
    boot = tmp_path / "boot_id"
    boot.write_text("boot-one\n")
    monkeypatch.setattr(seen, "BOOT_ID", boot)
    _saved(saved)
    boot.write_text("boot-two\n")
    loaded = seen.SeenSlots.load(saved, scope=SCOPE)
    assert loaded.by_identity(KEY, _stat(), demoted=False, decide=_decide([])) is None
    hit = loaded.by_content(KEY, DATA, _stat(), read_at_ns=NOW, demoted=False, decide=_decide([]))
    assert hit is not None
    assert loaded.by_identity(KEY, _stat(), demoted=False, decide=_decide([])) is not None


def test_an_unknown_boot_trusts_no_identity(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seen, "BOOT_ID", tmp_path / "no-boot-id")
    _saved(saved)
    loaded = seen.SeenSlots.load(saved, scope=SCOPE)
    assert 1 == len(loaded)
    assert loaded.by_identity(KEY, _stat(), demoted=False, decide=_decide([])) is None


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _valid(saved: Path) -> dict[str, Any]:
    _saved(saved)
    doc: dict[str, Any] = json.loads(saved.read_text())
    return doc


def _entry_with(doc: dict[str, Any], index: int, value: object) -> dict[str, Any]:
    entry = list(doc["entries"][0])
    entry[index] = value
    return {**doc, "entries": [entry]}


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda _d: b"\x00\xff not json", id="garbage"),
        pytest.param(lambda d: json.dumps(d)[:-20], id="truncated"),
        pytest.param(lambda _d: "[" * 100_000 + "]" * 100_000, id="deeply-nested"),
        pytest.param(lambda d: json.dumps([d]), id="not-an-object"),
        pytest.param(lambda d: json.dumps({**d, "format": "something else 1"}), id="other-format"),
        pytest.param(lambda d: json.dumps({**d, "scope": "0.0.9 other"}), id="other-scope"),
        pytest.param(
            lambda d: json.dumps({k: v for k, v in d.items() if k != "boot"}), id="no-boot"
        ),
        pytest.param(lambda d: json.dumps(_entry_with(d, 0, "relative.toml")), id="relative-key"),
        pytest.param(lambda d: json.dumps(_entry_with(d, 2, "2")), id="inode-as-text"),
        pytest.param(lambda d: json.dumps(_entry_with(d, 6, 1)), id="settled-not-bool"),
        pytest.param(lambda d: json.dumps(_entry_with(d, 7, "zz")), id="digest-not-hex"),
        pytest.param(lambda d: json.dumps(_entry_with(d, 8, [1])), id="data-not-a-table"),
        pytest.param(lambda d: json.dumps(_entry_with(d, 8, {"device": 3})), id="device-not-text"),
        pytest.param(
            lambda d: json.dumps({**d, "entries": [d["entries"][0][:5]]}), id="short-entry"
        ),
    ],
)
def test_a_corrupt_or_foreign_memory_reads_as_empty(saved: Path, spoil: Any) -> None:
    doc = _valid(saved)
    _write(saved, spoil(doc))
    assert 0 == len(seen.SeenSlots.load(saved, scope=SCOPE))


def test_a_valid_memory_is_read(saved: Path) -> None:
    """The counterpart of the corrupt cases: the unspoilt file is read."""
    doc = _valid(saved)
    _write(saved, json.dumps(doc))
    assert 1 == len(seen.SeenSlots.load(saved, scope=SCOPE))


def test_a_missing_oversized_or_special_memory_reads_as_empty(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert 0 == len(seen.SeenSlots.load(saved, scope=SCOPE)), "missing"
    _valid(saved)
    monkeypatch.setattr(seen, "MAX_FILE_BYTES", saved.stat().st_size - 1)
    assert 0 == len(seen.SeenSlots.load(saved, scope=SCOPE)), "over the size bound"
    monkeypatch.undo()
    saved.unlink()
    os.mkfifo(saved)  # never opened blocking: it would stall the start for good
    assert 0 == len(seen.SeenSlots.load(saved, scope=SCOPE)), "a FIFO"
    saved.unlink()
    target = saved.with_name("elsewhere.json")
    _saved(target)
    saved.symlink_to(target)
    assert 0 == len(seen.SeenSlots.load(saved, scope=SCOPE)), "a symlink"


def test_a_memory_too_large_to_keep_is_saved_without_entries(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seen, "MAX_FILE_BYTES", 200)
    _saved(saved)
    assert [] == json.loads(saved.read_text())["entries"]
    assert saved.stat().st_size <= 200


def test_a_slot_with_a_toml_date_is_not_kept(saved: Path) -> None:
    """JSON has no dates: such a parse would not come back the same, so it is parsed again."""
    data = DATA + b"[model]\nadded = 2024-05-01\n"
    doc = document.parse_slot(data.decode(), stem="a")
    _saved(saved, data=data, doc=doc)
    assert [] == json.loads(saved.read_text())["entries"]
    assert 0 == len(seen.SeenSlots.load(saved, scope=SCOPE))


def test_the_memory_is_private_and_written_only_when_it_changed(saved: Path) -> None:
    """Mode 0600 (a slot's environment may hold a secret); a pass that changed nothing does
    not rewrite it; a forgotten file does."""
    slots = _saved(saved)
    assert 0o600 == stat.S_IMODE(saved.stat().st_mode)
    before = saved.stat().st_ino
    slots.keep_only({KEY})
    assert before == saved.stat().st_ino, "rewritten although nothing changed"
    slots.keep_only(set())
    assert [] == json.loads(saved.read_text())["entries"]
    assert not [p for p in saved.parent.iterdir() if p != saved], "a temp file was left"


def test_a_failed_save_is_said_once_and_does_not_raise(saved: Path) -> None:
    _write(saved.parent / "blocker", "")
    blocked = saved.parent / "blocker" / "seen-slots.json"  # its folder is a file
    with structlog.testing.capture_logs() as logs:
        slots = _saved(blocked)
        slots.forget(KEY)
        slots.keep_only(set())
    assert slots.save_error is not None
    assert 1 == sum(e["event"] == "seen.save_failed" for e in logs)
