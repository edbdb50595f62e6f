"""The owner's child's request loop (``treechild``): what it refuses, what it closes, its caps.

Driven three ways: ``Child.handle`` directly (what root's own trees run in-process), ``Child.serve``
over a real ``SOCK_SEQPACKET`` pair in a thread (the loop itself), and a real child process.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.quarantine import as_owner_child as owner_heal_child
from hal0_reconciler.aiter.trees import child as treechild
from hal0_reconciler.aiter.trees import fs as treefs
from hal0_reconciler.aiter.trees import owner_io as treeio
from helpers.descriptors import open_fds


@pytest.fixture
def root(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "m.so").write_bytes(b"\x7fELF\0kernel_a\0" + b"\1" * 4096)
    return tree


@pytest.fixture
def served(root: Path) -> Iterator[socket.socket]:
    """Our end of a socket whose other end a ``Child.serve`` loop answers, in a thread."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.settimeout(10)
    loop = threading.Thread(
        target=treechild.Child([str(root)], theirs).serve, args=(theirs,), daemon=True
    )
    loop.start()
    try:
        yield ours
    finally:
        ours.close()
        loop.join(10)
        theirs.close()
    assert not loop.is_alive()


def _ask(sock: socket.socket, req: object, fds: list[int] | None = None) -> dict[str, Any]:
    data = json.dumps(req).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)
    msg, got, _flags, _addr = socket.recv_fds(sock, treechild.MAX_MESSAGE, 2)
    for fd in got:
        os.close(fd)
    answer = json.loads(msg)
    assert isinstance(answer, dict)
    return answer


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("test")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def test_a_root_index_out_of_range_is_outside_every_tree(root: Path) -> None:
    child = treechild.Child([str(root)])
    for index in (1, -1, "0", None):
        with pytest.raises(treefs.OutsideTree):
            child.handle({"op": "lstat", "root": index, "path": "m.so"}, [])


def test_unknown_operations_and_missing_descriptors_are_refused(root: Path) -> None:
    child = treechild.Child([str(root)])
    assert {"refused": "unknown operation 'chmod'"} == child.handle(
        {"op": "chmod", "root": 0, "path": "m.so"}, []
    )[0]
    assert {"refused": "no data descriptor"} == child.handle(
        {"op": "write", "root": 0, "path": "new"}, []
    )[0]
    assert {"refused": "no names descriptor"} == child.handle(
        {"op": "scan", "root": 0, "path": "m.so", "max_bytes": 1 << 20}, []
    )[0]
    assert not (root / "new").exists()


@pytest.mark.parametrize("op", sorted(owner_heal_child.OPS))
def test_a_heal_operation_runs_only_in_the_owners_child(root: Path, op: str) -> None:
    """Without the socket to root's digest book (root's own tree, in-process) a heal
    operation is refused, nothing moved."""
    before = sorted(os.listdir(root))
    answer, fds = treechild.Child([str(root)]).handle({"op": op, "root": 0, "path": "."}, [])
    assert ({"refused": "a heal runs only in the owner's child"}, []) == (answer, fds)
    assert before == sorted(os.listdir(root))


def test_a_folder_made_through_the_child_has_the_mode_asked(root: Path) -> None:
    old = os.umask(0)
    try:
        treechild.Child([str(root)]).handle(
            {"op": "mkdir", "root": 0, "path": "q", "mode": 0o750}, []
        )
        treechild.Child([str(root)]).handle({"op": "mkdir", "root": 0, "path": "d"}, [])
    finally:
        os.umask(old)
    assert 0o750 == stat.S_IMODE((root / "q").stat().st_mode)
    assert 0o755 == stat.S_IMODE((root / "d").stat().st_mode)


def test_a_scan_names_list_that_is_not_strings_is_refused(root: Path) -> None:
    for names in ({"kernel_a": 1}, ["kernel_a", 3], "kernel_a"):
        fd = _memfd(json.dumps(names).encode())
        try:
            answer, _ = treechild.Child([str(root)]).handle(
                {"op": "scan", "root": 0, "path": "m.so", "max_bytes": 1 << 20}, [fd]
            )
        finally:
            os.close(fd)
        assert {"refused": "bad request: names is not a list of strings"} == answer


def test_a_scan_answers_indices_of_the_names_found_and_closes_the_module(root: Path) -> None:
    """Root's own tree in-process: the module's fd is closed after the scan (thousands of
    checks must not leak one each)."""
    io = treeio.local_at(root)
    before = open_fds()
    for _ in range(3):
        st, outcome, found = io.scan(
            root / "m.so", ["kernel_b", "kernel_a", "ELF"], max_bytes=1 << 20
        )
        assert (str(outcome), found, st.size) == ("scanned", frozenset({"kernel_a", "ELF"}), 4110)
    assert before == open_fds()
    names_fd = _memfd(b'["nope", "kernel_a"]')
    try:
        answer, _ = treechild.Child([str(root)]).handle(
            {"op": "scan", "root": 0, "path": "m.so", "max_bytes": 1 << 20}, [names_fd]
        )
    finally:
        os.close(names_fd)
    assert ([1], "scanned") == (answer["found"], answer["outcome"])


