"""Every event the daemon can log reads plainly in the journal's text output (and the console):
lists as ``a, b``, one level of quoting, backslashes as they are, paths whole; the JSON log
format keeps lists. The event names are taken from the source itself, every one of them."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hal0_reconciler import _log, console
from hal0_reconciler.host import probe
from hal0_reconciler.model import Credentials, HostFacts, LaneState
from helpers.hosts import REPO

SRC = REPO / "src/hal0_reconciler"
_LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
_EVENT = re.compile(r"^[a-z0-9]+\.[a-z0-9_]+$")


def _log_calls() -> list[tuple[str, str, ast.Call]]:
    """(where, event, call) for every ``<logger>.<level>("area.event", ...)`` in the source."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in _LEVELS or not node.args:
                continue
            first = node.args[0]
            event = first.value if isinstance(first, ast.Constant) else None
            if isinstance(event, str) and "." in event and " " not in event:
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", event, node))
    return found


CALLS = _log_calls()
TRICKY = "/etc/hal0 dir/x.toml: not valid TOML: Illegal character '\\n' (at \"line\" 2)"


def _sample(value: ast.expr) -> object:
    """A hard value of the kind the call passes: a list of texts for a list, a text holding a
    space, both quotes and a backslash for anything else that is text, a number for ``len``."""
    if isinstance(value, ast.List | ast.ListComp | ast.Tuple) or (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in {"list", "sorted", "tuple"}
    ):
        return ["/etc/hal0/slots/a b.toml", "gpu-rocm"]
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id
        in {
            "len",
            "round",
            "int",
        }
    ):
        return 3
    return TRICKY


def test_every_event_is_found_and_named_area_dot_event() -> None:
    assert len(CALLS) > 100, "the scan of the source lost its events"
    assert [] == [(w, e) for w, e, _ in CALLS if not _EVENT.match(e)]


@pytest.mark.parametrize(("where", "event", "call"), CALLS, ids=[c[0] for c in CALLS])
def test_each_event_reads_plainly_in_the_journal_text(
    where: str, event: str, call: ast.Call
) -> None:
    """With the hardest values of their kinds, each of the event's fields is one ``key=value``:
    no JSON list, no quote inside a quote's escape, no doubled backslash, the path whole."""
    fields: dict[str, object] = {"event": event, "level": "warning"}
    for kw in call.keywords:
        if kw.arg is not None:  # **fields: the slot's name and path (reconcile.reports)
            fields[kw.arg] = _sample(kw.value)
    line = _log.journal_line("warning", fields)
    assert line.startswith(f"<4>{event}"), where
    assert "\\\\" not in line, (where, line)  # one backslash stays one
    assert '[\\"' not in line, (where, line)  # no JSON list inside a string
    assert '["' not in line, (where, line)
    assert "\n" not in line
    for kw in call.keywords:
        if kw.arg is None:
            continue
        shown = _log._value(fields[kw.arg])
        assert f" {kw.arg}={shown}" in line, (where, kw.arg)
        if isinstance(fields[kw.arg], list):
            assert shown == '"/etc/hal0/slots/a b.toml, gpu-rocm"', (where, shown)
        elif fields[kw.arg] == TRICKY:
            assert shown == '"' + TRICKY.replace('"', '\\"') + '"', (where, shown)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (["demote_grace"], "demote_grace"),
        (["demote_grace", "aiter.heal"], '"demote_grace, aiter.heal"'),
        ([], "none"),
        (("a",), "a"),
        (["x, y", "z"], '"x, y; z"'),
        ({"slot": "agent", "n": 2}, '"slot: agent, n: 2"'),
        ("/var/lib/prometheus/node-exporter/hal0_reconciler.prom", None),
        ("not valid TOML: Illegal character '\\n'", "\"not valid TOML: Illegal character '\\n'\""),
        ('say "hi"', "'say \"hi\"'"),
        ('it\'s "x"', '"it\'s \\"x\\""'),
        (True, "true"),
        (2.5, "2.5"),
        ("two\nlines\x1b", '"two\\nlines\\x1b"'),
    ],
)
def test_a_value_is_shown_once_quoted_at_most(value: object, shown: str | None) -> None:
    expected = value if shown is None else shown
    assert expected == _log._value(value)


