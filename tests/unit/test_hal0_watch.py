"""Where a hal0 fact file that does not exist yet is watched: its nearest existing ancestor,
for the one name that leads to it."""

from __future__ import annotations

from pathlib import Path

from hal0_reconciler.daemon import watch


def test_an_existing_folder_is_watched_for_the_file_itself(tmp_path: Path) -> None:
    """The folder exists: watch it for the file's name (not a lead)."""
    (tmp_path / "etc/hal0").mkdir(parents=True)
    target = tmp_path / "etc/hal0/hal0.toml"
    assert (tmp_path / "etc/hal0", "hal0.toml", False) == watch.nearest_watch(target)


def test_a_missing_folder_is_watched_at_its_nearest_ancestor_for_one_name(tmp_path: Path) -> None:
    """Only ``usr/lib`` exists: watch it for ``hal0``, the one name on the way to VERSION."""
    (tmp_path / "usr/lib").mkdir(parents=True)
    target = tmp_path / "usr/lib/hal0/current/VERSION"
    assert (tmp_path / "usr/lib", "hal0", True) == watch.nearest_watch(target)


def test_a_python_folder_pattern_is_a_lead_in_its_parent(tmp_path: Path) -> None:
    """The venv's ``lib`` exists but no Python folder in it has hal0: watch ``lib`` for
    ``python3.*``."""
    (tmp_path / "venv/lib").mkdir(parents=True)
    target = tmp_path / "venv/lib/python3.*/site-packages/hal0/config/schema.py"
    assert (tmp_path / "venv/lib", "python3.*", True) == watch.nearest_watch(target)


def test_a_pattern_under_a_missing_folder_leads_from_the_nearest_ancestor(tmp_path: Path) -> None:
    """No venv at all: its nearest existing ancestor, for the venv's own name."""
    target = tmp_path / "venv/lib/python3.*/site-packages/hal0/config/schema.py"
    assert (tmp_path, "venv", True) == watch.nearest_watch(target)