def test_a_scan_without_its_cap_is_refused(root: Path) -> None:
    for cap in ({}, {"max_bytes": "1048576"}, {"max_bytes": True}, {"max_bytes": None}):
        fd = _memfd(b'["kernel_a"]')
        try:
            answer, _ = treechild.Child([str(root)]).handle(
                {"op": "scan", "root": 0, "path": "m.so", **cap}, [fd]
            )
        finally:
            os.close(fd)
        assert {"refused": "bad request: no max_bytes"} == answer


def test_a_bad_root_index_answers_no_errno_the_parent_could_mistake(
    served: socket.socket,
) -> None:
    """Not EPERM (root would take it for a folder the owner cannot read): errno 0."""
    answer = _ask(served, {"op": "list", "root": 7, "path": "."})
    assert 0 == answer["errno"]
    with pytest.raises(OSError) as caught:
        treeio._checked(answer, "x")  # the parent's reading of the answer
    assert type(caught.value) is OSError


def test_a_request_that_is_not_an_object_is_a_bad_request(served: socket.socket) -> None:
    assert {"refused": "bad request: not an object"} == _ask(served, ["lstat", 0, "m.so"])
    assert "stat" in _ask(served, {"op": "lstat", "root": 0, "path": "m.so"})  # still serving


def test_the_loop_closes_every_descriptor_it_is_sent(served: socket.socket, root: Path) -> None:
    """Descriptors that come with requests (data to write, names to look for, or none
    expected) are closed once the request is answered, whatever the answer."""
    before = open_fds()
    sent = [_memfd(b'["kernel_a"]') for _ in range(3)]
    try:
        _ask(served, {"op": "scan", "root": 0, "path": "m.so", "max_bytes": 1 << 20}, [sent[0]])
        _ask(served, {"op": "lstat", "root": 0, "path": "m.so"}, [sent[1]])
        _ask(served, {"op": "write", "root": 0, "path": "w", "mode": 0o644}, [sent[2]])
    finally:
        for fd in sent:
            os.close(fd)
    assert before == open_fds()
    assert b'["kernel_a"]' == (root / "w").read_bytes()


def _names_of_length(total: int) -> list[str]:
    """File names whose listing answer (``{"names": [...]}``) is exactly ``total`` bytes."""
    overhead = len(json.dumps({"names": []}))
    each = 200
    count, rest = divmod(total - overhead + 2, each + 4)  # '"<name>", ' per name, less the last
    names = [f"{i:05d}".ljust(each, "n") for i in range(count)]
    names[-1] = names[-1] + "x" * rest  # longer: the answer is exactly ``total`` bytes
    assert total == len(json.dumps({"names": sorted(names)}))
    return names


MESSAGE_CAP = 160 * 1024  # docs/aiter-trees.md: one socket message, 160 KiB at most


@pytest.mark.parametrize("over", [0, 1])
def test_an_answer_over_one_message_is_refused_and_one_at_the_cap_is_not(
    tmp_path: Path, over: int
) -> None:
    """A listing whose answer is just over ``MAX_MESSAGE`` (160 KiB) is "answer too large";
    at the cap it is answered (through a real child)."""
    folder = tmp_path / "many"
    folder.mkdir()
    assert MESSAGE_CAP == treechild.MAX_MESSAGE
    for name in _names_of_length(MESSAGE_CAP + over):
        (folder / name).touch()
    roots = (treeio.Root(PurePosixPath(folder), PurePosixPath(folder)),)
    io = treeio.ChildTree(roots, treeio.ROOT, timeout=20)
    try:
        if over:
            with pytest.raises(boundedread.ReadRefused, match="answer too large"):
                io.listdir(folder)
        else:
            assert len(os.listdir(folder)) == len(io.listdir(folder))
    finally:
        io.close()


