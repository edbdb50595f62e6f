"""What the installed hal0 believes, as the pass uses it: read at every pass (cheap when
unchanged), the release and era said once at start, a change said once, and each source that
could not be read said once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal0_reconciler._log import get_logger
from hal0_reconciler.host.hal0 import reader as hal0

if TYPE_CHECKING:
    from hal0_reconciler.model import Hal0Facts
    from hal0_reconciler.settings import Settings

_log = get_logger("hal0_reconciler.reconcile")


class Hal0View:
    """hal0's facts as read for the last pass, and the fallbacks read with them."""

    def __init__(self, settings: Settings, *, announce: bool = False) -> None:
        self.facts: Hal0Facts | None = None
        self.problems: tuple[hal0.FactProblem, ...] = ()
        self._reported: frozenset[hal0.FactProblem] = frozenset()
        self._placed_said = not announce  # the release and era are said once, at the first pass
        self.use(settings)

    def use(self, settings: Settings) -> None:
        """Read where these settings say from now on; what was said stays said."""
        self._reader = hal0.Hal0Reader(settings)

    def refresh(self, *, quiet: bool) -> Hal0Facts:
        """Read hal0's facts now (``quiet``: not a host this daemon acts on, nothing said)."""
        read = self._reader.read()
        old, new = self.facts, read.facts
        self.facts, self.problems = new, read.problems
        if quiet:
            return new
        if not self._placed_said:  # once: which release is installed, by which era it is judged
            self._placed_said = True
            _log.info(
                "hal0.placed",
                summary=hal0.summary(new),
                version=new.version,
                release=new.release,
                rule=new.rule.value,
                rule_evidence=new.rule_evidence,
            )
        elif old is not None and (old.default_image, old.capable, old.rule, old.release) != (
            new.default_image,
            new.capable,
            new.rule,
            new.release,
        ):
            _log.info(
                "hal0.facts_changed",
                summary=hal0.summary(new),
                version=new.version,
                old_version=old.version,
                release=new.release,
                old_release=old.release,
                rule=new.rule.value,
                old_rule=old.rule.value,
                rule_evidence=new.rule_evidence,
                default_image=new.default_image,
                old_default_image=old.default_image,
                vulkan_capable=sorted(new.capable),
                old_vulkan_capable=sorted(old.capable),
                effect="every slot is judged again",
            )
        fresh = set(read.problems) - self._reported
        for problem in read.problems:
            if problem in fresh:
                level = _log.error if problem.not_understood else _log.warning
                level(
                    "hal0.facts_note",
                    source=problem.source,
                    path=problem.path,
                    reason=problem.why,
                )
        self._reported = frozenset(read.problems)
        return new
