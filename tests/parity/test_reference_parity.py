"""Every verdict of ``plan --json`` equals the device hal0 launches after its own boot passes.

Per release of the list and per lane (ROCm usable / not: decision 10, both sides are given the
same lane), every box of the corpus is built from the release's real wheel; hal0's own boot
sequence runs on a copy in the release's venv (``helpers/hal0_reference.py``) and
``hal0-reconciler plan --json --assume-amd --assume-rocm=<lane>`` on the original. A slot whose
verdict device differs from the device hal0 launches is a disagreement unless it is one of the
documented deliberate differences below, each recognised by a condition that holds only for
it and counted apart.

Against another checkout: ``PYTHONPATH=<checkout>/src`` (the reconciler every ``plan`` runs,
and whose settings the trees' settings files are written for). ``HAL0_PARITY_REPORT=<file>``
appends every disagreement line to that file.

Batching: hal0 reads its manifest once per process and its relabel rewrites the files, so each
box and lane gets its own tree copy and its own hal0 process (26 per release, 28 with the box
whose hal0.toml is also judged cut to [slots]); boxes run two at a time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import parity_corpus as corpus
import parity_harness as harness
import parity_releases as parity
import pytest

from helpers import hal0_releases

JOBS = 2  # boxes at a time (the machine's cores); a box's processes run one after the other


@dataclass(frozen=True)
class Seen:
    """One slot of one box: what each side says and what hal0's own predicates say."""

    box: corpus.Box
    slot: str
    hal0: str | None  # the device hal0 launches after its boot passes
    ours: str | None  # the device the reconciler's verdict leaves (None: no verdict)
    original: str | None  # the device the slot launched on before hal0's boot passes
    before: str | None  # the launched device as hal0's passes before its relabel leave it
    launch_judged: str | None  # hal0's relabel predicates applied to the launch path's view
    slots_only_judged: str | None  # ... with hal0.toml cut to its [slots] (None: not measured)
    stopped: bool  # hal0's boot passes stopped before the relabel
    manifest_error: bool  # 1.4+: hal0 finds its manifest missing or invalid
    split: bool  # the slot's keys are split between the top level and [slot]
    both_vulkan: bool  # both tables say device = "gpu-vulkan"
    why: str  # the reconciler's action and reason, for the disagreement lines


# The documented deliberate differences (docs/rule.md; decisions-0.3.md), in ONE place: each a
# reason and a condition under which the reconciler's verdict is the documented one. Anything
# else that differs is a disagreement.
DELIBERATE: dict[str, tuple[str, Callable[[Seen], bool]]] = {
    "1 split keys": (
        (
            "hal0's relabel judges one holder table (top level first); the reconciler judges the "
            "launch path ([slot].k else top-level k): its verdict is hal0's own predicates on "
            "what launches"
        ),
        lambda s: s.split and not s.both_vulkan and s.ours == s.launch_judged,
    ),
    "2 both tables gpu-vulkan": (
        (
            "hal0 rewrites the top-level device, which the launcher ignores; the reconciler "
            "changes both values, so the slot launches the relabelled device"
        ),
        lambda s: s.both_vulkan and s.hal0 == "gpu-vulkan" and s.ours == s.launch_judged,
    ),
    "5 hal0.toml's other sections": (
        (
            "hal0 drops every default_images when any section of hal0.toml is invalid; the "
            "reconciler validates only [slots] (as that release's SlotsConfig): its verdict is "
            "hal0's own passes and predicates on the file cut to [slots]"
        ),
        lambda s: s.slots_only_judged is not None and s.ours == s.slots_only_judged,
    ),
    "5 boot stopped by hal0.toml": (
        (
            "an invalid hal0.toml stops hal0's boot passes before its relabel; the reconciler "
            "judges as the relabel would (and warns): a broken settings file must not leave "
            "slots stale"
        ),
        lambda s: s.stopped and s.ours == s.launch_judged,
    ),
    "8 manifest fails closed": (
        (
            "pins era, manifest missing/unreadable/invalid: hal0 calls every Vulkan slot not "
            "capable and relabels it; the reconciler keeps every slot, degraded (a half-replaced "
            "manifest must never move slots)"
        ),
        lambda s: s.manifest_error and s.ours == s.before and s.hal0 != s.before,
    ),
    "10 ROCm probe": (
        (
            "the reconciler probes the ROCm lane itself (a real open as the slot runner); here "
            "both sides are given the same lane, so it never shows"
        ),
        lambda _s: False,
    ),
}