def test_the_console_log_shows_lists_as_text_and_json_keeps_them(tmp_path: Path) -> None:
    """The console renderer (a person at a terminal or a pipe) writes ``changed='a, b'``; the JSON
    format keeps the list (pipelines)."""
    code = """
import sys
from hal0_reconciler import _log
from hal0_reconciler.settings import LogFormat
_log.configure(LogFormat(sys.argv[1]), "info")
_log.get_logger("t").info("daemon.reloaded", changed=["demote_grace", "aiter.heal"], none=[])
"""
    shown = {}
    for fmt in ("console", "json"):
        done = subprocess.run(
            [sys.executable, "-c", code, fmt],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        shown[fmt] = done.stderr
    assert re.search(r"changed=(['\"]?)demote_grace, aiter\.heal\1", shown["console"]), shown

    assert "none=none" in shown["console"]
    assert "['" not in shown["console"]
    event = json.loads(shown["json"].strip().splitlines()[-1])
    assert (["demote_grace", "aiter.heal"], []) == (event["changed"], event["none"])


def test_plain_text_sorts_sets_and_names_nothing() -> None:
    assert "a, b" == console.plain({"b", "a"})
    assert "none" == console.plain(None)
    assert "none" == console.plain({})


def test_a_usable_probe_names_the_kfd_node_and_the_render_node(tmp_path: Path) -> None:
    """``probe`` and the journal say which two nodes opened, kfd's path too."""
    who = Credentials(user="hal0", uid=999, gid=999, groups=())
    kfd = str(tmp_path / "dev/kfd")
    render = str(tmp_path / "dev/dri/renderD128")
    result = probe.verdict(
        credentials=who, kfd=(kfd, True, None, "", True), renders=[(render, True, None, "", True)]
    )
    assert f"{kfd} and {render} open read-write as the service user" == result.reason


def test_a_lane_within_its_grace_is_named_unusable_wherever_it_is_shown() -> None:
    """No fifth lane name: the reason of a lane within its demotion grace (no probe result to
    quote) is ``unusable``."""
    assert "unusable" == HostFacts(amd=True, lane=LaneState.UNSETTLED).lane_reason


@pytest.mark.parametrize(
    ("old", "new", "left", "said"),
    [
        (LaneState.USABLE, LaneState.UNSETTLED, 60.0, ("host.rocm_lane_changed", "info", "60s")),
        (LaneState.USABLE, LaneState.UNUSABLE, None, ("host.rocm_lane_changed", "warning", "0s")),
        (
            LaneState.UNSETTLED,
            LaneState.UNUSABLE,
            None,
            ("host.rocm_lane_demoting", "warning", None),
        ),
        (LaneState.UNSETTLED, LaneState.USABLE, None, ("host.rocm_lane_changed", "info", None)),
        (LaneState.USABLE, LaneState.UNKNOWN, None, ("host.rocm_lane_changed", "warning", None)),
    ],
)
def test_a_lane_change_is_logged_with_the_four_names(
    old: LaneState, new: LaneState, left: float | None, said: tuple[str, str, str | None]
) -> None:
    """``demotion_in`` whenever the lane is unusable now (``0s`` with no grace); the grace's
    end is its own event; never ``unsettled``."""
    from structlog.testing import capture_logs

    from hal0_reconciler.daemon import lanelog

    with capture_logs() as logs:
        lanelog.log_lane_change(old, new, reason="why", left=left)
    assert [said] == [(e["event"], e["log_level"], e.get("demotion_in")) for e in logs]
    assert "unsettled" not in str(logs)
