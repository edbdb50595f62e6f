"""What the engine says about the installed hal0 and about slot names hal0 cannot run: each
thing once, again only when it changes or comes back, and nothing on a host without amdgpu."""

from __future__ import annotations

from pathlib import Path

import structlog.testing

from hal0_reconciler.reconcile import Reconciler
from helpers.hal0_tree import Hal0Tree
from helpers.hosts import NOT_AMD, ROCM_USABLE


def _fallbacks(logs) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(e["source"], e["log_level"]) for e in logs if e["event"] == "hal0.facts_note"]


def test_an_unreadable_hal0_install_is_said_once_per_source(
    host_dirs: dict[str, Path], make_settings, tmp_path: Path
) -> None:
    """No hal0 installed: each missing source is one warning on an AMD host (not one per pass),
    none on a host without amdgpu; once hal0 is installed and then removed again, said again."""
    gone = tmp_path / "no-hal0"
    settings = make_settings(
        hal0_venv=str(gone / "venv"),
        hal0_release_dir=str(gone / "current"),
        hal0_config_file=str(gone / "hal0.toml"),
    )
    with structlog.testing.capture_logs() as quiet:
        Reconciler(settings).reconcile(NOT_AMD)
    assert [] == _fallbacks(quiet), "hal0 fallbacks logged on a host without amdgpu"
    engine = Reconciler(settings)
    with structlog.testing.capture_logs() as logs:
        engine.reconcile(ROCM_USABLE)
        first = _fallbacks(logs)
        engine.reconcile(ROCM_USABLE)
    assert first, "a missing hal0 install was not said"
    assert {"warning"} == {level for _, level in first}
    assert first == _fallbacks(logs), "hal0 fallbacks repeated on every pass"
    tree = Hal0Tree(gone).install("ade07ba")
    engine.update_settings(make_settings(**tree.settings()))
    with structlog.testing.capture_logs() as fixed:
        engine.reconcile(ROCM_USABLE)
    engine.update_settings(settings)
    with structlog.testing.capture_logs() as again:
        engine.reconcile(ROCM_USABLE)
    assert first == _fallbacks(again), "a hal0 problem that came back was not said again"
    del fixed


def test_a_hal0_file_that_cannot_be_understood_is_an_error(
    host_dirs: dict[str, Path], make_settings
) -> None:
    """A hal0 source that is there but cannot be read as hal0 writes it is an ERROR (the
    reconciler may be judging with stale facts), not a routine fallback."""
    settings = make_settings()
    schema = next(Path(settings.hal0_venv).rglob("config/schema.py"))
    schema.write_text("IMAGES = (\n")  # cut short: not Python
    with structlog.testing.capture_logs() as logs:
        Reconciler(settings).reconcile(ROCM_USABLE)
    levels = dict(_fallbacks(logs))
    assert "error" in levels.values(), f"a garbled hal0 file was not an error: {levels}"


def test_a_hal0_update_is_said_once(host_dirs: dict[str, Path], make_settings) -> None:
    """hal0 updated between passes (other default image): one info event naming both versions."""
    settings = make_settings()
    engine = Reconciler(settings)
    engine.reconcile(ROCM_USABLE)
    tree = Hal0Tree(Path(settings.hal0_venv).parents[3])
    tree.install("0826")
    with structlog.testing.capture_logs() as logs:
        engine.reconcile(ROCM_USABLE)
        engine.reconcile(ROCM_USABLE)
    changed = [e for e in logs if e["event"] == "hal0.facts_changed"]
    assert 1 == len(changed), f"hal0.facts_changed logged {len(changed)} times"
    assert (changed[0]["old_version"], changed[0]["version"]) == ("1.1.0", "1.3.0")


def test_a_bad_name_fixed_then_back_is_said_again(host_dirs: dict[str, Path], make_settings):
    """A name hal0 cannot run, fixed, then back: said twice (a fixed problem is forgotten),
    also when the pass that saw the file gone ran without amdgpu."""
    slot = host_dirs["slots_dir"] / "odd.toml"
    bad, good = 'name = "Odd"\ndevice = "cpu"\n', 'name = "odd"\ndevice = "cpu"\n'
    engine = Reconciler(make_settings())
    with structlog.testing.capture_logs() as logs:
        slot.write_text(bad)
        engine.reconcile(ROCM_USABLE)
        slot.write_text(good)
        engine.reconcile(ROCM_USABLE)
        slot.write_text(bad)
        engine.reconcile(ROCM_USABLE)
        slot.unlink()
        engine.reconcile(NOT_AMD, [slot])
        slot.write_text(bad)
        engine.reconcile(ROCM_USABLE)
    said = [e["path"] for e in logs if e["event"] == "slot.name_invalid"]
    assert 3 == len(said), f"slot.name_invalid said {len(said)} times, not 3"
