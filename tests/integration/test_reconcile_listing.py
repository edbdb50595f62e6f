"""Which slot files a pass looks at (``reconcile.listing``): keys and names from the folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hal0_reconciler.reconcile import listing


def test_a_listing_gives_the_slot_files_sorted_as_absolute_keys_and_names(
    host_dirs: dict[str, Path],
) -> None:
    """Only ``*.toml`` files not hidden count; keys are the files' absolute paths."""
    folder = host_dirs["slots_dir"]
    for name in ["b.toml", "a.toml", ".a.toml.tmp", ".hidden.toml", "notes.txt", "c.toml~"]:
        (folder / name).write_text("")
    keys, names = listing.FolderListing().slot_files(folder)
    assert ["a.toml", "b.toml"] == names
    assert [str(folder / "a.toml"), str(folder / "b.toml")] == keys


def test_the_same_folder_listed_the_same_gives_the_same_lists_again(
    host_dirs: dict[str, Path],
) -> None:
    """Nothing is built again while the folder lists the same names; a new name, or another
    folder, is listed anew."""
    folder = host_dirs["slots_dir"]
    (folder / "a.toml").write_text("")
    files = listing.FolderListing()
    first = files.slot_files(folder)
    again = files.slot_files(folder)
    assert first[0] is again[0]
    assert first[1] is again[1]
    (folder / "b.toml").write_text("")
    assert ["a.toml", "b.toml"] == files.slot_files(folder)[1]
    other = folder.parent / "other"
    other.mkdir()
    (other / "a.toml").write_text("")
    assert [str(other / "a.toml")] == files.slot_files(other)[0]


def test_a_relative_folder_gives_keys_made_absolute(
    host_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys never depend on the working folder a path was given in."""
    folder = host_dirs["slots_dir"]
    (folder / "a.toml").write_text("")
    monkeypatch.chdir(folder.parent)
    keys, _ = listing.FolderListing().slot_files(Path(folder.name))
    assert [str(folder / "a.toml")] == keys
    assert str(folder / "a.toml") == listing.slot_key(Path(folder.name) / "a.toml")


def test_a_missing_folder_lists_no_slot_file(host_dirs: dict[str, Path]) -> None:
    """No folder (yet): an empty pass, not an error."""
    assert ([], []) == listing.FolderListing().slot_files(host_dirs["slots_dir"] / "none")


def test_given_files_keep_their_order_and_paths(host_dirs: dict[str, Path]) -> None:
    """Files named by the caller are looked at as given, each with its key."""
    folder = host_dirs["slots_dir"]
    paths = [folder / "z.toml", folder / "a.toml"]
    keys, known = listing.keyed(paths)
    assert [os.fspath(p) for p in paths] == keys
    assert paths == known
