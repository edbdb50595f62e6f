"""What every verdict of one pass depends on besides the file, and the verdicts made with it.

Made once per pass (host facts, hal0's facts, the profile catalog, hal0's Vulkan opt-in, the
operator's ``hands_off``), then asked for each file: pure, no I/O.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hal0_reconciler.host.restarts import rules as restart_rules
from hal0_reconciler.model import Action, Catalog, Hal0Facts, HostFacts, Reason, Verdict
from hal0_reconciler.reconcile.outcome import Hold
from hal0_reconciler.slots import document, image, policy, runtime


@dataclass(frozen=True)
class Judge:
    """The pass's context; ``memory_key`` changes exactly when every slot must be judged again."""

    facts: HostFacts
    hal0: Hal0Facts
    catalog: Catalog
    vulkan_paused: bool  # HAL0_ALLOW_VULKAN_FALLBACK set in hal0's api.env
    hands_off: frozenset[str]  # settings.hands_off: slot names or ids never relabelled

    def memory_key(self) -> tuple[object, ...]:
        """What a remembered verdict is valid for (when it changes, every slot is judged
        again, from its cached parse when the file is unchanged)."""
        return (
            self.facts.amd,
            self.facts.lane,
            self.hal0,
            id(self.catalog),
            self.vulkan_paused,
            self.hands_off,
        )

    @functools.cached_property
    def _legacy_backend(self) -> bool:
        """Whether a legacy ``backend`` labels a candidate under this hal0 (once per pass)."""
        return policy.backend_counts(self.hal0)

    @functools.cached_property
    def _hold(self) -> Reason | None:
        """Why this hal0 has every slot kept, if it does (once per pass)."""
        return policy.hold_of(self.hal0)

    def decide(self, doc: document.SlotDoc, *, demoted: bool) -> Verdict:
        """The policy's verdict on this slot (``demoted``: it is on ``cpu`` by our doing)."""
        legacy = self._legacy_backend
        candidate = policy.is_candidate(doc, legacy_backend=legacy)
        return policy.decide(
            doc,
            runtime=runtime.runtime_of(doc, self.catalog),
            image=image.effective_image(doc, self.hal0) if candidate else None,
            facts=self.facts,
            demoted_by_us=demoted,
            hold=self._hold,
            legacy_backend=legacy,
        )

    def held_back(self, doc: document.SlotDoc, verdict: Verdict) -> tuple[Hold, str] | None:
        """Why a deliberate choice keeps this slot as it is: the operator's ``hands_off``, or
        hal0's Vulkan opt-in while a Vulkan-candidate relabel is due."""
        if restart_rules.is_hands_off(self.hands_off, name=doc.name, slot_id=doc.id):
            return Hold.OPERATOR, "operator: listed in hands_off (never relabelled nor restarted)"
        relabel = verdict.action not in {Action.KEEP, Action.SKIP}
        if self.vulkan_paused and relabel and verdict.old == "gpu-vulkan":
            return (
                Hold.PAUSED,
                f"paused: {restart_rules.VULKAN_FALLBACK_VARIABLE} is set in hal0's api.env",
            )
        return None
