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
from hal0_reconciler.cli import parser as cli_parser
from hal0_reconciler.cli import plan as cli_plan
from helpers.hosts import REPO
from integration.test_cli import host_args

VERBS = list(cli_parser.VERBS)


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
    assert "plan" == cli_parser.verb_of(["plan", "--json"])
    assert "aiter" == cli_parser.verb_of(["aiter", "plan"])
    for argv in ([], ["--help"], ["--version"], ["pln"], ["-h", "plan"], ["--json", "plan"]):
        assert cli_parser.verb_of(argv) is None, argv
    only = cli_mod.build_parser(only="status")
    assert ["status"] == list(_sub(only, "status").prog.split()[1:])
    choices = next(a for a in only._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert ["status"] == list(choices)


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` with this checkout's src and nothing else on its paths."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=50,
        check=False,
    )


def _loaded_by(argv: list[str]) -> tuple[int, set[str]]:
    """In a fresh interpreter, as the command runs: its exit code and what it imported."""
    code = (
        "import sys, json\n"
        "from hal0_reconciler import _entry\n"
        "sys.argv[1:] = json.loads(sys.argv[1])\n"
        "try:\n"
        "    code = _entry.main()\n"
        "finally:\n"
        "    print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = _python(code, json.dumps(argv))
    return done.returncode, set(json.loads(done.stderr.strip().splitlines()[-1]))


def test_plan_loads_neither_the_aiter_engine_nor_the_daemon(
    host_dirs: dict[str, Path],
) -> None:
    """In a fresh interpreter, as the command runs: what `plan` imported."""
    code, loaded = _loaded_by(["plan", *host_args(host_dirs)])
    assert 0 == code
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
        "shutil",  # argparse's terminal width: only for help and usage (cli.parser._Parser._checking)
        "hal0_reconciler.host.identity",  # whom the probe runs as: only on an AMD host
    }
    assert set() == unwanted & loaded


@pytest.mark.parametrize("fmt", ["json", "journal", "console"])
def test_structlog_loads_rich_only_for_a_person_at_a_terminal(fmt: str) -> None:
    """rich (when installed) is the larger half of structlog's import, and only the console
    renderer on a terminal uses it (console lines into a pipe are plain); after the first
    event rich can still be imported normally. (stderr is a pipe here: never loaded.)"""
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
    done = _python(code, fmt)
    assert 0 == done.returncode, done.stderr
    assert "False" == done.stdout.strip()


# What `plan` needs only when there is a slot file to judge (or an AMD host, where the engine
# also logs what it finds wrong with hal0's sources and the profiles).
ENGINE = {
    "hal0_reconciler.reconcile",
    "hal0_reconciler.passview",
    "hal0_reconciler.state",
    "hal0_reconciler.slots.seen",
    "hal0_reconciler.slots.document",
    "hal0_reconciler.slots.policy",
}


@pytest.mark.parametrize("world", ["empty", "one slot", "amd"])
def test_plan_loads_the_engine_only_with_something_to_judge(
    host_dirs: dict[str, Path], world: str
) -> None:
    """`plan` on an empty folder of a host that is not AMD shows hal0's facts and an empty
    table without loading the reconcile engine; a slot file, or an AMD host, loads it."""
    argv = ["plan", *host_args(host_dirs)]
    if world == "one slot":
        (host_dirs["slots_dir"] / "a.toml").write_text('name = "a"\ndevice = "cpu"\n')
    elif world == "amd":
        argv += ["--assume-amd", "--assume-rocm=usable"]
    code, loaded = _loaded_by(argv)
    assert 0 == code
    assert (set() if world == "empty" else ENGINE) == ENGINE & loaded


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_plan_without_the_engine_says_what_the_engine_would(
    host_dirs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    """On an empty folder, the plan printed without a pass is the one printed from the engine's
    pass over the same folder, hal0's fact fallbacks included."""
    from hal0_reconciler import reconcile, settings
    from hal0_reconciler.host.hal0 import reader as hal0
    from hal0_reconciler.model import HostFacts, LaneState

    (host_dirs["hal0_release_dir"] / "VERSION").unlink()  # a fact fallback to show
    current = settings.load(None, {k: str(v) for k, v in host_dirs.items()})
    args = argparse.Namespace(json=as_json, assume_amd=None, assume_rocm=None)
    facts = HostFacts(amd=False, lane=LaneState.UNUSABLE)
    reconciler = reconcile.Reconciler(current)
    report = reconciler.reconcile(facts, apply=False)
    assert () == report.outcomes
    assert reconciler.hal0_facts is not None
    read = hal0.Hal0Read(reconciler.hal0_facts, reconciler.hal0_problems)
    assert read.problems
    assert 0 == cli_plan._plan_print(args, facts, read, report)
    engine = capsys.readouterr().out
    assert 0 == cli_plan.plan(current, args)  # no slot file, not an AMD host: no pass
    assert engine == capsys.readouterr().out
    if as_json:  # and what that is: no slot, nothing pending
        doc = json.loads(engine)
        assert ([], 0, 0, 0) == (doc["slots"], doc["pending"], doc["unjudged"], doc["exit_code"])
    else:
        assert "no changes" == engine.splitlines()[-1]


@pytest.mark.parametrize("verb", ["status", "reload"])
def test_status_and_reload_load_no_host_or_hal0_reader(
    host_dirs: dict[str, Path], verb: str
) -> None:
    """`status` and `reload` (no daemon here: exit 3) read the daemon's status file only: the
    host facts, hal0's facts and the slot store stay unloaded."""
    code, loaded = _loaded_by([verb, "--runtime-dir", str(host_dirs["runtime_dir"])])
    assert 3 == code
    host = {
        "hal0_reconciler.host.facts",
        "hal0_reconciler.host.hal0",
        "hal0_reconciler.slots.store",
        "hal0_reconciler.reconcile",
    }
    assert set() == host & loaded


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
    done = _python(code)
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
        "from hal0_reconciler.cli import plan\n"
        "def seen(*args, **kwargs):\n"
        "    print(gc.isenabled())\n"
        "    return 0\n"
        "runner.run = seen\n"
        "plan.plan = seen\n"
        "from hal0_reconciler import _entry\n"
        "sys.argv[1:] = json.loads(sys.argv[1])\n"
        "sys.exit(_entry.main())\n"
    )
    argv = [verb, *host_args(host_dirs)]
    done = _python(code, json.dumps(argv))
    assert 0 == done.returncode, done.stderr
    assert str(verb != "run") == done.stdout.strip()
