"""Modules read in bounded chunks (``modulescan``) and what the registry makes of each outcome.

Root's own trees are read in this process: a truncation while reading is a short read
("rewritten while read", judged again), never a SIGBUS; a module over the cap or with holes is
not read; the check's deadline stops a read between chunks.
"""

from __future__ import annotations

import ast
import errno
import os
import threading
import time
from pathlib import Path

import pytest

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.registry import cache as registry
from hal0_reconciler.aiter.registry import names as namescan
from hal0_reconciler.aiter.registry import scan as modulescan
from hal0_reconciler.aiter.trees import owner_io as treeio

SRC = Path(__file__).resolve().parents[2] / "src" / "hal0_reconciler"
NAME = "a8w8_blockscale_kernel_1"


def _module(path: Path, *, size: int = 1 << 20, name: str = NAME) -> Path:
    """A dense file of ``size`` bytes holding ``name`` + NUL at its end."""
    tail = name.encode() + b"\0"
    path.write_bytes(b"\x01" * (size - len(tail)) + tail)
    return path


def _scan(path: Path, names: set[str], **kwargs: object) -> modulescan.Scan:
    fd = os.open(path, os.O_RDONLY)
    try:
        return modulescan.scan_fd(fd, names, **kwargs)  # type: ignore[arg-type]
    finally:
        os.close(fd)


def test_no_module_of_the_package_imports_mmap() -> None:
    """No SIGBUS is reachable from a file in a tree: nothing in the package maps a file."""
    mapped = []
    for py in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names]
                if "mmap" in names or getattr(node, "module", None) == "mmap":
                    mapped.append(str(py.relative_to(SRC)))
    assert [] == mapped


def test_a_name_at_the_end_is_found_and_the_size_is_said(tmp_path: Path) -> None:
    got = _scan(_module(tmp_path / "m.so"), {NAME, "other"}, max_bytes=1 << 20, chunk=4096)
    assert (modulescan.Outcome.SCANNED, frozenset({NAME}), 1 << 20) == (
        got.outcome,
        got.found,
        got.size,
    )


def test_at_the_cap_is_read_one_byte_over_is_not(tmp_path: Path) -> None:
    path = _module(tmp_path / "m.so", size=8192)
    assert modulescan.Outcome.SCANNED is _scan(path, {NAME}, max_bytes=8192).outcome
    assert modulescan.Outcome.TOO_LARGE is _scan(path, {NAME}, max_bytes=8191).outcome


def test_a_hole_anywhere_before_the_end_is_sparse(tmp_path: Path) -> None:
    path = _module(tmp_path / "m.so", size=4096)
    with path.open("r+b") as fh:
        fh.seek(64 << 20)
        fh.write(NAME.encode() + b"\0")  # a hole between the first page and the name
    got = _scan(path, {NAME}, max_bytes=1 << 30)
    assert (modulescan.Outcome.SPARSE, frozenset()) == (got.outcome, got.found)


def test_an_empty_module_registers_nothing(tmp_path: Path) -> None:
    (tmp_path / "m.so").write_bytes(b"")
    got = _scan(tmp_path / "m.so", {NAME}, max_bytes=10)
    assert (modulescan.Outcome.SCANNED, frozenset()) == (got.outcome, got.found)


