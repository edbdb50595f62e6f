"""A snapshot of the host as the policy needs it: AMD or not, and the service user's ROCm lane.

``lane_state`` and ``host_facts`` are pure; ``is_amd_host`` and ``gather`` do the I/O.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hal0_reconciler import errors
from hal0_reconciler.model import Credentials, HostFacts, LaneState, ProbeResult

if TYPE_CHECKING:
    from hal0_reconciler.settings import Settings


def is_amd_host(settings: Settings) -> bool:
    """An AMD host is one whose kernel has the amdgpu module (``/sys/module/amdgpu`` exists)."""
    return settings.amdgpu_module_dir.exists()


def lane_state(result: ProbeResult) -> LaneState:
    """USABLE when the service user opened kfd and a render node; UNKNOWN when the probe
    itself could not run (a typo in the user, the interpreter gone): that proves nothing."""
    if result.error is not None:
        return LaneState.UNKNOWN
    return LaneState.USABLE if result.usable else LaneState.UNUSABLE


def host_facts(*, amd: bool, result: ProbeResult | None) -> HostFacts:
    """The snapshot from its parts; a non-AMD host carries no probe and an unusable lane."""
    if not amd or result is None:
        return HostFacts(amd=amd, lane=LaneState.UNUSABLE, probe=None)
    return HostFacts(amd=True, lane=lane_state(result), probe=result)


def gather(
    settings: Settings,
    *,
    credentials: Credentials | None = None,
    interpreter: str | None = None,
) -> HostFacts:
    """Look at the host now. The lane is probed only on an AMD host, as the service user.

    ``credentials`` default to the slot services' identity (``host.identity``) resolved now; a
    user that cannot be resolved gives an UNKNOWN lane whose probe carries the error. Never
    raises ProbeFailed.
    """
    if not is_amd_host(settings):
        return host_facts(amd=False, result=None)
    from hal0_reconciler.host import identity, probe  # noqa: PLC0415 - only on an AMD host

    if credentials is None:
        who = identity.slot_runner(settings)
        try:
            credentials = dataclasses.replace(probe.resolve_credentials(who.spec), why=who.why)
        except errors.ProbeFailed as exc:
            unresolved = ProbeResult(
                usable=False,
                credentials=None,
                kfd_ok=False,
                render_node=None,
                error=f"{exc} ({who.why})",
            )
            return host_facts(amd=True, result=unresolved)
    result = probe.probe_rocm_lane(
        kfd_path=settings.kfd_path,
        dri_dir=settings.dri_dir,
        credentials=credentials,
        timeout=settings.probe_timeout,
        interpreter=interpreter,
    )
    return host_facts(amd=True, result=result)


SETTLED_NS = 1_000_000_000
"""A file changed less than this before the early look is not trusted to be unchanged by its
stat fields (a change within the same coarse clock tick can leave them equal)."""
_ACCOUNTS = (Path("/etc/passwd"), Path("/etc/group"))

Mark = tuple[int, int, int, int, int, int] | None


def _mark(path: Path) -> Mark:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_ctime_ns)


def host_marks(settings: Settings) -> dict[str, Mark]:
    """What the lane's verdict rests on, by stat identity: the amdgpu module folder, the KFD
    node, the render nodes' folder and every entry in it, the user and group databases."""
    paths = [settings.amdgpu_module_dir, settings.kfd_path, settings.dri_dir, *_ACCOUNTS]
    with contextlib.suppress(OSError):
        paths += [settings.dri_dir / name for name in sorted(os.listdir(settings.dri_dir))]
    return {str(p): _mark(p) for p in paths}


class EarlyGather:
    """``gather`` started ahead of time in a thread: the daemon starts it before it loads the
    rest of itself, so the probe's child runs meanwhile (on another core, mostly waiting in
    this process). Called as a ``gather``: the first call takes that result when it is for the
    same settings and nothing it rests on (``host_marks``) changed since it started, and no
    mark was fresh then (a change in the same clock tick); else, and for every later call, it
    looks at the host now. So the daemon's first pass judges the host as of after its watches
    were set up, as without it: a change before them is seen by the marks, after by the watches.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        started_ns = time.time_ns()
        self._marks = host_marks(settings)
        self._fresh = any(
            m is not None and m[5] > started_ns - SETTLED_NS for m in self._marks.values()
        )
        self._result: HostFacts | None = None
        self._taken = False
        from hal0_reconciler import threadname  # noqa: PLC0415 - the daemon's only: not plan

        self._thread = threadname.NamedThread(
            target=self._run, name="hal0-early-probe", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        # this thread holds the stop and reload signals as the main thread does (held_signals):
        # the probe's child unblocks them itself
        try:
            self._result = gather(self._settings)
        except Exception:  # the first call looks again, and says why
            self._result = None

    def __call__(self, settings: Settings) -> HostFacts:
        if self._taken:
            return gather(settings)
        self._taken = True
        self._thread.join()
        result = self._result
        same = settings == self._settings and host_marks(settings) == self._marks
        failed = result is None or (result.probe is not None and result.probe.error is not None)
        if failed or self._fresh or not same:
            return gather(settings)
        assert result is not None  # noqa: S101 - for mypy: not failed
        return result
