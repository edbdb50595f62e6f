"""The quarantine's own folder operations, by folder fds: what they make, what they refuse and
in which words, and that a refusal leaves no fd open."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.aiter.quarantine import folder
from helpers.descriptors import open_fds


@pytest.fixture
def here(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield tmp_path, fd
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("name", "plain"),
    [("q-1", True), ("", False), (".", False), ("..", False), ("a/b", False), ("a\0b", False)],
)
def test_a_component_is_one_plain_name(name: str, plain: bool) -> None:
    assert plain is folder.is_component(name)


def test_folders_and_files_the_quarantine_makes_are_its_owners_alone(
    here: tuple[Path, int],
) -> None:
    path, fd = here
    old = os.umask(0)
    try:
        made = folder.open_owned_dir(fd, "made", uid=os.getuid(), label="q", create=True)
        os.close(made)
        assert folder.make_dir(fd, "other")
        assert not folder.make_dir(fd, "other"), "a taken name is never reused"
        folder.write_file(fd, "journal.json", b"{}")
    finally:
        os.umask(old)
    modes = {n: stat.S_IMODE((path / n).stat().st_mode) for n in ("made", "other", "journal.json")}
    assert {"made": 0o700, "other": 0o700, "journal.json": 0o600} == modes


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: p.symlink_to("/etc"), "a symlink"),
        (lambda p: p.write_bytes(b""), "a regular file"),
        (os.mkfifo, "a FIFO"),
    ],
    ids=["link", "file", "fifo"],
)
def test_what_stands_where_a_folder_should_be_is_named(here: tuple[Path, int], make, kind) -> None:
    path, fd = here
    make(path / "q")
    before = open_fds()
    with pytest.raises(folder.FolderRefused, match=rf"^q is {kind}, not a real folder: refused$"):
        folder.open_owned_dir(fd, "q", uid=os.getuid(), label="q")
    assert before == open_fds()


def test_a_folder_owned_or_writable_by_another_is_refused_and_closed(
    here: tuple[Path, int],
) -> None:
    path, fd = here
    (path / "theirs").mkdir()
    os.chown(path / "theirs", 4242, 4242)
    (path / "open").mkdir(mode=0o700)
    (path / "open").chmod(0o770)
    before = open_fds()
    with pytest.raises(folder.FolderRefused, match="owned by uid 4242, not by uid 0"):
        folder.open_owned_dir(fd, "theirs", uid=0, label="theirs")
    with pytest.raises(folder.FolderRefused, match="writable by others"):
        folder.open_owned_dir(fd, "open", uid=0, label="open")
    assert before == open_fds()


def test_listing_a_folder_leaves_its_fd_and_no_other_open(here: tuple[Path, int]) -> None:
    path, fd = here
    (path / "b").write_bytes(b"")
    (path / "a").mkdir()
    before = open_fds()
    assert ["a", "b"] == folder.entries(fd)
    assert ["a", "b"] == folder.entries(fd), "the fd's own offset is left where it was"
    assert before == open_fds()


@pytest.mark.parametrize("make", [lambda p: p.symlink_to("/etc"), lambda p: p.write_bytes(b"")])
def test_removing_a_link_or_a_file_where_a_folder_was_is_refused_by_its_label(
    here: tuple[Path, int], make
) -> None:
    path, fd = here
    make(path / "q")
    with pytest.raises(
        folder.FolderRefused, match=r"^q-label is not a real folder \(a link\?\): not removed$"
    ):
        folder.rmtree(fd, "q", label="q-label")
    assert os.path.lexists(path / "q"), "what is there stays"


def test_removing_what_is_not_there_says_so(here: tuple[Path, int]) -> None:
    _path, fd = here
    with pytest.raises(FileNotFoundError):
        folder.rmtree(fd, "missing", label="q")


def test_a_jit_folder_that_is_a_link_or_missing(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(folder.FolderRefused, match=r"link is not a real folder: refused$"):
        folder.open_jit(tmp_path / "link")
    with pytest.raises(FileNotFoundError):
        folder.open_jit(tmp_path / "missing")
    fd = folder.open_jit(tmp_path)
    os.close(fd)


def test_an_entry_gone_before_it_could_be_named_is_said_to_be_no_folder(
    here: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open failed on a link that is gone when it is looked at: "not a folder"."""
    path, fd = here
    (path / "q").symlink_to("/etc")
    monkeypatch.setattr(folder, "lstat_at", lambda _fd, _name: None)
    with pytest.raises(folder.FolderRefused, match=r"^q is not a folder, not a real folder"):
        folder.open_dir(fd, "q", label="q")
