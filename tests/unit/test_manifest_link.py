"""A symlinked manifest.json: followed only when every link, folder and the file are root's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hal0_reconciler.host.hal0 import manifestlink

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners need root to set")


@pytest.fixture
def ground(tmp_path: Path) -> Path:
    """A root-only folder (tmp_path's parents are root's: pytest makes them 0700)."""
    base = tmp_path / "ground"
    base.mkdir(mode=0o755)
    (base / "releases").mkdir(mode=0o755)
    target = base / "releases/manifest.json"
    target.write_text("{}\n", encoding="utf-8")
    target.chmod(0o644)
    return base


def test_a_plain_file_is_itself(ground: Path) -> None:
    path = ground / "releases/manifest.json"
    assert path == manifestlink.real_manifest(path)
    assert ground / "missing" == manifestlink.real_manifest(ground / "missing")


def test_a_link_on_roots_ground_is_followed(ground: Path) -> None:
    link = ground / "manifest.json"
    link.symlink_to("releases/manifest.json")
    assert ground / "releases/manifest.json" == manifestlink.real_manifest(link)
    hop = ground / "hop.json"
    hop.symlink_to(link)
    assert ground / "releases/manifest.json" == manifestlink.real_manifest(hop)


@pytest.mark.parametrize(
    ("harm", "said"),
    [
        ("target-owner", "root does not own alone"),
        ("target-writable", "root does not own alone"),
        ("folder-owner", "not root's"),
        ("folder-writable", "others may change"),
        ("link-owner", "that is not root's"),
        ("dangling", "cannot be read"),
        ("directory", "not a regular file"),
        ("loop", "more than"),
    ],
)
def test_anything_else_is_refused_with_the_reason(ground: Path, harm: str, said: str) -> None:
    target = ground / "releases/manifest.json"
    link = ground / "manifest.json"
    link.symlink_to(target)
    if harm == "target-owner":
        os.chown(target, NOBODY, NOBODY)
    elif harm == "target-writable":
        target.chmod(0o666)
    elif harm == "folder-owner":
        os.chown(target.parent, NOBODY, NOBODY)
    elif harm == "folder-writable":
        target.parent.chmod(0o777)
    elif harm == "link-owner":
        os.lchown(link, NOBODY, NOBODY)
    elif harm == "dangling":
        target.unlink()
    elif harm == "directory":
        target.unlink()
        target.mkdir()
    else:
        link.unlink()
        link.symlink_to(link)
    with pytest.raises(manifestlink.LinkRefused, match=said):
        manifestlink.real_manifest(link)


def test_a_sticky_shared_folder_keeps_roots_entries_roots(ground: Path) -> None:
    """Others may add to a sticky folder but not replace root's entries: followed."""
    ground.joinpath("releases").chmod(0o1777)
    link = ground / "manifest.json"
    link.symlink_to("releases/manifest.json")
    assert ground / "releases/manifest.json" == manifestlink.real_manifest(link)
