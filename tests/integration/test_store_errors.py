"""Reading slot files when things go wrong: a file swapped between lstat and open, errors that
are not about the kind of file, descriptors, and the lock's wait and ownership."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.errors import LockTimeout, WriteRefused
from hal0_reconciler.reconcile import OutcomeStatus, Reconciler
from hal0_reconciler.slots import runtime, store
from helpers import devnodes
from helpers.clock import FakeTime
from helpers.hosts import ROCM_USABLE
from helpers.lock_holder import holding_lock

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod and setuid need root")


class _LstatSees:
    """``os`` for the store, except that the first ``lstat`` sees ``seen``: the file was swapped
    right after it was looked at."""

    def __init__(self, seen: Path) -> None:
        self._seen: Path | None = seen

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def lstat(self, path: Path) -> os.stat_result:
        seen, self._seen = self._seen, None
        return os.lstat(seen if seen is not None else path)


class _ThenGone(_LstatSees):
    """As _LstatSees, and every later lstat finds nothing (the file went away meanwhile)."""

    def lstat(self, path: Path) -> os.stat_result:
        if self._seen is None:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return super().lstat(path)


@pytest.fixture
def swapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A slot path whose lstat still shows the regular file it was a moment ago."""
    regular = tmp_path / "was-regular.toml"
    regular.write_text('device = "gpu-vulkan"\n')
    monkeypatch.setattr(store, "os", _LstatSees(regular))
    return tmp_path / "agent.toml"


def test_a_symlink_swapped_in_after_lstat_is_refused_not_followed(swapped: Path) -> None:
    """O_NOFOLLOW's ELOOP is a refusal that says "symlink", not an I/O error."""
    (swapped.parent / "target").write_text('device = "gpu-vulkan"\n')
    swapped.symlink_to("target")
    with pytest.raises(WriteRefused, match="is a symlink; slot files are never followed"):
        store.read_slot(swapped)


