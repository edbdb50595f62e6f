"""hal0's profile catalog as a pass uses it (``reconcile.catalog``): read again only when the
file changed; a file that cannot be read said once."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog.testing

from hal0_reconciler.reconcile.catalog import CatalogFile
from hal0_reconciler.slots import store


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every read of a profiles file, in order."""
    seen: list[Path] = []
    real = store.read_catalog

    def counting(path: Path) -> object:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(store, "read_catalog", counting)
    return seen


def test_an_unchanged_file_is_read_once_and_a_changed_one_again(
    host_dirs: dict[str, Path], reads: list[Path]
) -> None:
    """The catalog is kept while the file's identity is the same; its profiles are the file's."""
    profiles = host_dirs["profiles_file"]
    profiles.parent.mkdir(parents=True, exist_ok=True)
    profiles.write_text('[profile.exotic]\nruntime_family = "vllm"\n')
    catalog = CatalogFile(profiles)
    first = catalog.refresh(quiet=False)
    assert first is catalog.refresh(quiet=False)
    assert [profiles] == reads
    assert "exotic" in first.profiles
    profiles.write_text('[profile.other]\nruntime_family = "vllm"\n')
    assert "other" in catalog.refresh(quiet=False).profiles
    assert [profiles, profiles] == reads


def test_no_file_gives_the_built_in_profiles_without_an_error(
    host_dirs: dict[str, Path], reads: list[Path]
) -> None:
    """An absent profiles file is hal0's built-ins, read once, and nothing to say."""
    catalog = CatalogFile(host_dirs["profiles_file"])
    with structlog.testing.capture_logs() as logs:
        built_in = catalog.refresh(quiet=False)
        catalog.refresh(quiet=False)
    assert None is built_in.error
    assert 1 == len(reads)
    assert [] == logs


def test_an_unreadable_file_is_said_once_and_not_on_a_quiet_host(
    host_dirs: dict[str, Path], reads: list[Path]
) -> None:
    """One error per error text; none where the daemon does not act; new settings read the
    file again at the next refresh without saying the same error again."""
    profiles = host_dirs["profiles_file"]
    profiles.parent.mkdir(parents=True, exist_ok=True)
    profiles.write_text("[profile.broken\n")
    quiet = CatalogFile(profiles)
    with structlog.testing.capture_logs() as logs:
        assert quiet.refresh(quiet=True).error is not None
    assert [] == logs
    catalog = CatalogFile(profiles)
    with structlog.testing.capture_logs() as logs:
        catalog.refresh(quiet=False)
        catalog.refresh(quiet=False)
        catalog.use(profiles)
        catalog.refresh(quiet=False)
    assert ["profiles.unreadable"] == [e["event"] for e in logs]
    assert 3 == len(reads)
    profiles.write_text("[profile.broken\n# still\n")
    with structlog.testing.capture_logs() as logs:
        catalog.refresh(quiet=False)
    assert [] == logs, "the same error said again"


def test_a_fixed_file_then_broken_again_is_said_again(host_dirs: dict[str, Path]) -> None:
    """A file that was fine in between has its error said when it comes back."""
    profiles = host_dirs["profiles_file"]
    profiles.parent.mkdir(parents=True, exist_ok=True)
    profiles.write_text("[profile.broken\n")
    catalog = CatalogFile(profiles)
    with structlog.testing.capture_logs() as logs:
        catalog.refresh(quiet=False)
        profiles.write_text('[profile.fine]\nruntime_family = "vllm"\n')
        catalog.refresh(quiet=False)
        profiles.write_text("[profile.broken\n")
        catalog.refresh(quiet=False)
    assert ["profiles.unreadable", "profiles.unreadable"] == [e["event"] for e in logs]
