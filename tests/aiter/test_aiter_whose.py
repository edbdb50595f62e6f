"""Whose tree: the JIT folder's owner, when no one else can change the way to it; else refused."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from hal0_reconciler.aiter import treeowner, whose
from helpers import devnodes

DIR = stat.S_IFDIR
LINK = stat.S_IFLNK | 0o777


def _step(path: str, uid: int, mode: int) -> whose.Step:
    return whose.Step(PurePosixPath(path), uid, uid, mode)


def _way(*steps: whose.Step, exists: bool = True) -> whose.Way:
    return whose.Way(steps, steps[-1].path, exists=exists)


ROOT_WAY = (_step("/", 0, DIR | 0o755), _step("/opt", 0, DIR | 0o755))


def test_a_tree_below_root_folders_is_its_jit_owners() -> None:
    """Root's folders down to a user's JIT folder: handled as that user."""
    jit = _way(*ROOT_WAY, _step("/opt/jit", 1000, DIR | 0o700))
    configs = _way(*ROOT_WAY, _step("/opt/configs", 0, DIR | 0o755))
    verdict = whose.judge(jit, configs)
    assert (1000, None) == (verdict.uid, verdict.refused)


def test_an_ancestor_owned_by_a_third_user_is_refused() -> None:
    """A folder on the way owned by someone who is neither root nor the owner refuses the tree."""
    jit = _way(*ROOT_WAY, _step("/opt/u", 2000, DIR | 0o755), _step("/opt/u/jit", 1000, DIR))
    verdict = whose.judge(jit, _way(*ROOT_WAY))
    assert (
        "JIT folder: /opt/u is a folder owned by uid 2000, not root or uid 1000; refused "
        "(the way to a tree must be root's or its owner's)"
    ) == verdict.refused


def test_a_world_writable_ancestor_is_refused_unless_root_sticky() -> None:
    """0777 on the way refuses; root's 1777 (/tmp) passes, as no one can swap others' entries."""
    open_dir = _way(_step("/", 0, DIR | 0o777), _step("/jit", 1000, DIR | 0o700))
    sticky = _way(_step("/", 0, DIR | 0o1777), _step("/jit", 1000, DIR | 0o700))
    assert "/ is writable by every user" in str(whose.judge(open_dir, sticky).refused)
    assert None is whose.judge(sticky, sticky).refused


def test_a_group_writable_ancestor_is_refused() -> None:
    """g+w on an ancestor lets the group's members swap the way: refused."""
    jit = _way(_step("/", 0, DIR | 0o775), _step("/jit", 1000, DIR | 0o700))
    assert "/ is writable by group 0" in str(whose.judge(jit, jit).refused)


def test_a_link_on_the_way_owned_by_a_third_user_is_refused() -> None:
    """A symlink is followed only when it is root's or the owner's."""
    jit = _way(*ROOT_WAY, _step("/opt/l", 2000, LINK), _step("/opt/jit", 1000, DIR))
    assert "/opt/l is a symlink owned by uid 2000" in str(whose.judge(jit, jit).refused)


def test_a_missing_jit_folder_belongs_to_the_deepest_existing_folders_owner() -> None:
    """A JIT folder not made yet: the owner of the folder it would be made in."""
    jit = _way(*ROOT_WAY, _step("/opt/home", 1000, DIR | 0o755), exists=False)
    assert 1000 == whose.judge(jit, _way(*ROOT_WAY)).uid


@pytest.fixture
def user() -> Iterator[tuple[int, int]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the owner is a user this test makes")
    with devnodes.system_user() as name:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid


def test_the_walk_judges_real_folders_and_links(tmp_path: Path, user: tuple[int, int]) -> None:
    """On disk: a user's JIT folder below root's is the user's; through the user's link too."""
    uid, gid = user
    tmp_path.chmod(0o755)
    jit = tmp_path / "jit"
    jit.mkdir()
    os.chown(jit, uid, gid)
    configs = tmp_path / "configs"
    configs.mkdir()
    link = tmp_path / "via"
    link.symlink_to(jit)
    os.chown(link, uid, gid, follow_symlinks=False)
    owner = treeowner.owner_of(link, configs)
    assert (None, uid, gid) == (owner.refused, owner.credentials.uid, owner.credentials.gid)
    assert PurePosixPath(jit) == owner.verdict.jit.real


def test_the_walk_refuses_a_folder_the_owner_does_not_own_on_the_way(
    tmp_path: Path, user: tuple[int, int]
) -> None:
    """A user's folder above a root JIT folder: the tree is root's, and root refuses the way."""
    uid, gid = user
    tmp_path.chmod(0o755)
    mid = tmp_path / "mid"
    (mid / "jit").mkdir(parents=True)
    os.chown(mid, uid, gid)
    owner = treeowner.owner_of(mid / "jit", tmp_path)
    assert f"{mid} is a folder owned by uid {uid}, not root" in str(owner.refused)


def test_a_root_jit_folder_others_can_write_is_refused() -> None:
    """Root's 0777 JIT folder: anyone could plant files where root would act; refused."""
    shared = _way(*ROOT_WAY, _step("/opt/jit", 0, DIR | 0o777))
    own = _way(*ROOT_WAY, _step("/opt/jit", 1000, DIR | 0o777))
    assert "JIT folder /opt/jit is root's but writable by others" in str(
        whose.judge(shared, _way(*ROOT_WAY)).refused
    )
    assert None is whose.judge(own, _way(*ROOT_WAY)).refused
