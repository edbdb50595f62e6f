"""Whose an aiter tree is, as the kernel sees it: an ACL grant shows through the mask, a reused
uid is its new owner, a uid with no user database entry is never root's group. These held in
0.2.0; kept as attacks by an unprivileged user the test creates."""

from __future__ import annotations

import contextlib
import os
import pwd
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal0_reconciler.aiter.trees import owner as treeowner
from helpers.attacker import Attacker, Tally

pytestmark = pytest.mark.timeout(60)

_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF


def grant_write(folder: Path, uid: int) -> None:
    """``setfacl -m u:<uid>:rwx``: the POSIX ACL xattr, as the kernel stores it."""
    entries = [
        (_ACL_USER_OBJ, 7, _UNDEFINED),
        (_ACL_USER, 7, uid),
        (_ACL_GROUP_OBJ, 5, _UNDEFINED),
        (_ACL_MASK, 7, _UNDEFINED),
        (_ACL_OTHER, 5, _UNDEFINED),
    ]
    data = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(folder, "system.posix_acl_access", data)
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs on this filesystem: {exc}")


def _tree(base: Path) -> tuple[Path, Path]:
    jit, configs = base / "aiter/jit", base / "aiter/configs"
    jit.mkdir(parents=True)
    configs.mkdir(parents=True)
    for folder in (base, base / "aiter", jit, configs):
        folder.chmod(0o755)
    return jit, configs


def test_an_acl_grant_on_the_way_shows_through_the_mask_and_is_refused(
    tmp_path: Path, attacker: Attacker, attacks: Tally
) -> None:
    """``u:attacker:rwx`` on a root folder above the tree (mode bits still 0755 for the owner
    and others): the group bits show the ACL mask, and the way is refused."""
    attacks.tried("aiter ACL grant on the way")
    jit, configs = _tree(tmp_path / "t")
    before = treeowner.owner_of(jit, configs)
    assert before.refused is None, before.refused
    grant_write(tmp_path / "t" / "aiter", attacker.uid)
    after = treeowner.owner_of(jit, configs)
    assert after.refused is not None
    assert f"{tmp_path / 't' / 'aiter'} is writable by group" in after.refused
    attacks.held("aiter ACL grant on the way")


def test_an_acl_grant_on_a_root_jit_folder_is_refused(
    tmp_path: Path, attacker: Attacker, attacks: Tally
) -> None:
    attacks.tried("aiter ACL grant on a root JIT folder")
    jit, configs = _tree(tmp_path / "t")
    grant_write(jit, attacker.uid)
    owner = treeowner.owner_of(jit, configs)
    assert owner.refused is not None
    assert str(jit) in owner.refused
    attacks.held("aiter ACL grant on a root JIT folder")


@contextlib.contextmanager
def user_with_uid(uid: int) -> Iterator[str]:
    name = f"h0r{uuid.uuid4().hex[:10]}"
    argv = ["useradd", "--system", "--no-create-home", "--user-group", "-o", "-u", str(uid), name]
    subprocess.run([*argv], check=True, capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=30)
        subprocess.run(["groupdel", name], check=False, capture_output=True, timeout=30)


def test_a_reused_uid_is_handled_as_its_new_owner(tmp_path: Path, attacks: Tally) -> None:
    """The tree's owner was deleted and the uid given to a new user: the tree is handled with
    the new user's name, gid and groups (what the kernel will check), never the old ones."""
    attacks.tried("aiter uid reuse")
    jit, configs = _tree(tmp_path / "t")
    with user_with_uid(4711) as first:
        old_gid = pwd.getpwnam(first).pw_gid
        for folder in (jit.parent, jit, configs):
            os.chown(folder, 4711, old_gid)
        assert first == treeowner.owner_of(jit, configs).credentials.user
    with user_with_uid(4711) as second:
        new = pwd.getpwnam(second)
        credentials = treeowner.owner_of(jit, configs).credentials
        assert (second, 4711, new.pw_gid) == (credentials.user, credentials.uid, credentials.gid)
        assert new.pw_gid in credentials.groups
    attacks.held("aiter uid reuse")


def test_a_uid_with_no_user_entry_never_gets_root_s_group(tmp_path: Path, attacks: Tally) -> None:
    """A JIT folder owned by a uid the user database does not know: handled with that uid and
    the folder's own group only, never gid 0."""
    attacks.tried("aiter owner without a user entry")
    jit, configs = _tree(tmp_path / "t")
    uid = 4712
    with contextlib.suppress(KeyError):
        pwd.getpwuid(uid)
        pytest.skip("uid 4712 is known here")
    for folder in (jit.parent, jit, configs):
        os.chown(folder, uid, 4713)
    credentials = treeowner.owner_of(jit, configs).credentials
    assert (uid, 4713, (4713,)) == (credentials.uid, credentials.gid, credentials.groups)
    attacks.held("aiter owner without a user entry")
