"""hal0's own judgement of a slot set: run by a release's venv python, one process per tree.

Usage: ``<venv>/bin/python hal0_reference.py HOME LANE [--no-relabel]`` (LANE ``usable`` or
``unusable``; ``--no-relabel``: the passes before the relabel and hal0's predicates only).

It does what hal0-api does at boot (``check_outstanding_migrations`` ->
``run_post_activation_migrations``), limited to the passes that touch slot files, in hal0's
order and with hal0's fatality:

- 1.4.0+: the runner-system conversion and the profile-centric conversion (both fatal, with
  ``honour_restore_marker=True`` as the boot passes it), the config migrations (fatal), then
  ``relabel_stale_vulkan_slots`` (its failure is only logged by hal0);
- 1.0.0-1.3.0: the config migrations (fatal), then the relabel (no retag at boot);
- 0.9.8, 1.0.0a2: nothing touches a slot at boot.

Only the relabel's test seams are set (``rocm_lane`` or ``kfd_present``, by the release's
signature, and ``amd_host=True``); nothing else of hal0 is patched. The passes that reach podman,
systemd or the network (unit re-render, hermes, components, kokoro) are not run: none of them
writes a slot's device. ``HAL0_HOME`` is the tree, hal0-api's ``api.env`` is loaded into this
process's environment first (hal0-api gets it from its unit's EnvironmentFile=), and hal0 caches
its manifest per process, so every tree gets a fresh process.

The answer (JSON on stdout) is, per slot file, the device hal0 LAUNCHES afterwards: the launch
path overlays ``[slot]`` on the top level per key (``SlotManager._load_slot_config``).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import tomllib
from pathlib import Path


def _load_env_file(path: Path) -> None:
    """systemd EnvironmentFile= lines: KEY=VALUE, comments (#, ;) and blanks skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        os.environ[key.strip()] = value


_KEYS = frozenset({"device", "image_pin", "binary", "type", "provider", "profile", "backend"})


def _tables(path: Path) -> dict[str, bool]:
    """Where the slot's keys sit: split between the top level and ``[slot]``; both tables
    ``device = "gpu-vulkan"`` (what hal0's holder-table relabel and the launch path disagree on)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {"split": False, "both_vulkan": False}
    slot = data.get("slot")
    slot = slot if isinstance(slot, dict) else {}
    return {
        "split": bool(_KEYS & data.keys()) and bool(_KEYS & slot.keys()),
        "both_vulkan": data.get("device") == "gpu-vulkan" == slot.get("device"),
    }


def _merged(path: Path) -> dict[str, object] | str:
    """The launch path's view of a slot file (``[slot]`` over the top level, per key), or
    why it cannot be read."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    slot = data.pop("slot", None)
    if isinstance(slot, dict):
        data.update(slot)
    return data


def _device(view: dict[str, object] | str) -> str | None:
    """The device a slot launches on: ``device``, else hal0's own mapping of a legacy
    ``backend`` (``map_backend_to_device``, what the launcher's backend amounts to), else
    ``None`` (no opinion: the profile decides)."""
    if not isinstance(view, dict):
        return None
    device = view.get("device")
    if isinstance(device, str) and device:
        return device
    backend = view.get("backend")
    if isinstance(backend, str) and backend:
        from hal0.model_meta import map_backend_to_device

        return str(map_backend_to_device(backend))
    return None


def _launch_path_judged(view: dict[str, object] | str, lane_usable: bool) -> str | None:
    """What hal0's relabel would leave if its holder were the launch path's view: hal0's own
    predicates (``_spec_provider_for``, ``_vulkan_lane_is_loadable``) on the merged slot."""
    from hal0.updater import updater

    device = _device(view)
    if device != "gpu-vulkan" or not isinstance(view, dict):
        return device
    loadable = getattr(updater, "_vulkan_lane_is_loadable", None)
    if loadable is None:
        return device  # no relabel in this release
    from hal0.providers.container import _spec_provider_for

    try:
        if _spec_provider_for(dict(view)) is not None:
            return device
    except Exception:
        return device
    if loadable(dict(view)):
        return device
    return "gpu-rocm" if lane_usable else "cpu"


def _manifest_error() -> str | None:
    """hal0's own verdict on the manifest it reads (1.4+: the runner pin table)."""
    try:
        from hal0.runners import pins
    except ImportError:
        return None
    try:
        pins.runner_pins()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def _before_relabel(steps: list[str]) -> None:
    """The boot passes before the relabel that touch slot files, in hal0's order (fatal)."""
    from hal0.updater import updater

    if getattr(updater, "relabel_stale_vulkan_slots", None) is None:
        return  # 0.9.8, 1.0.0a2: no relabel, nothing runs at boot on slot files
    try:
        from hal0.config.migrations import runner_system
    except ImportError:
        runner_system = None
    if runner_system is not None:
        from hal0.config.migrations import profile_centric_apply

        runner_system.migrate_runner_system(job_id=None, honour_restore_marker=True)
        steps.append("runner_system")
        profile_centric_apply.migrate_profile_centric(job_id=None, honour_restore_marker=True)
        steps.append("profile_centric")
    updater._maybe_run_config_migrations(1, job_id=None)
    steps.append("config_migrations")


def _relabel(steps: list[str], lane_usable: bool) -> None:
    from hal0.updater import updater

    relabel = getattr(updater, "relabel_stale_vulkan_slots", None)
    if relabel is None:
        return
    params = inspect.signature(relabel).parameters
    seam = "rocm_lane" if "rocm_lane" in params else "kfd_present"
    try:
        relabel(job_id=None, amd_host=True, **{seam: lane_usable})
        steps.append(f"relabel({seam}={lane_usable})")
    except Exception as exc:
        steps.append(f"relabel failed: {type(exc).__name__}: {exc}")


def main() -> int:
    home = Path(sys.argv[1])
    lane_usable = sys.argv[2] == "usable"
    os.environ["HAL0_HOME"] = str(home)
    _load_env_file(home / "etc/hal0/api.env")
    logging.disable(logging.CRITICAL)
    slots_dir = home / "etc/hal0/slots"
    stopped = None
    steps: list[str] = []
    out, sys.stdout = sys.stdout, sys.stderr  # hal0's log lines never mix into the answer
    try:
        original = {p.name: _device(_merged(p)) for p in sorted(slots_dir.glob("*.toml"))}
        try:
            _before_relabel(steps)
        except Exception as exc:
            stopped = f"{type(exc).__name__}: {exc}"[:500]
        views = {p.name: _merged(p) for p in sorted(slots_dir.glob("*.toml"))}
        tables = {p.name: _tables(p) for p in sorted(slots_dir.glob("*.toml"))}
        judged = {name: _launch_path_judged(view, lane_usable) for name, view in views.items()}
        manifest_error = _manifest_error()
        if stopped is None and "--no-relabel" not in sys.argv[3:]:
            _relabel(steps, lane_usable)
    finally:
        sys.stdout = out
    slots = {
        p.name: {
            "device": _device(_merged(p)),  # what hal0 launches after its boot passes
            "original": original.get(p.name),  # ... and before them
            "before_relabel": _device(views.get(p.name, "")),
            "launch_path_judged": judged.get(p.name),
            "tables_before_relabel": tables.get(p.name),
            "unreadable": views[p.name] if isinstance(views.get(p.name), str) else None,
        }
        for p in sorted(slots_dir.glob("*.toml"))
    }
    doc = {"steps": steps, "stopped": stopped, "manifest_error": manifest_error, "slots": slots}
    json.dump(doc, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
