"""Both sides of a parity comparison for one box: hal0's reference run and ``plan --json``.

hal0 side: the box copied into hal0's ``HAL0_HOME`` layout, ``helpers/hal0_reference.py`` run
by the release's own venv python (a fresh process per box and lane: hal0 caches its manifest per
process, and its relabel rewrites the files). Reconciler side: ``hal0-reconciler plan --json
--assume-amd --assume-rocm=<lane>`` on the original tree, settings pointing into it, run by
this interpreter (``PYTHONPATH`` chooses the checkout under test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import parity_corpus as corpus

from helpers import hal0_install, hal0_releases

REFERENCE = Path(__file__).resolve().parent.parent / "helpers" / "hal0_reference.py"
TIMEOUT = 120.0
# hal0 fsyncs every file it writes: its copy goes to a memory filesystem when there is one
SHM = Path("/dev/shm")
SCRATCH = str(SHM) if SHM.is_dir() and os.access(SHM, os.W_OK) else None
_ENV_DROP = ("HAL0_HOME", "HAL0_ALLOW_VULKAN_FALLBACK")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    return {k: v for k, v in env.items() if not k.startswith(("HAL0_RUNNER_", "HAL0_TOOLBOX_"))}


def build(
    root: Path, release: hal0_releases.Release, box: corpus.Box, *, wheel_cache: Path
) -> Path:
    marker = f"version={release.version}\n" if box.restore_marker else None
    case = hal0_install.InstallCase(
        slots=corpus.slot_files(),
        hal0_toml=box.hal0_toml,
        api_env=box.api_env,
        release_manifest=box.release_manifest,
        etc_manifest=box.etc_manifest,
        restore_marker=marker,
        extra=_profile_centric_marker(release, box),
    )
    tree = hal0_install.install_tree(root, release, case, wheel_cache=wheel_cache)
    if box.manifest_link:  # as an update may lay it out: the file elsewhere, a link to it
        link = tree / "usr/lib/hal0/current/manifest.json"
        real = tree / "usr/lib/hal0/manifest-stable.json"
        link.rename(real)
        link.symlink_to(os.path.relpath(real, link.parent))
    return tree


def _profile_centric_marker(release: hal0_releases.Release, box: corpus.Box) -> dict[str, str]:
    if box.profile_centric_marker is None:
        return {}
    version = box.profile_centric_marker or release.version
    path = f"var/lib/hal0/{hal0_install.PROFILE_CENTRIC_MARKER}"
    return {path: f"# written by a restore\nversion = {version}\n"}


@dataclass(frozen=True)
class Reference:
    devices: dict[str, str | None]  # slot file -> the device hal0 launches after its boot passes
    original: dict[str, str | None]  # ... before its boot passes
    before: dict[str, str | None]  # ... as its passes before the relabel leave it
    launch_judged: dict[str, str | None]  # hal0's relabel predicates on the launch path's view
    tables: dict[str, dict[str, bool]]  # where the keys sit as the relabel finds them
    steps: list[str]
    stopped: str | None  # why hal0's boot passes stopped before the relabel, if they did
    manifest_error: str | None  # 1.4+: hal0's own verdict on the manifest it reads


def reference(
    python: Path, root: Path, home: Path, *, usable: bool, hal0_toml: str | None = None
) -> Reference:
    """hal0's boot passes on a copy of ``root``; with ``hal0_toml`` (that file replaced in the
    copy) only the passes before the relabel and hal0's predicates on what launches."""
    hal0_install.hal0_home_copy(root, home)
    argv = [str(python), str(REFERENCE), str(home), "usable" if usable else "unusable"]
    if hal0_toml is not None:
        (home / "etc/hal0/hal0.toml").write_text(hal0_toml, encoding="utf-8")
        argv.append("--no-relabel")
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env=_clean_env(), check=False
    )
    if done.returncode != 0:
        msg = f"hal0's reference run failed ({done.returncode}): {done.stderr[-2000:]}"
        raise AssertionError(msg)
    doc = json.loads(done.stdout)
    slots = doc["slots"]
    return Reference(
        devices={name: entry["device"] for name, entry in slots.items()},
        original={name: entry["original"] for name, entry in slots.items()},
        before={name: entry["before_relabel"] for name, entry in slots.items()},
        launch_judged={name: entry["launch_path_judged"] for name, entry in slots.items()},
        tables={name: entry["tables_before_relabel"] for name, entry in slots.items()},
        steps=doc["steps"],
        stopped=doc["stopped"],
        manifest_error=doc["manifest_error"],
    )


@dataclass(frozen=True)
class Plan:
    new: dict[str, str | None]  # slot file -> the device a relabel verdict sets (None: kept)
    reported: dict[str, str | None]  # ... the device plan reports the slot on now
    actions: dict[str, str | None]
    reasons: dict[str, str | None]
    doc: dict[str, Any]

    def verdict(self, name: str, launched_now: str | None) -> str | None:
        """The device the slot launches on after the verdict: a relabel's new device, else
        the device it launches on now (the file is left as it is)."""
        if name not in self.actions:
            return "(no verdict)"
        return self.new.get(name) or launched_now


def plan(root: Path, state: Path, *, usable: bool) -> Plan:
    config = state / "reconciler.toml"
    state.mkdir(parents=True, exist_ok=True)
    config.write_text(hal0_install.settings_toml(root, state), encoding="utf-8")
    lane = "usable" if usable else "unusable"
    argv = [sys.executable, "-m", "hal0_reconciler", "plan", "--json", "--config", str(config)]
    argv += ["--assume-amd", f"--assume-rocm={lane}", "--log-level", "error"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env=_clean_env(), check=False
    )
    try:
        doc = json.loads(done.stdout)
    except ValueError as exc:
        msg = f"plan --json gave no JSON (exit {done.returncode}): {done.stderr[-2000:]}"
        raise AssertionError(msg) from exc
    new: dict[str, str | None] = {}
    reported: dict[str, str | None] = {}
    actions: dict[str, str | None] = {}
    reasons: dict[str, str | None] = {}
    for slot in doc.get("slots") or []:
        name = Path(slot["path"]).name
        actions[name] = slot.get("action")
        reasons[name] = slot.get("reason")
        new[name] = slot.get("new") if slot.get("action") == "relabel" else None
        reported[name] = slot.get("device")
    return Plan(new, reported, actions, reasons, doc)
