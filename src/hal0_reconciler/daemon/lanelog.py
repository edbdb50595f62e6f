"""How a change of the ROCm lane reads in the log: the four lane names an operator sees
everywhere (usable / unusable / unknown / not-amd), never the tracker's inner "within the
demotion grace" state: a lane that just failed is ``unusable`` with ``demotion_in``."""

from __future__ import annotations

from hal0_reconciler import _log
from hal0_reconciler.model import LaneState

log = _log.get_logger("hal0_reconciler.daemon")


def lane_name(state: LaneState) -> str:
    """The lane as an operator reads it: one of usable / unusable / unknown (with not-amd, the
    four names); a lane within its demotion grace is ``unusable`` (``demotion_in`` says more)."""
    return state.shown


def log_lane_change(old: LaneState, new: LaneState, *, reason: str, left: float | None) -> None:
    """``host.rocm_lane_changed`` once per change of the lane's name (a lane that just failed:
    ``unusable`` with ``demotion_in``); the end of the grace is its own event."""
    if lane_name(old) == lane_name(new):  # the grace ran out: demotions start now
        log.warning(
            "host.rocm_lane_demoting",
            lane=lane_name(new),
            reason=reason,
            effect="gpu-vulkan slots that need the ROCm lane are demoted to cpu",
        )
        return
    worse = new in {LaneState.UNUSABLE, LaneState.UNKNOWN}  # within the grace: nothing moves yet
    (log.warning if worse else log.info)(
        "host.rocm_lane_changed",
        old=lane_name(old),
        new=lane_name(new),
        reason=reason,
        demotion_in=_left(new, left),
    )


def _left(new: LaneState, left: float | None) -> str | None:
    """The time before demotions start, for a lane that is unusable now (``0s``: at once, with
    ``demote_grace = 0``); nothing for a lane that is usable or unknown."""
    if left is not None:
        return f"{left:.0f}s"
    return "0s" if new is LaneState.UNUSABLE else None
