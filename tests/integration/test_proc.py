"""proc.run is the one way the package starts a program: bounded, reaped, one human line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from hal0_reconciler import errors
from hal0_reconciler.host import proc
from helpers import devnodes

pytestmark = pytest.mark.timeout(30)


def test_output_and_exit_status_are_captured():
    """stdout, stderr and the exit status come back as they were written."""
    result = proc.run(["sh", "-c", "printf out; printf err >&2"], timeout=10)

    assert (("sh", "-c", "printf out; printf err >&2"), 0, b"out", b"err", None) == (
        result.argv,
        result.returncode,
        result.stdout,
        result.stderr,
        result.failure_line,
    )


def test_input_is_fed_to_stdin_and_stdin_is_empty_without_it():
    """Given input reaches the child's stdin; without it the child reads end-of-file at once."""
    assert b"hello" == proc.run(["cat"], timeout=10, input=b"hello").stdout
    assert b"" == proc.run(["cat"], timeout=10).stdout


def test_env_replaces_the_environment():
    """A given environment is the child's whole environment."""
    result = proc.run(["/usr/bin/env"], timeout=10, env={"ONLY": "this"})

    assert b"ONLY=this\n" == result.stdout


def test_non_zero_exit_is_a_result_with_a_human_failure_line():
    """A program that fails is not an exception: the result says how, quoting stderr's last line."""
    result = proc.run(
        ["sh", "-c", "echo first >&2; echo unit x not loaded >&2; exit 3"], timeout=10
    )

    assert 3 == result.returncode
    assert (
        "sh -c 'echo first >&2; echo unit x not loaded >…': exited with status 3: unit x not loaded"
        == (result.failure_line)
    )


def test_a_child_killed_by_a_signal_says_which():
    """A child that dies of a signal is described by the signal's name."""
    result = proc.run(["sh", "-c", "kill -TERM $$"], timeout=10)

    assert (-15, "sh -c 'kill -TERM $$': killed by SIGTERM") == (
        result.returncode,
        result.describe(),
    )


def test_a_missing_program_raises_one_human_line():
    """A program that does not exist raises ProcFailed saying 'not found'."""
    with pytest.raises(errors.ProcFailed) as caught:
        proc.run(["/nonexistent/systemctl", "is-active", "x"], timeout=10)

    assert "systemctl is-active x: not found" == str(caught.value)


def test_a_program_that_cannot_be_executed_raises_permission_denied(tmp_path):
    """A file without execute permission raises ProcFailed saying 'permission denied'."""
    program = tmp_path / "tool"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o644)
    if os.geteuid() == 0:
        program.chmod(0o600)  # root may execute anything with one x bit; none here

    with pytest.raises(errors.ProcFailed) as caught:
        proc.run([str(program), "--flag"], timeout=10)

    assert "tool --flag: permission denied" == str(caught.value)


def test_a_timed_out_child_and_its_group_are_killed_and_reaped(tmp_path):
    """On timeout the child and its background grandchild are killed, reaped, and one line raised."""
    pidfile = tmp_path / "grandchild.pid"
    started = time.monotonic()

    with pytest.raises(errors.ProcFailed) as caught:
        proc.run(["sh", "-c", 'sleep 60 & echo $! > "$0"; wait', str(pidfile)], timeout=0.5)

    assert time.monotonic() - started < 10  # not the grandchild's 60 s: generous under load
    assert ("sh -c 'sleep 60 & echo $! > \"$0\"; wait'", "timed out after 0.5s") == (
        str(caught.value)[:39],
        str(caught.value).rsplit(": ", 1)[1],
    )
    assert [] == psutil.Process().children(recursive=True)
    assert True is devnodes.dies_within(int(pidfile.read_text()), 10.0)


def test_a_timed_out_child_that_ignores_sigterm_is_still_killed():
    """The kill on timeout cannot be ignored by the child."""
    with pytest.raises(errors.ProcFailed, match=r"timed out after 0\.3s"):
        proc.run(["sh", "-c", "trap '' TERM INT HUP; sleep 60"], timeout=0.3)

    assert [] == psutil.Process().children(recursive=True)


def test_runs_leak_no_file_descriptors():
    """Finished, failed and timed-out runs all leave the caller's descriptor table as it was."""
    before = {p.name for p in Path("/proc/self/fd").iterdir()}

    proc.run(["true"], timeout=10)
    proc.run(["false"], timeout=10)
    with pytest.raises(errors.ProcFailed):
        proc.run(["sleep", "60"], timeout=0.2)
    with pytest.raises(errors.ProcFailed):
        proc.run(["/nonexistent"], timeout=1)

    assert before == {p.name for p in Path("/proc/self/fd").iterdir()}


def test_long_arguments_are_cut_in_human_lines():
    """Inline code or JSON arguments are shortened to their first line and 40 characters."""
    code = "import os\nprint(os.getpid())"
    blob = "x" * 100

    assert f"python3 -c 'import os…' '{'x' * 40}…'" == proc.display(
        ["/usr/bin/python3", "-c", code, blob]
    )
