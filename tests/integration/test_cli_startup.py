"""What a command loads: only its own verb's parser and the code it runs (start-up cost), with
the same help, usage and errors as the whole command line gives."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from hal0_reconciler import cli as cli_mod
from helpers.hosts import REPO
from integration.test_cli import host_args

VERBS = list(cli_mod._VERBS)


def _sub(parser: argparse.ArgumentParser, verb: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices[verb]
    return sub


def _outcome(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code: object = vars(parser.parse_args(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("verb", VERBS)
def test_a_verb_alone_parses_and_helps_as_in_the_whole_command_line(verb: str) -> None:
    only, whole = cli_mod.build_parser(only=verb), cli_mod.build_parser()
    assert [verb] == list(_sub(only, verb).prog.split()[1:2])
    assert _sub(whole, verb).format_help() == _sub(only, verb).format_help()
    tails = [["--help"], ["--no-such-option"], ["--log-level", "loud"], ["--set"]]
    if verb == "aiter":
        tails += [["plan", "--help"], ["plan", "--json"], ["nope"]]
    elif verb == "plan":
        tails += [["--assume-amd", "--assume-not-amd"], ["--json", "--assume-rocm=usable"]]
    for tail in tails:
        argv = [verb, *tail]
        assert _outcome(whole, argv) == _outcome(only, argv), argv


def test_only_a_leading_verb_builds_one_parser() -> None:
    """A top-level option or a mistyped verb gets the whole parser: its help lists every verb
    and its error names the valid choices."""
    assert "plan" == cli_mod._verb_of(["plan", "--json"])
    assert "aiter" == cli_mod._verb_of(["aiter", "plan"])
    for argv in ([], ["--help"], ["--version"], ["pln"], ["-h", "plan"], ["--json", "plan"]):
        assert cli_mod._verb_of(argv) is None, argv
    only = cli_mod.build_parser(only="status")
    assert ["status"] == list(_sub(only, "status").prog.split()[1:])
    choices = next(a for a in only._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert ["status"] == list(choices)


def test_plan_loads_neither_the_aiter_engine_nor_the_daemon(
    host_dirs: dict[str, Path],
) -> None:
    """In a fresh interpreter, as the command runs: what `plan` imported."""
    code = (
        "import sys, json\n"
        "from hal0_reconciler import _entry\n"
        "sys.argv[1:] = json.loads(sys.argv[1])\n"
        "try:\n"
        "    _entry.main()\n"
        "finally:\n"
        "    print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    argv = ["plan", *host_args(host_dirs)]
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argv)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=50,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    unwanted = {
        "hal0_reconciler.aiter.monitor",
        "hal0_reconciler.daemon.runner",
        "hal0_reconciler.slots.edit",
        "hal0_reconciler.slots._tomlscan",
        "structlog",
        "urllib.request",
        "hashlib",
        "difflib",
        "subprocess",
    }
    assert set() == unwanted & loaded


@pytest.mark.parametrize("fmt", ["json", "journal", "console"])
def test_structlog_loads_rich_only_for_a_person_at_a_terminal(fmt: str) -> None:
    """rich (when installed) is the larger half of structlog's import, and only the console
    renderer uses it; after the first event rich can still be imported normally."""
    if importlib.util.find_spec("rich") is None:
        pytest.skip("rich is not installed here")
    code = (
        "import sys\n"
        "from hal0_reconciler import _log, settings\n"
        "_log.configure(settings.LogFormat(sys.argv[1]), 'info')\n"
        "_log.get_logger('t').info('first')\n"
        "loaded = 'rich' in sys.modules\n"
        "import rich.text\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, fmt],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=50,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    assert (fmt == "console") == (done.stdout.strip() == "True")


def test_structlog_loads_without_asyncio_until_something_asks_for_it() -> None:
    """structlog imports asyncio (and ssl) only for its ``async`` log methods: the first event
    does not load it; an import of asyncio afterwards is the real module, and structlog's own
    ``async`` methods still work (their ``asyncio`` loads it at first use)."""
    code = (
        "import sys\n"
        "from hal0_reconciler import _log, settings\n"
        "_log.configure(settings.LogFormat.JSON, 'info')\n"
        "_log.get_logger('t').info('first')\n"
        "print('asyncio' in sys.modules, 'ssl' in sys.modules, flush=True)\n"
        "import structlog.stdlib\n"
        "structlog.stdlib.asyncio.get_running_loop\n"
        "import asyncio\n"
        "assert type(sys.modules['asyncio']).__name__ == 'module'\n"
        "assert asyncio.run is sys.modules['asyncio'].run\n"
        "asyncio.run(structlog.get_logger('t').ainfo('awaited'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=50,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    assert "False False" == done.stdout.strip()
    events = [json.loads(line)["event"] for line in done.stderr.splitlines()]
    assert ["first", "awaited"] == events


@pytest.mark.parametrize("verb", ["run", "plan"])
def test_the_daemon_loads_itself_without_the_collector(
    host_dirs: dict[str, Path], verb: str
) -> None:
    """`run` turns the cyclic garbage collector off at the entry point (the daemon turns it on
    again after READY); the other verbs keep it."""
    code = (
        "import gc, sys, json\n"
        "from hal0_reconciler.daemon import runner\n"
        "from hal0_reconciler import cli\n"
        "def seen(*args, **kwargs):\n"
        "    print(gc.isenabled())\n"
        "    return 0\n"
        "runner.run = seen\n"
        "cli._plan = seen\n"
        "from hal0_reconciler import _entry\n"
        "sys.argv[1:] = json.loads(sys.argv[1])\n"
        "sys.exit(_entry.main())\n"
    )
    argv = [verb, *host_args(host_dirs)]
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argv)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=50,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    assert str(verb != "run") == done.stdout.strip()
