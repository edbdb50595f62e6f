"""The package's only subprocess call: run an argv with a hard timeout, give one human line.

Every child starts in its own session (so its own process group). On timeout, or when the
caller is interrupted, the whole group is killed with SIGKILL and the child is reaped: no
zombie and no orphaned grandchild holding a pipe open. A non-zero exit is not an exception;
the caller decides what it means and can use ``ProcResult.failure_line`` to say so.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from hal0_reconciler import errors

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

_ARG_SHOWN = 40  # longer arguments (inline code, JSON) are cut in human lines


@dataclass(frozen=True)
class ProcResult:
    """What a finished child left behind."""

    argv: tuple[str, ...]
    returncode: int  # negative: killed by that signal
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def failure_line(self) -> str | None:
        """One human line when the child failed (non-zero exit), else None."""
        if self.ok:
            return None
        return self.describe()

    def describe(self) -> str:
        """One human line: the command, how it ended, and the last line it wrote to stderr."""
        line = f"{display(self.argv)}: {_ending(self.returncode)}"
        last = _last_line(self.stderr)
        return f"{line}: {last}" if last else line


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    input: bytes | None = None,  # noqa: A002 - the name subprocess.run uses for the same thing
    env: Mapping[str, str] | None = None,
) -> ProcResult:
    """Run ``argv`` to completion within ``timeout`` seconds and capture its output.

    Raises ProcFailed (one human line) when the program cannot be started or does not finish
    in time; a timed-out child and its process group are killed and reaped first.
    """
    args = tuple(argv)
    if not args:
        raise ValueError("proc.run needs a non-empty argv")
    try:
        child = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            close_fds=True,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise errors.ProcFailed(f"{display(args)}: not found") from None
    except PermissionError:
        raise errors.ProcFailed(f"{display(args)}: permission denied") from None
    except OSError as exc:
        raise errors.ProcFailed(f"{display(args)}: cannot start: {exc.strerror}") from None
    with child:
        try:
            stdout, stderr = child.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            raise errors.ProcFailed(f"{display(args)}: timed out after {float(timeout)}s") from None
        except BaseException:
            _kill_group(child)
            raise
    return ProcResult(args, child.returncode, stdout, stderr)


def display(argv: Sequence[str]) -> str:
    """The command as a human reads it: program base name, long arguments cut short."""
    if not argv:
        return "<empty command>"
    shown = [PurePath(argv[0]).name or argv[0]]
    for arg in argv[1:]:
        first = arg.strip().split("\n", 1)[0]
        cut = len(first) > _ARG_SHOWN or first != arg
        shown.append(first[:_ARG_SHOWN] + "…" if cut else arg)
    return shlex.join(shown)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (it leads it), then reap the child."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()
    child.wait()


def _ending(returncode: int) -> str:
    if returncode == 0:
        return "exited 0"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


def _last_line(data: bytes) -> str:
    lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class Server:
    """A long-lived child that answers over an inherited socket (``spawn``); ``close`` kills its
    process group and reaps it, so a stuck or dead child never outlives its user."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child
        self.pid = child.pid

    def alive(self) -> bool:
        return self._child.poll() is None

    def close(self) -> None:
        if self._child.returncode is None:
            _kill_group(self._child)


def spawn(argv: Sequence[str], *, pass_fds: Sequence[int], env: Mapping[str, str]) -> Server:
    """Start ``argv`` in its own session with only ``pass_fds`` inherited (stdio: /dev/null).

    Raises ProcFailed (one human line) when it cannot be started."""
    args = tuple(argv)
    try:
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            close_fds=True,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            cwd="/",
        )
    except OSError as exc:
        raise errors.ProcFailed(f"{display(args)}: cannot start: {exc.strerror}") from None
    return Server(child)
