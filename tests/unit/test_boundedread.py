"""The bounded reader: regular files only, never blocking, never following, never over the cap."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hal0_reconciler import boundedread


def _refusal(path: Path, **kwargs: object) -> str:
    with pytest.raises(boundedread.ReadRefused) as caught:
        boundedread.read_bounded(path, max_bytes=10, **kwargs)  # type: ignore[arg-type]
    return caught.value.reason


def test_a_regular_file_within_its_cap_is_read_whole(tmp_path: Path) -> None:
    """A regular file of exactly the cap is read whole."""
    (tmp_path / "f").write_bytes(b"0123456789")
    assert b"0123456789" == boundedread.read_bounded(tmp_path / "f", max_bytes=10)


def test_a_file_over_its_cap_is_refused_with_its_size(tmp_path: Path) -> None:
    """One byte over the cap is refused, and the reason says the limit, not the content."""
    (tmp_path / "f").write_bytes(b"secret-bytes")
    reason = _refusal(tmp_path / "f")
    assert "10-byte limit" in reason
    assert "secret" not in reason


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO (no writer) is refused at once: the open never waits for a writer."""
    os.mkfifo(tmp_path / "p")
    assert "a FIFO, not a regular file" == _refusal(tmp_path / "p")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_device_node_is_refused_without_being_opened(tmp_path: Path) -> None:
    """A character device is refused from its O_PATH fd: it is never opened for reading."""
    os.mknod(tmp_path / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert "a character device, not a regular file" == _refusal(tmp_path / "null")


def test_a_symlink_is_never_followed_unless_asked(tmp_path: Path) -> None:
    """A final symlink is refused; with follow_links (root-owned paths only) it is followed."""
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert "a symlink (never followed)" == _refusal(tmp_path / "link")
    assert b"x" == boundedread.read_bounded(tmp_path / "link", max_bytes=10, follow_links=True)


def test_a_folder_and_a_missing_file_are_refused_or_none(tmp_path: Path) -> None:
    """A folder is refused; a missing file is refused, or None when the caller allows it."""
    assert "a folder, not a regular file" == _refusal(tmp_path)
    assert "missing" == _refusal(tmp_path / "nope")
    assert None is boundedread.read_bounded(tmp_path / "nope", max_bytes=10, missing_ok=True)


def test_a_name_relative_to_a_folder_fd_is_read_without_following(tmp_path: Path) -> None:
    """With dir_fd, the name is opened beneath that folder; a link there is refused too."""
    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "l").symlink_to("/etc/passwd")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert b"abc" == boundedread.read_bounded("f", max_bytes=10, dir_fd=fd)
        with pytest.raises(boundedread.ReadRefused):
            boundedread.read_bounded("l", max_bytes=10, dir_fd=fd)
    finally:
        os.close(fd)


def test_undecodable_text_is_refused_naming_the_offset(tmp_path: Path) -> None:
    """Text that is not UTF-8 is refused naming the byte, never echoing it."""
    (tmp_path / "f").write_bytes(b"ab\xff")
    with pytest.raises(boundedread.ReadRefused) as caught:
        boundedread.read_bounded_text(tmp_path / "f", max_bytes=10)
    assert "not utf-8 text (byte 2 is not valid)" == caught.value.reason


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_device_node_is_only_ever_pinned_never_opened_for_reading(tmp_path: Path) -> None:
    """Under strace, the one open of a device node is the O_PATH pin: no read open ever acts
    on it (some devices act on open)."""
    node = tmp_path / "dev"
    os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    trace = tmp_path / "trace"
    code = (
        "from hal0_reconciler import boundedread\n"
        "try:\n"
        f"    boundedread.read_bounded({str(node)!r}, max_bytes=10)\n"
        "except boundedread.ReadRefused:\n"
        "    pass\n"
    )
    strace = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(trace)]
    subprocess.run(
        [*strace, sys.executable, "-c", code],
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(boundedread.__file__).parents[1])},
    )
    opens = [line for line in trace.read_text().splitlines() if str(node) in line]
    assert 1 == len(opens), opens
    assert "O_PATH" in opens[0]


def test_a_procfs_file_reporting_size_0_is_still_capped() -> None:
    """``/proc`` files say ``st_size`` 0 whatever they hold: the cap holds by the bytes read."""
    path = f"/proc/{os.getpid()}/status"
    whole = boundedread.read_bounded(path, max_bytes=1 << 20)
    assert whole is not None
    assert 0 == os.stat(path).st_size
    assert len(whole) > 200
    with pytest.raises(boundedread.ReadRefused, match="limit"):
        boundedread.read_bounded(path, max_bytes=200)
    assert whole[:50] == (boundedread.read_bounded(path, max_bytes=len(whole) + 64) or b"")[:50]


def test_a_file_exactly_at_its_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert b"x" * 100 == boundedread.read_bounded(path, max_bytes=100)
    with pytest.raises(boundedread.ReadRefused, match="99-byte limit \\(100 bytes\\)"):
        boundedread.read_bounded(path, max_bytes=99)


def test_no_fd_is_left_open_by_reads_and_refusals(tmp_path: Path) -> None:
    """Every read and every refusal closes what it opened (the pinned fd and the read one)."""
    good = tmp_path / "good"
    good.write_bytes(b"x" * 10)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        boundedread.read_bounded(good, max_bytes=64)
        for refused in (big, fifo, tmp_path):
            with pytest.raises(boundedread.ReadRefused):
                boundedread.read_bounded(refused, max_bytes=64)
    assert before == len(os.listdir("/proc/self/fd"))


