"""The reconciler's memory of slot files: when a file may be trusted unchanged by stat alone."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hal0_reconciler.model import Action, Reason, Runtime, SlotKey, Verdict
from hal0_reconciler.slots import document, seen

KEY = SlotKey("/etc/hal0/slots/a.toml")
DATA = b'name = "a"\ndevice = "gpu-vulkan"\n'
DOC = document.parse_slot(DATA.decode(), stem="a")
NOW = 10_000_000_000_000


def _stat(ctime_ns: int, *, size: int = len(DATA), mtime_ns: int = 5) -> Any:
    return SimpleNamespace(
        st_dev=1, st_ino=2, st_size=size, st_mtime_ns=mtime_ns, st_ctime_ns=ctime_ns
    )


def _verdict(reason: Reason = Reason.NOT_VULKAN) -> Verdict:
    return Verdict(Action.KEEP, reason, Runtime.LLAMA_SERVER, "gpu-vulkan")


def _decided(calls: list[str], reason: Reason = Reason.NOT_AMD_HOST) -> seen.Decide:
    def decide(doc: document.SlotDoc) -> Verdict:
        calls.append(doc.name)
        return _verdict(reason)

    return decide


def _remembered(ctime_ns: int, read_at_ns: int) -> seen.SeenSlots:
    slots = seen.SeenSlots()
    slots.judge_with("context")
    st = _stat(ctime_ns)
    slots.remember(KEY, DATA, st, DOC, _verdict(), read_at_ns=read_at_ns, demoted=False)
    return slots


def test_a_settled_read_is_trusted_by_its_identity() -> None:
    calls: list[str] = []
    slots = _remembered(ctime_ns=NOW - 2 * seen.SETTLED_NS, read_at_ns=NOW)
    hit = slots.by_identity(KEY, _stat(NOW - 2 * seen.SETTLED_NS), demoted=False,
                            decide=_decided(calls))  # fmt: skip
    assert hit is not None
    assert (DOC, _verdict(), []) == (hit.doc, hit.verdict, calls)


def test_a_racy_read_is_never_trusted_by_identity() -> None:
    """Changed within the last second before the read: a write in the same clock tick could
    leave every stat field equal, so only the content can tell."""
    slots = _remembered(ctime_ns=NOW - seen.SETTLED_NS // 2, read_at_ns=NOW)
    same = _stat(NOW - seen.SETTLED_NS // 2)
    assert slots.by_identity(KEY, same, demoted=False, decide=_decided([])) is None


def test_any_stat_field_that_differs_misses() -> None:
    old = NOW - 2 * seen.SETTLED_NS
    slots = _remembered(ctime_ns=old, read_at_ns=NOW)
    for st in (_stat(old + 1), _stat(old, size=1), _stat(old, mtime_ns=6)):
        assert slots.by_identity(KEY, st, demoted=False, decide=_decided([])) is None


def test_the_same_bytes_are_recognised_and_the_identity_refreshed() -> None:
    slots = _remembered(ctime_ns=NOW, read_at_ns=NOW)  # racy
    later = NOW + 5 * seen.SETTLED_NS
    hit = slots.by_content(KEY, DATA, _stat(NOW + 1), read_at_ns=later, demoted=False,
                           decide=_decided([]))  # fmt: skip
    assert hit is not None
    assert slots.by_identity(KEY, _stat(NOW + 1), demoted=False, decide=_decided([])) is not None
    other = slots.by_content(KEY, DATA + b"\n", _stat(NOW + 2), read_at_ns=later, demoted=False,
                             decide=_decided([]))  # fmt: skip
    assert other is None


def test_a_new_context_or_demotion_record_decides_again_from_the_cached_parse() -> None:
    old = NOW - 2 * seen.SETTLED_NS
    slots = _remembered(ctime_ns=old, read_at_ns=NOW)
    calls: list[str] = []
    decide = _decided(calls, Reason.NOT_AMD_HOST)
    assert slots.by_identity(KEY, _stat(old), demoted=False, decide=decide) is not None
    assert [] == calls  # same context
    slots.judge_with("context")  # equal: nothing to do
    slots.by_identity(KEY, _stat(old), demoted=False, decide=decide)
    assert [] == calls
    slots.judge_with("another context")
    hit = slots.by_identity(KEY, _stat(old), demoted=False, decide=decide)
    assert hit is not None
    assert (["a"], Reason.NOT_AMD_HOST) == (calls, hit.verdict.reason)
    slots.by_identity(KEY, _stat(old), demoted=True, decide=decide)
    assert ["a", "a"] == calls


def test_forgotten_and_unlisted_files_are_dropped() -> None:
    old = NOW - 2 * seen.SETTLED_NS
    slots = _remembered(ctime_ns=old, read_at_ns=NOW)
    slots.keep_only(set())
    assert 0 == len(slots)
    slots = _remembered(ctime_ns=old, read_at_ns=NOW)
    slots.forget(KEY)
    assert slots.by_identity(KEY, _stat(old), demoted=False, decide=_decided([])) is None


def test_only_a_settled_read_gives_its_outcome_back_by_identity(tmp_path: Path) -> None:
    """``same_outcomes`` (a full pass: one lstat each) gives back a noted outcome only for a
    settled read of the file as it is now; a racy read, or one found racy again by its
    content, never (only the content can tell); nor for a slot demoted by us."""
    path = tmp_path / "a.toml"
    path.write_bytes(DATA)
    key = SlotKey(str(path))
    st = os.lstat(path)
    settled_at, racy_at = st.st_ctime_ns + 2 * seen.SETTLED_NS, st.st_ctime_ns
    slots = seen.SeenSlots()
    slots.judge_with("context")
    slots.remember(key, DATA, st, DOC, _verdict(), read_at_ns=racy_at, demoted=False)
    slots.note_outcome(key, "outcome", apply=True, keep=True)
    assert ([None], [0]) == slots.same_outcomes([key], apply=True, skip=())
    slots.remember(key, DATA, st, DOC, _verdict(), read_at_ns=settled_at, demoted=False)
    slots.note_outcome(key, "outcome", apply=True, keep=True)
    assert (["outcome"], []) == slots.same_outcomes([key], apply=True, skip=())
    assert ([None], [0]) == slots.same_outcomes([key], apply=False, skip=())  # a dry run's own
    assert ([None], [0]) == slots.same_outcomes([key], apply=True, skip={key})
    hit = slots.by_content(key, DATA, st, read_at_ns=racy_at, demoted=False, decide=_decided([]))
    assert hit is not None  # the same bytes, read racy now: no outcome until noted again
    assert ([None], [0]) == slots.same_outcomes([key], apply=True, skip=())
    slots.remember(key, DATA, st, DOC, _verdict(), read_at_ns=settled_at, demoted=True)
    slots.note_outcome(key, "outcome", apply=True, keep=True)
    assert ([None], [0]) == slots.same_outcomes([key], apply=True, skip=())  # ours: judged anew
