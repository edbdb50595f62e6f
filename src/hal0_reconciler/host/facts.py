"""A snapshot of the host as the policy needs it: AMD or not, and the service user's ROCm lane.

``lane_state`` and ``host_facts`` are pure; ``is_amd_host`` and ``gather`` do the I/O.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from hal0_reconciler import errors
from hal0_reconciler.host import identity
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
    from hal0_reconciler.host import probe  # noqa: PLC0415 - subprocess: only on an AMD host

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