def test_a_file_that_fails_when_read_is_refused_in_words() -> None:
    """``/proc/<pid>/mem`` is a regular file whose read at offset 0 fails (EIO)."""
    with pytest.raises(boundedread.ReadRefused, match=r"cannot be read \(input/output error\)"):
        boundedread.read_bounded(f"/proc/{os.getpid()}/mem", max_bytes=1 << 20)


_WITHOUT_PROC = """
import os, sys
from hal0_reconciler import boundedread
folder = sys.argv[1]
print(boundedread.read_bounded(os.path.join(folder, "good"), max_bytes=64).decode())
print(boundedread.read_bounded(os.path.join(folder, "link"), max_bytes=64, follow_links=True).decode())
for name in ("fifo", "link", "sub", "big"):
    try:
        boundedread.read_bounded(os.path.join(folder, name), max_bytes=64)
    except boundedread.ReadRefused as exc:
        print(name, exc.reason)
"""


def test_without_proc_the_plain_open_is_checked_the_same(tmp_path: Path) -> None:
    """No /proc (a private mount namespace hides it): the file is opened by name, non-blocking
    and not following a link, and judged the same."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to hide /proc")
    (tmp_path / "good").write_text("hello")
    (tmp_path / "big").write_bytes(b"x" * 100)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "good")
    (tmp_path / "sub").mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(boundedread.__file__).parents[1])}
    script = 'mount -t tmpfs none /proc && exec "$0" "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
    done = subprocess.run(
        [*argv, sys.executable, "-c", _WITHOUT_PROC, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert [
        "hello",
        "hello",
        "fifo a FIFO, not a regular file",
        "link a symlink (never followed)",
        "sub a folder, not a regular file",
        "big larger than the 64-byte limit (100 bytes)",
    ] == done.stdout.splitlines(), done.stderr


def test_a_fifo_is_never_opened_for_reading(tmp_path: Path) -> None:
    """A writer waits in ``open()`` on a FIFO until someone opens it for reading: after the
    refusal it is still waiting, so the FIFO was only pinned, never opened (without strace)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    opened: list[int] = []
    writer = threading.Thread(target=lambda: opened.append(os.open(fifo, os.O_WRONLY)))
    writer.start()
    try:
        time.sleep(0.2)  # the writer is waiting in open() by now
        assert not opened
        with pytest.raises(boundedread.ReadRefused) as caught:
            boundedread.read_bounded(fifo, max_bytes=10)
        assert f"{fifo}: a FIFO, not a regular file" == str(caught.value)
        writer.join(0.5)
        assert writer.is_alive(), "the FIFO was opened for reading"
    finally:
        release = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer's open end
        writer.join(5)
        os.close(release)
        for fd in opened:
            os.close(fd)


def test_a_parent_that_is_a_file_is_missing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    below = tmp_path / "file" / "below"
    assert boundedread.read_bounded(below, max_bytes=10, missing_ok=True) is None
    with pytest.raises(boundedread.ReadRefused, match=r"missing \(a parent is not a folder\)"):
        boundedread.read_bounded(below, max_bytes=10)
    assert boundedread.read_bounded_text(below, max_bytes=10, missing_ok=True) is None


def test_text_of_a_missing_file_is_refused_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(boundedread.ReadRefused, match="missing"):
        boundedread.read_bounded_text(tmp_path / "none", max_bytes=10)
    assert boundedread.read_bounded_text(tmp_path / "none", max_bytes=10, missing_ok=True) is None


def test_an_open_fd_is_read_capped_and_left_open(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"hello")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert b"hello" == boundedread.read_fd(fd, path, max_bytes=5)
        os.lseek(fd, 0, os.SEEK_SET)  # still open
        with pytest.raises(boundedread.ReadRefused, match="4-byte limit"):
            boundedread.read_fd(fd, path, max_bytes=4)
    finally:
        os.close(fd)


def test_an_open_fd_that_is_not_a_regular_file_is_refused() -> None:
    read_end, write_end = os.pipe()
    os.close(write_end)  # an end of file, should anything read it
    try:
        with pytest.raises(boundedread.ReadRefused, match="a FIFO, not a regular file"):
            boundedread.read_fd(read_end, "a pipe", max_bytes=10)
    finally:
        os.close(read_end)


def test_a_path_that_cannot_be_opened_is_refused_in_words(tmp_path: Path) -> None:
    with pytest.raises(boundedread.ReadRefused) as caught:
        boundedread.read_bounded(tmp_path / ("x" * 300), max_bytes=10)
    assert "cannot be opened (file name too long)" == caught.value.reason


def test_every_kind_of_file_is_named(tmp_path: Path) -> None:
    """The words for what a mode says, a regular file included (a caller that expected a
    folder names what it found)."""
    (tmp_path / "f").write_bytes(b"")
    (tmp_path / "l").symlink_to("f")
    os.mkfifo(tmp_path / "p")
    modes = [os.lstat(tmp_path / n).st_mode for n in ("f", "l", "p")]
    modes.append(os.lstat(tmp_path).st_mode)
    assert ["a regular file", "a symlink", "a FIFO", "a folder"] == [
        boundedread.kind_of_mode(m) for m in modes
    ]