def _in_fork(code: Any) -> Any:
    """``code()`` in a forked copy of this process (credentials change for good there); its
    JSON answer."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked copy
        os.close(read)
        try:
            answer = json.dumps(code()).encode()
        except BaseException as exc:
            answer = json.dumps(f"raised {exc!r}").encode()
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _drop_and_look(uid: int, gid: int) -> Any:
    why = treechild.drop_to(uid, gid, [gid])
    return [why, list(os.getresuid()), list(os.getresgid()), sorted(os.getgroups())]


@pytest.mark.parametrize(
    ("uid", "gid"), [(0, 4321), (4321, 0), (4321, 4321)], ids=["group-only", "user-only", "both"]
)
def test_the_child_becomes_exactly_the_owner(uid: int, gid: int) -> None:
    """Whatever part of the identity changes (the group alone, the user alone, both), the
    child ends with exactly those ids, and nothing said."""
    assert [None, [uid] * 3, [gid] * 3, [gid]] == _in_fork(lambda: _drop_and_look(uid, gid))


def test_a_child_that_cannot_change_its_credentials_says_why() -> None:
    def attempt() -> Any:
        os.setgroups([4321])
        os.setgid(4321)
        os.setuid(4321)
        return treechild.drop_to(4322, 4322, [4322])

    assert "cannot become uid 4322 gid 4322: Operation not permitted" == _in_fork(attempt)


def test_a_child_whose_credentials_did_not_change_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(treechild.os, "setuid", lambda _uid: None)
    assert "credentials did not change to uid 4321 gid 4321" == _in_fork(
        lambda: treechild.drop_to(4321, 4321, [4321])
    )


def test_a_rename_replaces_nothing_unless_asked(root: Path) -> None:
    (root / "other").write_bytes(b"other")
    child = treechild.Child([str(root)])
    with pytest.raises(FileExistsError):
        child.handle({"op": "rename", "root": 0, "path": "m.so", "dst": "other"}, [])
    assert b"other" == (root / "other").read_bytes()


def test_an_fsync_of_a_folder_that_is_not_there_fails(root: Path) -> None:
    with pytest.raises(FileNotFoundError):
        treechild.Child([str(root)]).handle({"op": "fsync", "root": 0, "path": "missing"}, [])


def test_a_file_written_through_the_child_has_the_mode_asked(root: Path) -> None:
    old = os.umask(0)
    try:
        for name, mode in (("asked", {"mode": 0o600}), ("default", {})):
            fd = _memfd(b"data")
            try:
                treechild.Child([str(root)]).handle(
                    {"op": "write", "root": 0, "path": name, **mode}, [fd]
                )
            finally:
                os.close(fd)
    finally:
        os.umask(old)
    assert (0o600, 0o644) == tuple(
        stat.S_IMODE((root / n).stat().st_mode) for n in ("asked", "default")
    )


def _into(tree: Path) -> set[str]:
    """This process's descriptors open on something inside ``tree`` (other tests' threads may
    open and close descriptors of their own meanwhile: those are not counted)."""
    inside: set[str] = set()
    for fd in open_fds():
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since the listing
        if target == str(tree) or target.startswith(f"{tree}/"):
            inside.add(fd)
    return inside


def test_the_loop_closes_every_descriptor_it_sends(served: socket.socket, root: Path) -> None:
    before = _into(root)
    for _ in range(3):
        assert "stat" in _ask(served, {"op": "open", "root": 0, "path": "m.so"})
    # the loop closes its copy after sending it: the next answer says it is past that
    assert "refused" in _ask(served, {"op": "nothing", "root": 0, "path": "m.so"})
    assert before == _into(root)


def test_a_names_list_over_its_cap_is_refused_and_one_at_it_is_scanned(root: Path) -> None:
    cap = 16 << 20  # the documented cap on a scan's list of names
    for size, refused in ((cap, False), (cap + 1, True)):
        fd = _memfd(b'["' + b"a" * (size - 4) + b'"]')
        request = {"op": "scan", "root": 0, "path": "m.so", "max_bytes": 1 << 20}
        try:
            if refused:
                with pytest.raises(boundedread.ReadRefused):
                    treechild.Child([str(root)]).handle(request, [fd])
            else:
                answer, _ = treechild.Child([str(root)]).handle(request, [fd])
                assert ([], "scanned") == (answer["found"], answer["outcome"])
        finally:
            os.close(fd)


def test_a_file_to_write_over_its_cap_is_refused_and_one_at_it_is_written(root: Path) -> None:
    cap = 1 << 20  # the child's documented cap (a manifest or journal is far smaller)
    for name, size in (("at-cap", cap), ("over-cap", cap + 1)):
        fd = _memfd(b"x" * size)
        request = {"op": "write", "root": 0, "path": name, "mode": 0o600}
        try:
            if size > cap:
                with pytest.raises(boundedread.ReadRefused):
                    treechild.Child([str(root)]).handle(request, [fd])
            else:
                treechild.Child([str(root)]).handle(request, [fd])
        finally:
            os.close(fd)
    assert (cap, False) == ((root / "at-cap").stat().st_size, (root / "over-cap").exists())
