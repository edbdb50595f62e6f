"""What reading and replacing one slot file may cost and must guarantee: the size limit is exact
and holds even for a file that is larger than its stat says, and a replacement made on its own
is durable (its folder is fsynced after the rename)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hal0_reconciler
from hal0_reconciler.errors import OverLimit
from hal0_reconciler.slots import store

LIMIT = 64


def test_a_slot_of_exactly_the_size_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(b"#" * (LIMIT - 1) + b"\n")
    assert LIMIT == len(store.read_slot(path, max_bytes=LIMIT).data), (
        "a slot file of exactly slot_max_bytes was refused or cut short"
    )


def test_a_slot_one_byte_over_the_limit_is_refused_naming_its_size(tmp_path: Path) -> None:
    """The report says how large the file is and what the limit is (from its stat: nothing of
    it is read), so the operator knows what to change."""
    path = tmp_path / "agent.toml"
    path.write_bytes(b"#" * LIMIT + b"\n")
    with pytest.raises(OverLimit) as refused:
        store.read_slot(path, max_bytes=LIMIT)
    assert f"over the size limit: {LIMIT + 1} bytes > {LIMIT} bytes" == str(refused.value), (
        "an oversized slot's report does not name its size and the limit"
    )


def test_a_file_larger_than_its_stat_says_is_still_bounded(tmp_path: Path) -> None:
    """A file can hold more than its stat said (it grew after the fstat; proc files say 0):
    the read stops one byte past the limit and refuses the file, never reading it whole."""
    maps = Path("/proc/self/maps")  # a regular file whose stat says 0 bytes; it holds more
    if os.stat(maps).st_size != 0 or len(maps.read_bytes()) <= LIMIT:
        pytest.skip("needs /proc/self/maps: a regular file that says 0 bytes and holds more")
    try:
        said = f"read: {len(store.read_slot(maps, max_bytes=LIMIT).data)} bytes"
    except OverLimit as exc:
        said = str(exc)
    assert f"over the size limit: more than {LIMIT} bytes" == said, (
        "a file holding more than its stat said was read past the size limit"
    )


_REPLACE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from hal0_reconciler.slots import store
    path = Path(sys.argv[1])
    store.replace_slot(path, b'device = "gpu-rocm"\\n', like=os.lstat(path))
    """
)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to watch the syscalls")
@pytest.mark.timeout(30)
def test_a_replacement_on_its_own_fsyncs_the_folder_after_the_rename(tmp_path: Path) -> None:
    """``replace_slot`` without a batch (sync_dir left to its default) makes the new name
    durable: after the rename, the slots folder itself is opened and fsynced. Watched with
    strace in a real process (a crash right after would otherwise lose the rename)."""
    folder = tmp_path / "slots"
    folder.mkdir()
    path = folder / "agent.toml"
    path.write_text('device = "gpu-vulkan"\n')
    trace = tmp_path / "trace"
    src = Path(hal0_reconciler.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = [sys.executable, "-c", _REPLACE, str(path)]
    strace = ["strace", "-f", "-qq", "-e", "trace=openat,rename,renameat2,fsync", "-o", str(trace)]
    subprocess.run([*strace, *argv], env=env, check=True, timeout=25)
    assert b'device = "gpu-rocm"\n' == path.read_bytes(), "the replacement was not made"
    calls = trace.read_text().splitlines()
    renamed = [i for i, c in enumerate(calls) if re.search(rf'rename\w*\(.*"{path}"', c)]
    assert renamed, f"no rename onto {path} seen:\n" + "\n".join(calls[-20:])
    after = calls[renamed[-1] :]
    opened = [
        m[1]
        for c in after
        if (m := re.search(rf'openat\(AT_FDCWD, "{folder}", .*O_DIRECTORY.*\) = (\d+)', c))
    ]
    synced = {m[1] for c in after if (m := re.search(r"fsync\((\d+)\) += 0", c))}
    assert opened, "the slots folder was not opened after the rename (never fsynced)"
    assert set(opened) & synced, "the slots folder was not fsynced after the rename"


# -- hal0's profiles file -------------------------------------------------------------------------
_PROFILE = b'[profile.exotic]\nruntime_family = "vllm"\n'


def _padded(size: int) -> bytes:
    """A valid profiles file of exactly ``size`` bytes: one profile, then comment lines."""
    line = b"#" * 1023 + b"\n"
    pad = size - len(_PROFILE)
    return _PROFILE + line * (pad // len(line)) + b"#" * (pad % len(line))


def test_a_profiles_file_of_up_to_1_mib_is_read(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_bytes(_padded(store.PROFILES_MAX_BYTES))
    catalog = store.read_catalog(profiles)
    assert (None, "vllm") == (catalog.error, catalog.profiles["exotic"].runtime_family), (
        "a profiles file of exactly 1 MiB was not read"
    )


def test_a_profiles_file_over_1_mib_is_refused_and_the_built_ins_apply(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_bytes(_padded(store.PROFILES_MAX_BYTES + 1))
    catalog = store.read_catalog(profiles)
    assert "exotic" not in catalog.profiles, "a profiles file over 1 MiB was used"
    assert f"{profiles}: over the size limit: more than {1 << 20} bytes" == catalog.error, (
        "an oversized profiles file is not reported as over the 1 MiB size limit"
    )


def test_a_huge_binary_profiles_file_is_reported_as_too_large(tmp_path: Path) -> None:
    """Its size is the problem, said first (before it is even decoded)."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_bytes(b"\xff" * (store.PROFILES_MAX_BYTES + 100))
    assert "over the size limit" in (store.read_catalog(profiles).error or ""), (
        "a huge binary profiles file was not reported by its size"
    )


def test_a_profiles_file_over_a_text_limit_is_refused_before_parsing(tmp_path: Path) -> None:
    """A number of 5000 digits: Python's parser would take it (or choke on it); the limits
    refuse it first, by name, and the built-in profiles apply."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_bytes(_PROFILE + b"n = " + b"9" * 5000 + b"\n")
    catalog = store.read_catalog(profiles)
    assert "exotic" not in catalog.profiles, "a profiles file over a text limit was used"
    assert "over the number length limit" in (catalog.error or ""), (
        f"a profiles file over a text limit is not refused by it: {catalog.error}"
    )


@pytest.mark.timeout(10)
def test_a_fifo_profiles_file_is_refused_by_kind_without_blocking(tmp_path: Path) -> None:
    """Read without a writer, a FIFO would look like an empty file (no error): it is refused,
    named as a FIFO, and the built-in profiles apply."""
    profiles = tmp_path / "profiles.toml"
    os.mkfifo(profiles)
    catalog = store.read_catalog(profiles)
    assert f"{profiles}: a FIFO, not a regular file" == catalog.error, (
        f"a FIFO at the profiles path is not refused by kind: {catalog.error}"
    )


def test_reading_the_profiles_file_leaks_no_descriptor(tmp_path: Path) -> None:
    """The daemon reads it again whenever it changes, for months."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_bytes(_PROFILE)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        store.read_catalog(profiles)
    assert before == len(os.listdir("/proc/self/fd")), "read_catalog leaks a file descriptor"
