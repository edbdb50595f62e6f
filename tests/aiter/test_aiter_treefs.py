"""Tree-relative primitives: nothing beneath a tree root is followed, with openat2 and without."""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler import boundedread
from hal0_reconciler.aiter.trees import fs as treefs
from helpers.descriptors import open_fds


@pytest.fixture(params=["openat2", "walk"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with openat2 (when the kernel has it) and with the per-component walk."""
    if request.param == "openat2":
        if not treefs.OPENAT2:
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(treefs, "OPENAT2", False)
    return str(request.param)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "file").write_bytes(b"inside")
    outside = tmp_path / "secret"
    outside.write_bytes(b"outside")
    outside.chmod(0o600)
    (root / "link").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    os.mkfifo(root / "fifo")
    fd = treefs.open_root(root)
    try:
        yield root, fd
    finally:
        os.close(fd)


def test_a_regular_file_beneath_the_root_is_read(impl: str, tree: tuple[Path, int]) -> None:
    """A plain file two levels down reads back its bytes."""
    _, fd = tree
    assert b"inside" == treefs.read_at(fd, "sub/file", max_bytes=100)


def test_a_final_symlink_is_never_followed(impl: str, tree: tuple[Path, int]) -> None:
    """A link as the last component is refused, not followed to the file it names."""
    _, fd = tree
    with pytest.raises(boundedread.ReadRefused) as caught:
        treefs.read_at(fd, "link", max_bytes=100)
    assert "symlink" in caught.value.reason
    with pytest.raises(OSError) as opened:
        treefs.open_regular(fd, "link")
    assert errno.ELOOP == opened.value.errno


def test_a_symlinked_folder_on_the_way_is_never_followed(impl: str, tree: tuple[Path, int]) -> None:
    """A link as an inner component stops the resolution with ELOOP."""
    _, fd = tree
    with pytest.raises(OSError) as caught:
        treefs.open_regular(fd, "dirlink/secret")
    assert errno.ELOOP == caught.value.errno


def test_dot_dot_and_absolute_paths_are_refused_before_any_call(
    impl: str, tree: tuple[Path, int]
) -> None:
    """'..' and '/etc/passwd' are outside the tree whatever is on disk."""
    _, fd = tree
    for rel in ("../secret", "sub/../../secret", "/etc/passwd"):
        with pytest.raises(treefs.OutsideTree):
            treefs.open_beneath(fd, rel, os.O_PATH)


def test_a_fifo_is_refused_without_blocking(impl: str, tree: tuple[Path, int]) -> None:
    """A FIFO is pinned with O_PATH and refused as not regular; no reader is ever opened."""
    _, fd = tree
    with pytest.raises(boundedread.ReadRefused) as caught:
        treefs.open_regular(fd, "fifo")
    assert "a FIFO, not a regular file" == caught.value.reason


def test_lstat_at_sees_the_link_itself_and_none_when_missing(
    impl: str, tree: tuple[Path, int]
) -> None:
    """lstat of a link is the link; a missing name is None."""
    _, fd = tree
    st = treefs.lstat_at(fd, "link")
    assert st is not None
    assert "a symlink" == boundedread.kind_of_mode(st.st_mode)
    assert None is treefs.lstat_at(fd, "sub/none")


def test_listing_renaming_and_making_folders_stay_beneath(
    impl: str, tree: tuple[Path, int]
) -> None:
    """mkdir, rename (no replace) and listing act on names in the tree's folders."""
    root, fd = tree
    treefs.mkdir_at(fd, "q")
    treefs.rename_at(fd, "sub/file", "q/file")
    assert ["file"] == treefs.listdir_at(fd, "q")
    (root / "sub" / "other").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        treefs.rename_at(fd, "sub/other", "q/file")
    assert b"inside" == (root / "q" / "file").read_bytes()


def test_renaming_into_a_linked_folder_is_refused(impl: str, tree: tuple[Path, int]) -> None:
    """A rename whose target folder is a link never moves anything outside."""
    root, fd = tree
    with pytest.raises(OSError) as caught:
        treefs.rename_at(fd, "sub/file", "dirlink/moved")
    assert errno.ELOOP == caught.value.errno
    assert not (root.parent / "moved").exists()


def test_rmtree_removes_links_never_their_targets(impl: str, tree: tuple[Path, int]) -> None:
    """A folder holding a link to a folder outside is removed; the outside folder stays whole."""
    root, fd = tree
    (root / "sub" / "inner").symlink_to(root.parent)
    treefs.rmtree_at(fd, "sub")
    assert not (root / "sub").exists()
    assert b"outside" == (root.parent / "secret").read_bytes()


def test_rmtree_of_a_link_is_refused(impl: str, tree: tuple[Path, int]) -> None:
    """rmtree of a name that is a link to a folder refuses and removes nothing."""
    root, fd = tree
    with pytest.raises(NotADirectoryError):
        treefs.rmtree_at(fd, "dirlink")
    assert (root.parent / "secret").exists()


def test_an_atomic_write_replaces_a_link_instead_of_following_it(
    impl: str, tree: tuple[Path, int]
) -> None:
    """Writing over a name that is a link replaces the link; the file it named is unchanged."""
    root, fd = tree
    treefs.write_atomic_at(fd, "link", b"new", 0o600)
    assert b"new" == (root / "link").read_bytes()
    assert not (root / "link").is_symlink()
    assert b"outside" == (root.parent / "secret").read_bytes()
    treefs.fsync_dir_at(fd, ".")


def test_a_file_over_its_cap_is_refused_with_its_size(impl: str, tree: tuple[Path, int]) -> None:
    """The cap is checked before reading: the reason names the limit, never the bytes."""
    _, fd = tree
    with pytest.raises(boundedread.ReadRefused) as caught:
        treefs.read_at(fd, "sub/file", max_bytes=3)
    assert "larger than the 3-byte limit (6 bytes)" == caught.value.reason


@pytest.mark.parametrize("noreplace", [True, False])
def test_renames_and_folder_fsyncs_leave_no_descriptor_open(
    impl: str, tree: tuple[Path, int], noreplace: bool
) -> None:
    """Each of ``rename_at`` and ``fsync_dir_at`` closes every folder fd it opened, when it
    works and when it fails (the daemon does thousands over its life)."""
    root, fd = tree
    before = open_fds()
    for i in range(3):
        (root / "sub" / f"n{i}").write_bytes(b"x")
        treefs.rename_at(fd, f"sub/n{i}", f"m{i}", noreplace=noreplace)
        treefs.fsync_dir_at(fd, "sub")
        treefs.fsync_dir_at(fd, ".")
    with pytest.raises(FileNotFoundError):
        treefs.rename_at(fd, "sub/absent", "m9", noreplace=noreplace)
    with pytest.raises(OSError, match="m0"):
        treefs.rename_at(fd, "sub/file", "m0", noreplace=True)  # exists: refused
    with pytest.raises(OSError):
        treefs.fsync_dir_at(fd, "link")
    treefs.mkdir_at(fd, "sub/made")
    with pytest.raises(FileExistsError):
        treefs.mkdir_at(fd, "sub/made")
    assert before == open_fds()
    assert [f"m{i}" for i in range(3)] == sorted(n for n in os.listdir(root) if n[0] == "m")


def test_the_resolve_flags_are_the_kernels() -> None:
    """``<linux/openat2.h>``: the values are ABI, a wrong one would resolve differently."""
    assert (0x01, 0x02, 0x04, 0x08) == (
        treefs.RESOLVE_NO_XDEV,
        treefs.RESOLVE_NO_MAGICLINKS,
        treefs.RESOLVE_NO_SYMLINKS,
        treefs.RESOLVE_BENEATH,
    )


def test_openat2_is_used_where_the_kernel_has_it() -> None:
    """Linux 5.6+ on x86_64 and aarch64 has openat2: the one-call resolution is taken."""
    release = tuple(int(x) for x in platform.release().split(".")[:2])
    if platform.machine() not in ("x86_64", "aarch64") or release < (5, 6):
        pytest.skip("no openat2 on this kernel")
    assert treefs._probe_openat2()
    assert treefs.OPENAT2


def test_the_root_itself_has_no_components() -> None:
    assert ((), (), ("a", "b")) == (
        treefs.parts_of(""),
        treefs.parts_of("."),
        treefs.parts_of("a/b"),
    )


def test_files_opened_beneath_are_close_on_exec_and_made_private(
    impl: str, tree: tuple[Path, int]
) -> None:
    """Every fd is ``O_CLOEXEC`` (a program the daemon runs inherits none), and a file made
    without a mode is 0600."""
    root, fd = tree
    old = os.umask(0)
    try:
        made = treefs.open_beneath(fd, "sub/new", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    finally:
        os.umask(old)
    read = treefs.open_beneath(fd, "sub/file", os.O_RDONLY)
    try:
        for opened in (made, read):
            assert fcntl.fcntl(opened, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(made)
        os.close(read)
    assert 0o600 == (root / "sub/new").stat().st_mode & 0o777


def test_listing_and_reading_leave_no_descriptor_open(impl: str, tree: tuple[Path, int]) -> None:
    _, fd = tree
    before = open_fds()
    for _ in range(3):
        assert ["file"] == treefs.listdir_at(fd, "sub")
        assert b"inside" == treefs.read_at(fd, "sub/file", max_bytes=100)
        with pytest.raises(boundedread.ReadRefused):
            treefs.read_at(fd, "sub/file", max_bytes=2)
    assert before == open_fds()


def test_a_missing_folder_on_the_way_is_none_only_when_asked(
    impl: str, tree: tuple[Path, int]
) -> None:
    _, fd = tree
    assert None is treefs.read_at(fd, "nope/file", max_bytes=100, missing_ok=True)
    with pytest.raises(boundedread.ReadRefused, match="missing"):
        treefs.read_at(fd, "nope/file", max_bytes=100)


def test_a_name_that_is_gone_is_not_a_link(tree: tuple[Path, int]) -> None:
    _, fd = tree
    assert (False, True) == (treefs._is_link(fd, "gone"), treefs._is_link(fd, "link"))


def test_renaming_a_missing_file_onto_an_existing_one_says_the_source_is_missing(
    impl: str, tree: tuple[Path, int]
) -> None:
    """``renameat2``'s own error is raised (not the fallback's "exists" check)."""
    root, fd = tree
    with pytest.raises(FileNotFoundError):
        treefs.rename_at(fd, "sub/absent", "sub/file", noreplace=True)
    assert b"inside" == (root / "sub/file").read_bytes()


def test_folder_fsyncs_and_atomic_writes_reach_the_disk(
    impl: str, tree: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fsync_dir_at`` fsyncs the folder itself; ``write_atomic_at`` the file and then its
    folder (the rename is durable); neither leaves a descriptor open."""
    root, fd = tree
    synced: list[int] = []
    real = os.fsync

    def spy(target: int) -> None:
        synced.append(os.fstat(target).st_ino)
        real(target)

    monkeypatch.setattr(os, "fsync", spy)
    before = open_fds()
    treefs.fsync_dir_at(fd, "sub")
    assert [(root / "sub").stat().st_ino] == synced
    synced.clear()
    treefs.write_atomic_at(fd, "sub/w", b"new", 0o640)
    assert [(root / "sub/w").stat().st_ino, (root / "sub").stat().st_ino] == synced
    assert before == open_fds()
    assert (b"new", 0o640) == (
        (root / "sub/w").read_bytes(),
        (root / "sub/w").stat().st_mode & 0o777,
    )


def test_an_atomic_write_that_fails_raises_and_leaves_nothing(
    impl: str, tree: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refuses the write (EIO at the fsync): the error is raised, the temp file is
    removed, its fd closed, the old file untouched."""
    root, fd = tree

    def broken(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    before = open_fds()
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output error"):
        treefs.write_atomic_at(fd, "sub/file", b"replaced")
    monkeypatch.undo()
    assert before == open_fds()
    assert b"inside" == (root / "sub/file").read_bytes()
    assert ["file"] == sorted(os.listdir(root / "sub"))


def test_the_openat2_probe_leaves_no_descriptor_open() -> None:
    before = open_fds()
    for _ in range(3):
        treefs._probe_openat2()
    assert before == open_fds()


def test_a_missing_folder_on_the_way_is_not_found(impl: str, tree: tuple[Path, int]) -> None:
    _root, fd = tree
    with pytest.raises(FileNotFoundError):
        treefs.open_regular(fd, "missing/deeper/file")


def test_the_trees_own_lstat_is_its_roots(tree: tuple[Path, int]) -> None:
    root, fd = tree
    st = treefs.lstat_at(fd, "")
    assert st is not None
    assert (root.stat().st_dev, root.stat().st_ino) == (st.st_dev, st.st_ino)


def test_folders_and_files_made_beneath_take_their_default_modes(
    impl: str, tree: tuple[Path, int]
) -> None:
    root, fd = tree
    old = os.umask(0)
    try:
        treefs.mkdir_at(fd, "sub/made")
        treefs.write_atomic_at(fd, "sub/written", b"x")
    finally:
        os.umask(old)
    modes = [stat.S_IMODE((root / "sub" / n).lstat().st_mode) for n in ("made", "written")]
    assert [0o755, 0o644] == modes


def test_without_renameat2_a_rename_checks_then_renames(
    tree: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where libc has no renameat2: the destination is looked at first, then renamed; an
    existing one is still never replaced."""
    root, fd = tree
    monkeypatch.setattr(treefs, "_LIBC", None)  # no renameat2, and so no openat2 either
    monkeypatch.setattr(treefs, "OPENAT2", False)
    treefs.rename_at(fd, "sub/file", "sub/moved")
    assert (False, b"inside") == (
        (root / "sub" / "file").exists(),
        (root / "sub" / "moved").read_bytes(),
    )
    (root / "sub" / "other").write_bytes(b"other")
    with pytest.raises(FileExistsError):
        treefs.rename_at(fd, "sub/moved", "sub/other")
    assert b"other" == (root / "sub" / "other").read_bytes()


@pytest.mark.parametrize("kind", ["link", "file"])
def test_removing_a_folder_that_is_not_one_names_it_and_follows_nothing(
    tmp_path: Path, kind: str
) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "kept").write_bytes(b"kept")
    if kind == "link":
        (tmp_path / "q").symlink_to(tmp_path / "target")
    else:
        (tmp_path / "q").write_bytes(b"")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(NotADirectoryError) as caught:
            treefs.rmtree_in(fd, "q")
    finally:
        os.close(fd)
    assert "not a folder (never followed)" == caught.value.strerror
    assert b"kept" == (tmp_path / "target" / "kept").read_bytes()


def test_removing_a_folder_removes_every_level_and_leaves_no_descriptor(tmp_path: Path) -> None:
    deep = tmp_path / "q" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for level in (tmp_path / "q", deep.parent, deep):
        (level / "f").write_bytes(b"f")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    before = open_fds()
    try:
        treefs.rmtree_in(fd, "q")
        assert before == open_fds()
    finally:
        os.close(fd)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize(
    ("rel", "reason"),
    [
        ("dirlink/secret", "a symlink on the way (never followed)"),
        ("x" * 300 + "/f", "cannot be opened (file name too long)"),
    ],
    ids=["link-on-the-way", "name-too-long"],
)
def test_a_file_whose_way_cannot_be_opened_says_why(
    impl: str, tree: tuple[Path, int], rel: str, reason: str
) -> None:
    _root, fd = tree
    with pytest.raises(boundedread.ReadRefused) as caught:
        treefs.read_at(fd, rel, max_bytes=1 << 10)
    assert reason == caught.value.reason


def test_no_openat2_is_found_without_libc_or_when_the_call_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails(*_args: object, **_kwargs: object) -> int:
        raise OSError(errno.ENOSYS, "no openat2")

    monkeypatch.setattr(treefs, "_openat2_raw", fails)
    assert treefs._probe_openat2() is False
    monkeypatch.setattr(treefs, "_LIBC", None)
    assert treefs._probe_openat2() is False


def test_openat2_without_libc_says_it_is_not_available(
    tree: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _root, fd = tree
    monkeypatch.setattr(treefs, "_LIBC", None)
    with pytest.raises(OSError, match="openat2 is not available") as caught:
        treefs._openat2_raw(fd, "sub", os.O_PATH, close_dir=False)
    assert errno.ENOSYS == caught.value.errno


def test_the_walk_closes_every_folder_it_passes_and_a_link_it_pinned(
    impl: str, tree: tuple[Path, int]
) -> None:
    root, fd = tree
    (root / "sub" / "a" / "b").mkdir(parents=True)
    (root / "sub" / "a" / "b" / "f").write_bytes(b"deep")
    before = open_fds()
    for _ in range(3):
        assert b"deep" == treefs.read_at(fd, "sub/a/b/f", max_bytes=100)
        with pytest.raises(OSError) as caught:
            treefs.open_beneath(fd, "link", os.O_PATH)
        assert errno.ELOOP == caught.value.errno
        treefs.mkdir_at(fd, "sub/a/b/gone")
        treefs.rmtree_at(fd, "sub/a/b/gone")
    assert before == open_fds()


def test_the_tree_root_has_no_parent_inside_the_tree(tree: tuple[Path, int]) -> None:
    _root, fd = tree
    for rel in ("", ".", "./"):
        with pytest.raises(treefs.OutsideTree, match="no name inside the tree"):
            treefs.parent_of(fd, rel)


def test_without_renameat2_a_dangling_link_at_the_destination_is_not_replaced(
    tree: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, fd = tree
    monkeypatch.setattr(treefs, "_LIBC", None)
    monkeypatch.setattr(treefs, "OPENAT2", False)
    (root / "sub" / "dangling").symlink_to(root / "nowhere")
    with pytest.raises(FileExistsError):
        treefs.rename_at(fd, "sub/file", "sub/dangling")
    assert ((root / "sub" / "dangling").is_symlink(), b"inside") == (
        True,
        (root / "sub" / "file").read_bytes(),
    )


def test_an_atomic_write_takes_its_mode_whatever_the_umask(tree: tuple[Path, int]) -> None:
    root, fd = tree
    old = os.umask(0o077)
    try:
        treefs.write_atomic_at(fd, "sub/default", b"x")
        treefs.write_atomic_at(fd, "sub/asked", b"x", 0o640)
    finally:
        os.umask(old)
    modes = [stat.S_IMODE((root / "sub" / n).stat().st_mode) for n in ("default", "asked")]
    assert [0o644, 0o640] == modes
