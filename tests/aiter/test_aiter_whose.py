"""Whose tree: the JIT folder's owner, when no one else can change the way to it; else refused."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from hal0_reconciler.aiter.trees import owner as treeowner
from hal0_reconciler.aiter.trees import whose
from hal0_reconciler.model import Credentials
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


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775, 0o1775, 0o3777, 0o1733])
@pytest.mark.parametrize("uid", [0, 1000])
def test_a_jit_folder_others_can_write_is_refused_sticky_or_not(mode: int, uid: int) -> None:
    """A JIT folder its group or every user can write, sticky or not, root's or a user's:
    anyone could plant files where the tree is handled; refused, with how to fix it."""
    shared = _way(*ROOT_WAY, _step("/opt/jit", uid, DIR | mode))
    refused = str(whose.judge(shared, _way(*ROOT_WAY)).refused)
    owner = "root's" if uid == 0 else f"uid {uid}'s"
    who = "every user" if mode & 0o002 else f"group {uid}"
    assert (
        f"JIT folder /opt/jit is {owner} but writable by {who} (mode {mode:o}, sticky or not); "
        "refused: a folder others can write is nobody's tree (chmod go-w it, or give each "
        "user a tree of their own with its own jit_dir)"
    ) == refused


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o1775])
def test_a_configs_folder_others_can_write_is_refused_sticky_or_not(mode: int) -> None:
    configs = _way(
        *ROOT_WAY, _step("/opt/aiter", 0, DIR | 0o755), _step("/opt/aiter/configs", 0, DIR | mode)
    )
    refused = str(whose.judge(_way(*ROOT_WAY, _step("/opt/jit", 0, DIR | 0o755)), configs).refused)
    assert refused.startswith("configs folder /opt/aiter/configs is root's but writable by ")
    assert "chmod go-w" in refused


@pytest.mark.parametrize("mode", [0o755, 0o700, 0o1755, 0o2755])
def test_a_folder_only_its_owner_can_write_is_accepted(mode: int) -> None:
    for uid in (0, 1000):
        own = _way(*ROOT_WAY, _step("/opt/jit", uid, DIR | mode))
        configs = _way(*ROOT_WAY, _step("/opt/configs", 0, DIR | mode))
        assert None is whose.judge(own, configs).refused


def test_a_shared_folder_not_there_yet_or_a_file_is_not_judged_shared() -> None:
    missing = whose.Way(
        (_step("/", 0, DIR | 0o755), _step("/tmp", 0, DIR | 0o1777)),
        PurePosixPath("/tmp/jit"),
        exists=False,
    )
    assert None is whose.shared_folder(missing, what="JIT folder")
    file_way = _way(*ROOT_WAY, _step("/opt/jit", 0, stat.S_IFREG | 0o777))
    assert None is whose.shared_folder(file_way, what="JIT folder")


def test_a_file_or_link_on_the_way_is_not_judged_by_its_mode() -> None:
    """A link's mode means nothing, and a file met on the way (the walk stops there) has no
    entries to replace: neither is refused for its write bits, only for its owner."""
    file_step = _step("/opt/f", 0, stat.S_IFREG | 0o666)
    link_step = _step("/opt/l", 0, LINK)
    assert None is whose.step_problem(file_step, 1000)
    assert None is whose.step_problem(link_step, 1000)
    assert "owned by uid 2000" in str(whose.step_problem(_step("/opt/f", 2000, file_step.mode), 0))


def test_a_walk_that_failed_refuses_the_tree_with_its_error() -> None:
    broken = whose.Way((), PurePosixPath("/opt/loop"), exists=False, error="too many symlinks")
    assert "JIT folder /opt/loop: too many symlinks" == whose.way_problem(
        broken, 0, what="JIT folder", include_last=False
    )
    assert "JIT folder /opt/loop: too many symlinks" == whose.judge(broken, _way(*ROOT_WAY)).refused


def test_the_verdict_says_whether_the_tree_is_roots() -> None:
    assert whose.judge(_way(*ROOT_WAY, _step("/opt/jit", 0, DIR | 0o755)), _way(*ROOT_WAY)).as_root
    user = whose.judge(_way(*ROOT_WAY, _step("/opt/jit", 1000, DIR | 0o755)), _way(*ROOT_WAY))
    assert (False, 1000) == (user.as_root, user.uid)


def _ancestors(path: Path) -> list[str]:
    """Every folder a walk to something inside ``path`` meets first, ``/`` to ``path``."""
    return [str(p) for p in reversed(path.parents)] + [str(path)]


def _paths(way: whose.Way) -> list[str]:
    return [str(s.path) for s in way.steps]


def test_the_walk_meets_each_component_once_from_the_root(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ancestors = _ancestors(tmp_path)
    way = treeowner.walk(tmp_path / "b")
    assert (True, None, [*ancestors, str(tmp_path / "b")]) == (way.exists, way.error, _paths(way))
    up = treeowner.walk(f"{tmp_path}/a/../b")  # ".." goes back up: no step for it
    assert [*ancestors, str(tmp_path / "a"), str(tmp_path / "b")] == _paths(up)
    assert PurePosixPath(tmp_path / "b") == up.real


@pytest.mark.parametrize("path", ["", "relative/jit", "jit"])
def test_a_path_that_is_not_absolute_is_not_walked(path: str) -> None:
    way = treeowner.walk(path)
    assert (False, "not absolute", ()) == (way.exists, way.error, way.steps)


def test_forty_links_are_followed_and_the_forty_first_is_refused(tmp_path: Path) -> None:
    """The kernel's own limit: a chain of 40 symlinks resolves, 41 is "too many symlinks"."""
    target = tmp_path / "jit"
    target.mkdir()
    previous = target
    for i in range(41):
        link = tmp_path / f"l{i}"
        link.symlink_to(previous)
        previous = link
    forty = treeowner.walk(tmp_path / "l39")
    assert (True, None, PurePosixPath(target)) == (forty.exists, forty.error, forty.real)
    assert 40 == sum(s.is_link for s in forty.steps)
    too_many = treeowner.walk(tmp_path / "l40")
    assert (False, "too many symlinks") == (too_many.exists, too_many.error)


