"""Paths and host facts that tests share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hal0_reconciler.model import HostFacts, LaneState

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
SHARED = Path(os.environ.get("HAL0_SHARED_DIR", REPO.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or a skip with the reason when this clone has none."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared fixtures come with CI, not with a clone")
    return path


ROCM_USABLE = HostFacts(amd=True, lane=LaneState.USABLE)
ROCM_UNUSABLE = HostFacts(amd=True, lane=LaneState.UNUSABLE)
ROCM_UNSETTLED = HostFacts(amd=True, lane=LaneState.UNSETTLED)
NOT_AMD = HostFacts(amd=False, lane=LaneState.UNUSABLE)
