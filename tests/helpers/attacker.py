"""The unprivileged attacker of ``tests/security`` and the run's tally of attacks."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

TRIED: Counter[str] = Counter()
HELD: Counter[str] = Counter()


@dataclass(frozen=True)
class Attacker:
    """An unprivileged user of this machine: name, uid, primary gid."""

    name: str
    uid: int
    gid: int

    def chown(self, *paths: os.PathLike[str] | str) -> None:
        """Give each path (not following a link) to the attacker."""
        for path in paths:
            os.chown(path, self.uid, self.gid, follow_symlinks=False)


class Tally:
    """Counts attacks by kind: ``tally.tried(kind)`` then ``tally.held(kind)`` once it held."""

    def tried(self, kind: str, count: int = 1) -> None:
        TRIED[kind] += count

    def held(self, kind: str, count: int = 1) -> None:
        HELD[kind] += count