def test_a_missing_component_ends_the_walk_at_the_deepest_folder_there(tmp_path: Path) -> None:
    way = treeowner.walk(tmp_path / "missing" / "jit")
    assert (False, None, PurePosixPath(tmp_path / "missing")) == (way.exists, way.error, way.real)
    assert str(tmp_path) == _paths(way)[-1]


def test_a_link_that_cannot_be_read_ends_the_walk_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link gone (or unreadable) between its ``lstat`` and its ``readlink``: the walk stops
    there and says why; nothing is judged as existing."""
    (tmp_path / "link").symlink_to(tmp_path)

    def gone(_path: object) -> str:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(treeowner.os, "readlink", gone)
    way = treeowner.walk(tmp_path / "link" / "jit")
    assert (False, "no such file or directory") == (way.exists, way.error)
    assert PurePosixPath(tmp_path / "link") == way.real
    assert way.steps[-1].is_link


def test_whose_credentials_are_said_in_words() -> None:
    root_way = _way(*ROOT_WAY, _step("/opt/jit", 0, DIR | 0o755))
    user_way = _way(*ROOT_WAY, _step("/opt/jit", 1000, DIR | 0o755))
    shared = _way(*ROOT_WAY, _step("/opt/jit", 0, DIR | 0o1777))
    configs = _way(*ROOT_WAY)
    as_root = treeowner.TreeOwner(whose.judge(root_way, configs), Credentials("root", 0, 0, (0,)))
    as_user = treeowner.TreeOwner(
        whose.judge(user_way, configs), Credentials("alice", 1000, 1001, (1001,))
    )
    refused = treeowner.TreeOwner(whose.judge(shared, configs), Credentials("root", 0, 0, (0,)))
    assert "root (the tree is root's)" == as_root.describe()
    assert (True, False) == (as_root.as_root, as_user.as_root)
    assert "alice (uid 1000, gid 1001; the JIT folder's owner)" == as_user.describe()
    assert refused.describe().startswith("refused: JIT folder /opt/jit is root's but writable")


def test_a_relative_link_is_walked_from_the_folder_that_holds_it(tmp_path: Path) -> None:
    """``a/up -> ../b``: the walk goes on from ``a`` (".." takes no step of its own)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "jit").mkdir(parents=True)
    (tmp_path / "a" / "up").symlink_to("../b")
    ancestors = _ancestors(tmp_path)
    way = treeowner.walk(tmp_path / "a" / "up" / "jit")
    assert (True, None, PurePosixPath(tmp_path / "b" / "jit")) == (way.exists, way.error, way.real)
    inside = [tmp_path / "a", tmp_path / "a" / "up", tmp_path / "b", tmp_path / "b" / "jit"]
    assert [*ancestors, *map(str, inside)] == _paths(way)


def test_an_absolute_link_walks_its_target_from_the_root_once(tmp_path: Path) -> None:
    """``abs -> /…/b``: every component of the target is met again from ``/`` (which is not met
    twice), then the rest of the path."""
    (tmp_path / "b" / "jit").mkdir(parents=True)
    (tmp_path / "abs").symlink_to(tmp_path / "b")
    ancestors = _ancestors(tmp_path)
    way = treeowner.walk(tmp_path / "abs" / "jit")
    assert (True, None, PurePosixPath(tmp_path / "b" / "jit")) == (way.exists, way.error, way.real)
    again = [str(tmp_path / "b"), str(tmp_path / "b" / "jit")]
    assert [*ancestors, str(tmp_path / "abs"), *ancestors[1:], *again] == _paths(way)


def test_a_component_that_cannot_be_looked_at_ends_the_walk_with_why(tmp_path: Path) -> None:
    """An ``lstat`` that fails for another reason than a missing component (here a name longer
    than the filesystem allows): the walk stops there, says why, and nothing exists."""
    long = tmp_path / ("x" * 300)
    way = treeowner.walk(long / "jit")
    assert (False, "file name too long", PurePosixPath(long)) == (way.exists, way.error, way.real)
    assert str(tmp_path) == _paths(way)[-1]


def test_a_root_folder_that_cannot_be_looked_at_ends_the_walk_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(_path: object) -> os.stat_result:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(treeowner.os, "lstat", refused)
    way = treeowner.walk("/var/lib/jit")
    assert (False, "permission denied", (), PurePosixPath("/")) == (
        way.exists,
        way.error,
        way.steps,
        way.real,
    )
