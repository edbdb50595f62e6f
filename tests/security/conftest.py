"""Fixtures of ``tests/security``: the attacker and the tally of attacks.

Every test here plays an unprivileged local user (made with ``useradd`` as the suite runs as
root) against the root daemon and its one-shot verbs. Each attack is counted through the
``attacks`` fixture; the figures (tried, held, per kind) are printed at the end of the run,
like the reliability suite's.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator

import pytest

from helpers import attacker as attacker_mod
from helpers import devnodes


@pytest.fixture
def attacker() -> Iterator[attacker_mod.Attacker]:
    """A real unprivileged user for the length of one test."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the attacker is a user this test makes")
    with devnodes.system_user() as name:
        entry = pwd.getpwnam(name)
        yield attacker_mod.Attacker(name, entry.pw_uid, entry.pw_gid)


@pytest.fixture
def attacks() -> attacker_mod.Tally:
    """The run's tally of attacks tried and held."""
    return attacker_mod.Tally()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    tried, held = attacker_mod.TRIED, attacker_mod.HELD
    if not tried:
        return
    terminalreporter.section("security: attacks tried / held")
    for kind in sorted(tried):
        terminalreporter.write_line(f"{kind}: {held[kind]} held of {tried[kind]} tried")
    terminalreporter.write_line(f"all: {sum(held.values())} held of {sum(tried.values())} tried")
