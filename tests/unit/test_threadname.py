"""Threads named for the kernel too: what ``ps -L`` and ``/proc/<pid>/task/*/comm`` show."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler import threadname


def _comm(thread: threading.Thread) -> str:
    assert thread.native_id is not None
    return Path(f"/proc/self/task/{thread.native_id}/comm").read_text().rstrip("\n")


def _parked(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait(10)


def test_a_started_thread_is_named_in_python_and_in_the_kernel() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threadname.start(_parked, "hal0-test-one", args=(ready, release))
    try:
        assert ready.wait(10)
        assert thread.name == "hal0-test-one"
        assert _comm(thread) == "hal0-test-one"
        assert thread.daemon
    finally:
        release.set()
        thread.join(10)


def test_a_long_name_is_cut_to_the_kernels_fifteen_bytes() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threadname.NamedThread(
        target=_parked, args=(ready, release), name="hal0-a-very-long-thread-name"
    )
    thread.start()
    try:
        assert ready.wait(10)
        assert thread.name == "hal0-a-very-long-thread-name"  # Python keeps it whole
        assert _comm(thread) == "hal0-a-very-lon"
    finally:
        release.set()
        thread.join(10)


def test_the_cut_never_splits_a_character() -> None:
    assert threadname.kernel_name("hal0-ééééééééé") == "hal0-ééééé".encode()
    assert b"x" * 15 == threadname.kernel_name("x" * 40)  # TASK_COMM_LEN, less its NUL


def test_a_thread_that_runs_none_of_our_code_is_named_from_outside() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_parked, args=(ready, release), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        assert _comm(thread) != "hal0-outsider"
        assert threadname.name_other(thread, "hal0-outsider")
        assert thread.name == "hal0-outsider"
        assert _comm(thread) == "hal0-outsider"
    finally:
        release.set()
        thread.join(10)


def test_a_finished_thread_is_not_named_in_the_kernel() -> None:
    thread = threading.Thread(target=lambda: None, name="Done")
    thread.start()
    thread.join(10)
    assert not threadname.name_other(thread, "hal0-gone")
    assert "Done" == thread.name  # its handle is never used: the pthread may be gone


def test_a_thread_not_yet_running_keeps_its_name_to_be_named_when_asked_again() -> None:
    """A thread still starting (listed by threading.enumerate(), no kernel thread yet) is left
    as it is: named once, in Python only, it would never be looked at again."""
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_parked, args=(ready, release), name="Starting", daemon=True)
    assert not threadname.name_other(thread, "hal0-early")
    assert "Starting" == thread.name
    thread.start()
    try:
        assert ready.wait(10)
        assert threadname.name_other(thread, "hal0-early")
        assert ("hal0-early", "hal0-early") == (thread.name, _comm(thread))
    finally:
        release.set()
        thread.join(10)


def test_the_calling_thread_names_itself() -> None:
    result: dict[str, object] = {}

    def run() -> None:
        result["ok"] = threadname.name_current("hal0-self")
        result["comm"] = Path("/proc/thread-self/comm").read_text().rstrip("\n")
        result["name"] = threading.current_thread().name

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert result == {"ok": True, "comm": "hal0-self", "name": "hal0-self"}


class _Refusing:
    """A C library whose naming calls fail as a foreign or broken one's would."""

    def __init__(self, error: type[Exception] | None) -> None:
        def fail(*_args: Any) -> int:
            if error is not None:
                raise error("refused")
            return -1

        self.prctl = self.pthread_setname_np = fail  # plain functions: argtypes can be set


class _WithoutSetname:
    prctl = staticmethod(lambda *_args: 0)


@pytest.mark.parametrize(
    "libc",
    [None, _Refusing(None), _Refusing(OSError), _Refusing(ctypes.ArgumentError), _WithoutSetname()],
    ids=["no-libc", "says-no", "oserror", "argumenterror", "no-pthread_setname_np"],
)
def test_where_the_kernel_cannot_take_a_name_only_the_python_name_is_set(
    monkeypatch: pytest.MonkeyPatch, libc: object
) -> None:
    """Naming never fails the caller: without a C library, or when its call fails or is
    missing, the answer is False and the Python name is set all the same."""
    monkeypatch.setattr(threadname, "_libc", libc)
    monkeypatch.setattr(threadname, "_loaded", True)
    ready, release = threading.Event(), threading.Event()
    outsider = threading.Thread(target=_parked, args=(ready, release), daemon=True)
    outsider.start()
    result: dict[str, object] = {}

    def run() -> None:
        result["self"] = threadname.name_current("hal0-self")
        result["name"] = threading.current_thread().name

    try:
        assert ready.wait(10)
        assert not threadname.name_other(outsider, "hal0-outsider")
        assert "hal0-outsider" == outsider.name
        own = threading.Thread(target=run, daemon=True)
        own.start()
        own.join(10)
        naming_self_works = isinstance(libc, _WithoutSetname)  # its prctl says yes
        assert {"self": naming_self_works, "name": "hal0-self"} == result
    finally:
        release.set()
        outsider.join(10)
