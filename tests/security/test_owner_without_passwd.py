"""A JIT folder owned by a uid the user database does not know.

Anyone who can ``chown`` (or a container's uid mapping) can leave a JIT folder owned by a uid
with no passwd entry. The tree is then handled with that uid and the folder's group, and only
that group: never root's group 0, which would let the owner's child read and write what group 0
may.
"""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from hal0_reconciler.aiter.trees import owner as treeowner
from hal0_reconciler.aiter.trees import owner_io as treeio
from helpers.attacker import Tally


def _unknown_ids() -> tuple[int, int]:
    uid = 424_242
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid, uid + 1
        uid += 7


@pytest.fixture
def base() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root: chown to a uid that has no user")
    folder = Path(tempfile.mkdtemp(prefix="hal0-sec-nopasswd-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for path in sorted(folder.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        folder.rmdir()


def test_an_owner_with_no_passwd_entry_gets_the_folders_group_never_group_0(
    base: Path, attacks: Tally
) -> None:
    attacks.tried("aiter JIT folder owned by a uid with no user")
    uid, gid = _unknown_ids()
    jit = base / "jit"
    jit.mkdir()
    os.chown(jit, uid, gid)
    owner = treeowner.owner_of(jit, base)
    c = owner.credentials
    assert None is owner.refused
    assert (str(uid), uid, gid, (gid,), "no user database entry") == (
        c.user,
        c.uid,
        c.gid,
        c.groups,
        c.why,
    )
    roots = (treeio.Root(PurePosixPath(jit), PurePosixPath(jit)),)
    io = treeio.open_tree(roots, c, timeout=10.0)
    try:
        assert isinstance(io, treeio.ChildTree)
        assert None is io.dead
        io.mkdir(jit / "made")  # made by the child: its credentials show on the folder
    finally:
        io.close()
    st = (jit / "made").stat()
    assert (uid, gid) == (st.st_uid, st.st_gid)
    attacks.held("aiter JIT folder owned by a uid with no user")