def test_a_module_is_read_in_preads_of_4_mib_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented bound of the reader's memory: every read is one ``pread`` of at most
    4 MiB (a 9 MiB module without the name: read through, 4 + 4 + 1 MiB)."""
    path = _module(tmp_path / "m.so", size=9 << 20)
    real = os.pread
    sizes: list[int] = []

    def spy(fd: int, length: int, offset: int) -> bytes:
        sizes.append(length)
        return real(fd, length, offset)

    monkeypatch.setattr(modulescan.os, "pread", spy)
    got = _scan(path, {"not_in_it"}, max_bytes=1 << 30)
    assert modulescan.Outcome.SCANNED is got.outcome
    assert [4 << 20, 4 << 20, 1 << 20] == sizes


def test_a_hole_is_looked_for_as_the_kernel_answers(tmp_path: Path) -> None:
    """``SEEK_HOLE``'s answers, from the kernel: a file emptied after its size was taken
    (ENXIO) and a file of a filesystem that cannot say (procfs: EINVAL) have no hole; a
    descriptor that cannot seek (a pipe: ESPIPE) is an error, not "no hole"."""
    path = _module(tmp_path / "m.so", size=8192)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.truncate(path, 0)
        assert modulescan.has_hole(fd, size) is False
    finally:
        os.close(fd)
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        assert modulescan.has_hole(fd, 4096) is False
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        with pytest.raises(OSError) as caught:
            modulescan.has_hole(r, 4096)
        assert errno.ESPIPE == caught.value.errno
    finally:
        os.close(r)
        os.close(w)


def test_a_truncation_between_chunks_is_a_short_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is cut to one page after the first chunk was searched: the next ``pread`` is
    short, the answer is CHANGED and the name past the cut is not claimed."""
    path = _module(tmp_path / "m.so", size=1 << 20)
    real = namescan.registered_in
    calls: list[int] = []

    def cut_after_first(data: bytes, names: object, **kw: object) -> dict[str, bool]:
        calls.append(len(data))
        if len(calls) == 1:
            os.truncate(path, 4096)
        return real(data, names, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(namescan, "registered_in", cut_after_first)
    got = _scan(path, {NAME}, max_bytes=1 << 30, chunk=64 << 10)
    assert (modulescan.Outcome.CHANGED, frozenset()) == (got.outcome, got.found)
    assert 1 == len(calls)


def test_a_byte_changed_while_reading_is_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same size, a byte rewritten in place during the read (mtime and ctime move): CHANGED."""
    path = _module(tmp_path / "m.so", size=1 << 20)
    real = namescan.registered_in

    def rewrite(data: bytes, names: object, **kw: object) -> dict[str, bool]:
        with path.open("r+b") as fh:
            fh.write(b"\x02")
        os.utime(path, ns=(1, 1))
        return real(data, names, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(namescan, "registered_in", rewrite)
    got = _scan(path, {NAME}, max_bytes=1 << 30, chunk=256 << 10)
    assert modulescan.Outcome.CHANGED is got.outcome


def test_a_deadline_stops_the_read_between_chunks(tmp_path: Path) -> None:
    path = _module(tmp_path / "m.so")
    got = _scan(path, {NAME}, max_bytes=1 << 30, chunk=4096, deadline=time.monotonic() - 1)
    assert (modulescan.Outcome.OVER_BUDGET, frozenset()) == (got.outcome, got.found)


def test_reading_stops_once_every_name_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.so"
    path.write_bytes(NAME.encode() + b"\0" + b"\x01" * (1 << 20))
    reads: list[int] = []
    real = os.pread

    def counted(fd: int, n: int, off: int) -> bytes:
        reads.append(off)
        return real(fd, n, off)

    monkeypatch.setattr(os, "pread", counted)
    got = _scan(path, {NAME}, max_bytes=1 << 30, chunk=4096)
    assert frozenset({NAME}) == got.found
    assert [0] == reads


def test_a_root_tree_module_truncated_in_a_race_is_never_fatal(tmp_path: Path) -> None:
    """Root's own tree, read in this process: a thread truncates and restores a 32 MiB module
    while the registry reads it, 60 times. Every read ends (a SIGBUS would end this test
    run); each answer is "rewritten while read" or that of the file as it stood through the
    read (whole, or cut to its first page)."""
    path = _module(tmp_path / "m.so", size=32 << 20)
    content = path.read_bytes()
    stop = threading.Event()

    def racer() -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            i = 0
            while not stop.is_set():
                i += 1
                time.sleep((i % 5) * 0.001)
                os.ftruncate(fd, 4096)
                os.pwrite(fd, content, 0)
        finally:
            os.close(fd)

    worker = threading.Thread(target=racer, daemon=True)
    worker.start()
    seen: set[str] = set()
    try:
        for _ in range(60):
            reg = registry.Registry(None)
            try:
                scan = reg.scan(path, {NAME}, io=treeio.local_at(tmp_path))
            except registry.boundedread.ReadRefused as exc:
                seen.add(exc.reason)
            else:
                assert scan is not None  # a consistent read: of the whole file, or of the cut one
                whole = scan.identity[2] == len(content)
                assert {NAME: whole} == scan.registered
                seen.add("read")
    finally:
        stop.set()
        worker.join(10)
    assert registry.REWRITTEN in seen
    assert seen <= {registry.REWRITTEN, "read"}


def test_three_checks_in_a_row_rewritten_keep_changing_and_a_clean_read_resets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _module(tmp_path / "m.so")
    io = treeio.local_at(tmp_path)
    reg = registry.Registry(None)
    real = io.scan
    rewrite = [True]

    def scan_then_touch(*args: object, **kw: object) -> object:
        answer = real(*args, **kw)  # type: ignore[arg-type]
        if rewrite[0]:
            os.utime(path, ns=(time.time_ns(), time.time_ns()))
        return answer

    monkeypatch.setattr(io, "scan", scan_then_touch)
    reasons = []
    for _ in range(4):
        with pytest.raises(registry.boundedread.ReadRefused) as caught:
            reg.scan(path, {NAME}, io=io)
        reasons.append(caught.value.reason)
    assert [registry.REWRITTEN] * 2 == reasons[:2]
    assert reasons[2].startswith(registry.KEEPS_CHANGING)
    assert "at 3 checks in a row" in reasons[2]
    assert "at 4 checks in a row" in reasons[3]
    rewrite[0] = False
    scan = reg.scan(path, {NAME}, io=io)
    assert scan is not None
    assert {NAME: True} == scan.registered
    rewrite[0] = True
    reg._entries.clear()  # read again, as after a change
    with pytest.raises(registry.boundedread.ReadRefused) as again:
        reg.scan(path, {NAME}, io=io)
    assert registry.REWRITTEN == again.value.reason  # the count started over


def test_a_module_over_the_cap_is_refused_before_it_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _module(tmp_path / "m.so", size=2 << 20)
    io = treeio.local_at(tmp_path)

    def never(*_args: object, **_kwargs: object) -> None:
        pytest.fail("the module was read")

    monkeypatch.setattr(io, "scan", never)
    with pytest.raises(registry.boundedread.ReadRefused) as caught:
        registry.Registry(None, max_bytes=1 << 20).scan(path, {NAME}, io=io)
    assert caught.value.reason == (
        f"{registry.TOO_LARGE} ({2 << 20} bytes, over module_max_bytes = {1 << 20})"
    )


def test_past_the_deadline_a_known_module_still_answers_from_the_cache(tmp_path: Path) -> None:
    """Over budget, a module read before answers from the cache; an unknown one is left for
    the next check."""
    known = _module(tmp_path / "a.so")
    unknown = _module(tmp_path / "b.so")
    io = treeio.local_at(tmp_path)
    reg = registry.Registry(None)
    assert reg.scan(known, {NAME}, io=io) is not None
    past = time.monotonic() - 1
    scan = reg.scan(known, {NAME}, io=io, deadline=past)
    assert scan is not None
    assert (False, {NAME: True}) == (scan.read, scan.registered)
    with pytest.raises(registry.boundedread.ReadRefused) as caught:
        reg.scan(unknown, {NAME}, io=io, deadline=past)
    assert registry.OVER_BUDGET == caught.value.reason


def test_a_file_swapped_in_for_the_open_and_back_is_not_credited(tmp_path: Path) -> None:
    """A writer who puts another file in place just for the open and the original back before
    the look after the read: the names found are the other file's, so nothing is credited to
    the module ("rewritten while read"), though its look before and after agree."""
    jit = tmp_path / "jit"
    jit.mkdir()
    path = _module(jit / "module_x.so", name="other_kernel")
    decoy = _module(tmp_path / "decoy.so", name=NAME)
    local = treeio.local_at(jit)

    class Swapping:
        """The tree's own I/O, with the decoy in place only while the module is scanned."""

        def __getattr__(self, name: str) -> object:
            return getattr(local, name)

        def scan(self, *args: object, **kwargs: object) -> object:
            path.rename(tmp_path / "held.so")
            decoy.rename(path)
            try:
                return local.scan(*args, **kwargs)  # type: ignore[arg-type]
            finally:
                path.rename(decoy)
                (tmp_path / "held.so").rename(path)

    reg = registry.Registry(None, max_bytes=1 << 20)
    with pytest.raises(boundedread.ReadRefused, match="rewritten while read"):
        reg.scan(path, {NAME}, io=Swapping())  # type: ignore[arg-type]
    assert {NAME: False} == reg.scan(path, {NAME}, io=local).registered