def _run_box(
    release: hal0_releases.Release,
    python: Path,
    box: corpus.Box,
    wheel_cache: Path,
    *,
    usable: bool,
) -> list[Seen]:
    work = Path(tempfile.mkdtemp(prefix=f"parity-{release.version}-"))
    home = Path(tempfile.mkdtemp(prefix=f"parity-{release.version}-", dir=harness.SCRATCH))
    try:
        root = harness.build(work / "root", release, box, wheel_cache=wheel_cache)
        names = sorted(p.name for p in (root / "etc/hal0/slots").iterdir())
        ref = harness.reference(python, root, home / "hal0-home", usable=usable)
        cut = None
        if box.slots_part is not None:  # hal0's own loader and predicates on the mutated file
            cut = harness.reference(
                python, root, home / "hal0-cut", usable=usable, hal0_toml=box.slots_part
            )
        ours = harness.plan(root, work / "reconciler", usable=usable)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    assert sorted(ref.devices) == names, "hal0's answer must cover every slot file"
    seen = []
    for name, device in sorted(ref.devices.items()):
        tables = ref.tables[name]  # as hal0's relabel finds the file (its conversions ran)
        seen.append(
            Seen(
                box=box,
                slot=name,
                hal0=device,
                ours=ours.verdict(name, ref.original[name]),
                original=ref.original[name],
                before=ref.before[name],
                launch_judged=ref.launch_judged[name],
                slots_only_judged=cut.launch_judged[name] if cut else None,
                stopped=ref.stopped is not None,
                manifest_error=ref.manifest_error is not None,
                split=tables["split"],
                both_vulkan=tables["both_vulkan"],
                why=f"{ours.actions.get(name)} {ours.reasons.get(name)}",
            )
        )
    return seen


def _classify(seen: Seen) -> str | None:
    """``None``: agreement; a DELIBERATE key; or "disagree"."""
    if seen.ours == seen.hal0:
        return None
    for key, (_reason, holds) in DELIBERATE.items():
        if holds(seen):
            return key
    return "disagree"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("release", parity.RELEASES, ids=parity.release_ids())
def test_plan_agrees_with_hal0s_boot_sequence(
    release: hal0_releases.Release, wheel_cache: Path
) -> None:
    python = parity.require(release, fail_in_ci=True)
    jobs = [(box, usable) for usable in (True, False) for box in corpus.BOXES]
    with ThreadPoolExecutor(JOBS) as pool:
        results = list(
            pool.map(lambda j: _run_box(release, python, j[0], wheel_cache, usable=j[1]), jobs)
        )
    disagreements: list[str] = []
    for (_box, usable), seen in zip(jobs, results, strict=True):
        lane = "rocm-usable" if usable else "rocm-unusable"
        counts: Counter[str] = Counter()
        for s in seen:
            kind = _classify(s)
            counts[kind or "agree"] += 1
            counts[MOVED] += s.hal0 != s.original
            if kind == "disagree":
                disagreements.append(
                    f"{release.version} {lane} {s.box.name}/{s.slot}: hal0 launches {s.hal0}, "
                    f"ours {s.ours} ({s.why}; before hal0's relabel {s.before}, hal0's "
                    f"predicates on the launch path {s.launch_judged})"
                )
        _record(release, lane, _box, counts)
    _report(release)
    for lane in LANES:  # the reference did its job: hal0 moved slots exactly where it can
        moved = _TOTALS[release.version, lane][MOVED]
        assert (moved > 0) == (release.era != "pre-rule"), f"{lane}: hal0 moved {moved} slots"
    for lane in LANES:  # each documented difference is kept, not given up to agree with hal0
        shown = {kind.split()[0] for kind, n in _TOTALS[release.version, lane].items() if n}
        missing = SHOWN_IN[release.era] - shown
        assert not missing, f"{lane}: deliberate differences {sorted(missing)} never seen"
    if report := os.environ.get("HAL0_PARITY_REPORT"):
        with Path(report).open("a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in disagreements)
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(
        disagreements[:200]
    )


_TOTALS: dict[tuple[str, str], Counter[str]] = {}
MOVED = "(hal0 moved)"  # slots hal0's boot passes moved to another device: not a verdict kind
LANES = ("rocm-usable", "rocm-unusable")
# The deliberate differences the corpus shows in each era (decision numbers): none before the
# rule (no relabel), 8 only where the manifest is the source (pins).
SHOWN_IN = {"pre-rule": set(), "allowlist": {"1", "2", "5"}, "pins": {"1", "2", "5", "8"}}


def _record(release: hal0_releases.Release, lane: str, _box: corpus.Box, c: Counter[str]) -> None:
    _TOTALS.setdefault((release.version, lane), Counter()).update(c)


def _report(release: hal0_releases.Release) -> None:
    for lane in LANES:
        c = _TOTALS.get((release.version, lane), Counter())
        compared = sum(n for kind, n in c.items() if kind != MOVED)
        deliberate = ", ".join(f"{k}: {c[k]}" for k in DELIBERATE if c[k]) or "none"
        parity.FIGURES.append(
            f"hal0 {release.version} {lane}: {compared} verdicts compared, {c['agree']} agree, "
            f"{c['disagree']} disagree; deliberate differences: {deliberate}; hal0 moved "
            f"{c[MOVED]}"
        )


def test_every_deliberate_difference_has_a_reason() -> None:
    """The list names each documented decision once, with its reason."""
    assert [k.split()[0] for k in DELIBERATE] == ["1", "2", "5", "5", "8", "10"]
    assert all(len(reason) > 40 for reason, _holds in DELIBERATE.values())