def test_a_socket_swapped_in_after_lstat_is_refused_by_kind(swapped: Path) -> None:
    """open() of a socket (ENXIO) is a refusal naming the socket, not an I/O error."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(swapped))
        with pytest.raises(WriteRefused, match="a socket, not a regular file"):
            store.read_slot(swapped)


def test_a_fifo_swapped_in_after_lstat_is_refused_without_blocking(swapped: Path) -> None:
    """A FIFO opens without blocking (O_NONBLOCK); fstat then refuses it by name."""
    os.mkfifo(swapped)
    with pytest.raises(WriteRefused, match="a FIFO, not a regular file"):
        store.read_slot(swapped)


def _blockdev(p: Path) -> None:
    os.mknod(p, stat.S_IFBLK | 0o600, os.makedev(7, 200))


def _chardev(p: Path) -> None:
    os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))


def _socket(p: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(p))


def _symlink(p: Path) -> None:
    p.symlink_to("elsewhere")


@needs_root
@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (os.mkfifo, "a FIFO"),
        (Path.mkdir, "a folder"),
        (_symlink, "a symlink"),
        (_socket, "a socket"),
        (_chardev, "a character device"),
        (_blockdev, "a block device"),
    ],
    ids=["fifo", "directory", "symlink", "socket", "char-device", "block-device"],
)
def test_a_refusal_names_the_kind_of_file(tmp_path: Path, make, kind: str) -> None:
    """The message says what sits at the slot path (an operator fixes it from that line)."""
    path = tmp_path / "odd.toml"
    make(path)
    with pytest.raises(WriteRefused) as refused:
        store.read_slot(path)
    assert f"{path}: {kind}, not a regular file" == str(refused.value), (
        f"{kind} at a slot path is misnamed in the refusal"
    )


def _read_in_child(path: Path, *, user: int | None = None, max_files: int | None = None) -> str:
    """read_slot in a forked child, as ``user`` or with at most ``max_files`` descriptors."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer on the pipe, never return into pytest
        code = 1
        try:
            os.close(rfd)
            if user is not None:
                os.setgroups([])
                os.setgid(user)
                os.setuid(user)
            hold = []
            if max_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))
                with contextlib.suppress(OSError):
                    while True:
                        hold.append(os.open("/dev/null", os.O_RDONLY))
            try:
                store.read_slot(path)
            except Exception as exc:
                answer = f"{type(exc).__name__} {getattr(exc, 'errno', None)} {exc}"
            else:
                answer = "read"
            os.write(wfd, answer.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as pipe:
        answer = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert 0 == os.waitstatus_to_exitcode(status), "the reading child failed"
    return answer


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder anyone may traverse (pytest's tmp dirs are 0700, root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="hal0-store-"))
    folder.chmod(0o755)
    yield folder
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


@needs_root
def test_permission_denied_is_an_os_error_not_a_refusal_by_kind(open_dir: Path) -> None:
    """EACCES on open() is passed on as the OSError it is (reported as unreadable, with the
    reason), never as "not a regular file": the file is regular, the service user cannot read it."""
    path = open_dir / "agent.toml"
    path.write_text('device = "gpu-vulkan"\n')
    path.chmod(0o600)
    answer = _read_in_child(path, user=devnodes.SERVICE_UID)
    assert answer.startswith("PermissionError 13 "), f"EACCES reported as: {answer}"


def test_too_many_open_files_is_an_os_error_not_a_refusal_by_kind(open_dir: Path) -> None:
    """EMFILE on open() is passed on as the OSError it is, never as "not a regular file"."""
    path = open_dir / "agent.toml"
    path.write_text('device = "gpu-vulkan"\n')
    answer = _read_in_child(path, max_files=16)
    assert answer.startswith("OSError 24 "), f"EMFILE reported as: {answer}"


def test_an_io_error_is_an_unreadable_slot_with_its_reason(
    host_dirs, make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO while opening a slot: the pass says "unreadable" with the OS's reason."""
    slot = host_dirs["slots_dir"] / "agent.toml"
    slot.write_text('name = "agent"\ntype = "llm"\ndevice = "gpu-vulkan"\n')
    real_open = os.open

    def eio(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path) == str(slot):
            raise OSError(5, "Input/output error", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", eio)
    report = Reconciler(make_settings()).reconcile(ROCM_USABLE)
    (outcome,) = report.outcomes
    assert OutcomeStatus.UNREADABLE == outcome.status, f"EIO reported as {outcome.status}"
    assert "Input/output error" in (outcome.message or "")


def test_reading_slots_leaks_no_descriptor(tmp_path: Path) -> None:
    """Every read closes its descriptor (the daemon reads slot files for months)."""
    path = tmp_path / "agent.toml"
    path.write_text('device = "gpu-vulkan"\n' * 1000)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        store.read_slot(path)
    assert before == len(os.listdir("/proc/self/fd")), "read_slot leaks a file descriptor"


def test_a_large_slot_file_is_read_whole(tmp_path: Path) -> None:
    """Files larger than one read() come back complete, byte for byte."""
    path = tmp_path / "agent.toml"
    data = b"".join(b"# line %06d\n" % i for i in range(20000))  # 260 kB
    path.write_bytes(data)
    assert data == store.read_slot(path).data


def test_the_lock_is_retried_quickly_then_at_most_every_100_ms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process holds the lock, retries start within 5 ms and back off by doubling
    to one every 100 ms: a briefly held lock costs milliseconds, a long one little CPU."""
    lock = tmp_path / "slots.lock"
    fake = FakeTime()
    with holding_lock(lock):
        monkeypatch.setattr(store, "time", fake)
        with pytest.raises(LockTimeout), store.slot_write_lock(lock, timeout=2.0):
            pass
    assert fake.sleeps[:6] == [0.005, 0.01, 0.02, 0.04, 0.08, 0.1], (
        f"lock retry backoff changed: {fake.sleeps[:6]}"
    )
    assert {0.1} == set(fake.sleeps[6:]), "retries are not capped at 100 ms"
    assert 2.0 <= fake.now - 100.0 < 2.1, "the wait did not end at its timeout"


@needs_root
def test_a_created_lock_file_belongs_to_its_creator(tmp_path: Path) -> None:
    """Only the group is set (to the slots folder's); the owner stays the creating user."""
    slots = tmp_path / "slots"
    slots.mkdir()
    os.chown(slots, 0, 4343)
    lock = tmp_path / "slots.lock"
    with store.slot_write_lock(lock, timeout=1, group_of=slots):
        pass
    st = lock.stat()
    assert (os.geteuid(), 4343) == (st.st_uid, st.st_gid), "the lock file's owner was changed"


def test_taking_the_lock_leaks_no_descriptor(tmp_path: Path) -> None:
    """Every hold of the slot write lock closes its descriptor (created or existing lock file)."""
    lock = tmp_path / "slots.lock"
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with store.slot_write_lock(lock, timeout=1, group_of=tmp_path):
            pass
    assert before == len(os.listdir("/proc/self/fd")), "slot_write_lock leaks a file descriptor"


def test_a_lock_file_that_cannot_be_set_up_is_an_error_and_leaks_nothing(tmp_path: Path) -> None:
    """Creating the lock file but failing to give it the slots folder's group (the folder is
    gone): the error is raised, not ignored, and the descriptor is closed."""
    lock = tmp_path / "slots.lock"
    before = len(os.listdir("/proc/self/fd"))
    with (
        pytest.raises(FileNotFoundError),
        store.slot_write_lock(lock, timeout=1, group_of=tmp_path / "gone"),
    ):
        pytest.fail("the lock was taken although its file could not be set up")
    assert before == len(os.listdir("/proc/self/fd")), "a failed lock set-up leaks a descriptor"


def test_an_unreadable_profiles_file_gives_the_built_ins_and_the_error(tmp_path: Path) -> None:
    """profiles.toml that is not TOML: hal0's built-in profiles still apply, and the error
    names the file (reported by the pass)."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_text("[profiles\n")
    catalog = store.read_catalog(profiles)
    assert dict(runtime.BUILTIN_PROFILES) == catalog.profiles
    assert (catalog.error or "").startswith(f"{profiles}: "), f"error: {catalog.error}"


def test_a_file_gone_while_being_refused_is_called_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket swapped in after lstat and gone before its kind could be told: the refusal
    still reads as a sentence ("unreadable, not a regular file")."""
    path = tmp_path / "agent.toml"
    regular = tmp_path / "was-regular.toml"
    regular.write_text('device = "gpu-vulkan"\n')
    monkeypatch.setattr(store, "os", _ThenGone(regular))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(WriteRefused) as refused:
            store.read_slot(path)
    assert f"{path}: unreadable, not a regular file" == str(refused.value)
