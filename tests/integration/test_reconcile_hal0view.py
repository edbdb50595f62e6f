"""hal0's facts as a pass uses them (``reconcile.hal0view``): read at every pass, a change
said once, each source that fell back said once, nothing said on a quiet host."""

from __future__ import annotations

from pathlib import Path

import structlog.testing

from hal0_reconciler.reconcile.hal0view import Hal0View


def _events(logs: list[dict[str, object]]) -> list[object]:
    return [e["event"] for e in logs]


def test_a_missing_hal0_is_read_as_fallbacks_said_once(
    host_dirs: dict[str, Path], make_settings, tmp_path: Path
) -> None:
    """Each source that fell back is said at the first pass that may speak, not after."""
    gone = tmp_path / "no-hal0"
    settings = make_settings(hal0_release_dir=str(gone / "current"))
    view = Hal0View(settings, announce=True)
    assert None is view.facts
    with structlog.testing.capture_logs() as logs:
        facts = view.refresh(quiet=True)
    assert [] == logs
    assert facts is view.facts
    assert view.problems, "no fallback read for a missing hal0 release"
    with structlog.testing.capture_logs() as logs:
        view.refresh(quiet=False)
        view.refresh(quiet=False)
    assert len(view.problems) == _events(logs).count("hal0.facts_note")
    assert {"hal0.facts_note", "hal0.placed"} == set(_events(logs))
    placed = [e for e in logs if e["event"] == "hal0.placed"]
    assert 1 == len(placed), "the release and era are said once"
    assert view.facts is not None
    assert view.facts.rule.value == placed[0]["rule"]


def test_the_release_and_era_are_said_once_at_the_first_pass_that_may_speak(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """A quiet first pass says nothing; the first pass that speaks names release and era once,
    later passes and a change of facts never again; without ``announce`` (``once``) never."""
    silent = Hal0View(make_settings())
    with structlog.testing.capture_logs() as logs:
        silent.refresh(quiet=False)
    assert "hal0.placed" not in _events(logs)
    view = Hal0View(make_settings(), announce=True)
    with structlog.testing.capture_logs() as logs:
        view.refresh(quiet=True)
    assert [] == logs
    with structlog.testing.capture_logs() as logs:
        facts = view.refresh(quiet=False)
        view.refresh(quiet=False)
        view.use(make_settings(default_runner_image="ghcr.io/hal0ai/hal0-rocmfpx:newer"))
        view.refresh(quiet=False)
    placed = [e for e in logs if e["event"] == "hal0.placed"]
    assert 1 == len(placed)
    assert (facts.release, facts.rule.value) == (placed[0]["release"], placed[0]["rule"])
    assert placed[0]["summary"].startswith(f"hal0 {facts.release}: ")
    assert 1 == _events(logs).count("hal0.facts_changed")


def test_a_change_of_hal0_s_facts_is_said_once_with_old_and_new(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """New settings are read at the next refresh; a new default image is one event."""
    view = Hal0View(make_settings())
    first = view.refresh(quiet=False)
    view.use(make_settings(default_runner_image="ghcr.io/hal0ai/hal0-rocmfpx:newer"))
    with structlog.testing.capture_logs() as logs:
        view.refresh(quiet=False)
        view.refresh(quiet=False)
    changed = [e for e in logs if e["event"] == "hal0.facts_changed"]
    assert 1 == len(changed)
    assert ("ghcr.io/hal0ai/hal0-rocmfpx:newer", first.default_image) == (
        changed[0]["default_image"],
        changed[0]["old_default_image"],
    )


def test_a_quiet_host_says_no_change_but_keeps_the_facts(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """Where the daemon does not act, a change is read and not said."""
    view = Hal0View(make_settings())
    view.refresh(quiet=True)
    view.use(make_settings(default_runner_image="ghcr.io/hal0ai/hal0-rocmfpx:newer"))
    with structlog.testing.capture_logs() as logs:
        facts = view.refresh(quiet=True)
    assert [] == logs
    assert "ghcr.io/hal0ai/hal0-rocmfpx:newer" == facts.default_image
