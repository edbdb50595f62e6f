"""The operator's surface of the command line: exit codes for slot files that cannot be judged,
JSON everywhere, messages for people, colour only on a terminal, help that teaches."""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hal0_reconciler import cli as cli_mod
from hal0_reconciler.cli import exits
from hal0_reconciler.daemon import status
from helpers.hosts import REPO
from integration.test_cli import cli, host_args, make_usable_lane

pytestmark = pytest.mark.timeout(60)

ESC = "\x1b["


def cli_on_a_terminal(
    *args: str, env: dict[str, str] | None = None, tty: str = "stdout"
) -> tuple[int, str, str]:
    """Run the command line with stdout (or stderr) on a pseudo-terminal; (code, tty, other)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TERM": "xterm", **(env or {})}
    for name in ("JOURNAL_STREAM", "NOTIFY_SOCKET", "NO_COLOR"):
        if name not in (env or {}):
            environment.pop(name, None)
    master, slave = pty.openpty()
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, tty: slave}
    with subprocess.Popen(
        [sys.executable, "-m", "hal0_reconciler", *args],
        stdin=subprocess.DEVNULL,
        env=environment,
        **streams,
    ) as child:
        os.close(slave)
        chunks: list[bytes] = []
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if child.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        other_pipe = child.stderr if tty == "stdout" else child.stdout
        assert other_pipe is not None
        other = other_pipe.read().decode()
        code = child.wait(timeout=10)
    os.close(master)
    return code, b"".join(chunks).decode().replace("\r\n", "\n"), other


def add_unjudgeable_slots(slots: Path) -> set[str]:
    """Four slot files no pass can judge: not TOML, not UTF-8, a FIFO, a dangling symlink."""
    (slots / "broken.toml").write_text('name = "broken"\ndevice = \n')
    (slots / "latin.toml").write_bytes(b'name = "caf\xe9"\ndevice = "gpu-vulkan"\n')
    os.mkfifo(slots / "fifo.toml")
    (slots / "dangling.toml").symlink_to("/nonexistent/slot.toml")
    return {"broken.toml", "latin.toml", "fifo.toml", "dangling.toml"}


# -- 3. slot files that could not be judged ---------------------------------------------------------


def test_plan_exits_3_when_a_slot_file_cannot_be_judged(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """Unjudged files win over "changes pending" (2): the table lists each with its reason."""
    bad = add_unjudgeable_slots(seeded_slots)
    result = cli("plan", *host_args(host_dirs), "--assume-amd", "--assume-rocm=usable")
    assert cli_mod.EXIT_UNJUDGED == result.returncode == 3, result.stderr
    listed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("- ")}
    assert bad == listed
    assert "6 change(s) pending" in result.stdout
    assert "4 slot file(s) could not be judged" in result.stdout
    doc = json.loads(
        cli("plan", *host_args(host_dirs), "--assume-amd", "--assume-rocm=usable", "--json").stdout
    )
    assert (4, 6, 3) == (doc["unjudged"], doc["pending"], doc["exit_code"])


def test_once_exits_3_and_says_which_files_it_could_not_judge(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """`once` no longer hides unreadable slot files behind exit 0; a pipe gets no summary."""
    bad = add_unjudgeable_slots(seeded_slots)
    result = cli("once", *host_args(host_dirs))
    assert (3, "") == (result.returncode, result.stdout), result.stderr
    code, shown, _ = cli_on_a_terminal("once", *host_args(host_dirs), env={"NO_COLOR": "1"})
    assert 3 == code
    problems = {line.split()[1].rstrip(":") for line in shown.splitlines() if "problem " in line}
    assert bad == problems, shown
    assert shown.rstrip().endswith("0 relabelled, 13 kept, 4 problem(s)"), shown


def test_a_slot_whose_runtime_cannot_be_resolved_is_not_judged(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """An unreadable profiles file leaves profiled slots unresolved: skipped, and exit 3."""
    host_dirs["profiles_file"].write_text("this is [not toml\n")
    result = cli("plan", *host_args(host_dirs), "--assume-amd", "--assume-rocm=usable", "--json")
    doc = json.loads(result.stdout)
    skipped = [s["slot"] for s in doc["slots"] if s["action"] == "skip"]
    assert (3, True) == (result.returncode, "agent" in skipped), result.stdout
    assert len(skipped) == doc["unjudged"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the credential-dropping probe need root")
def test_once_on_a_terminal_summarises_relabels(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """On a terminal `once` prints what it did: each relabel, then the counts."""
    make_usable_lane(host_dirs)
    code, shown, _ = cli_on_a_terminal("once", *host_args(host_dirs), "--no-restart", "--no-color")
    assert 0 == code, shown
    assert "relabelled agent (agent.toml): gpu-vulkan -> gpu-rocm" in shown
    assert shown.rstrip().endswith("6 relabelled, 7 kept, 0 problem(s)")


# -- 4. machine-readable everywhere ---------------------------------------------------------------


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_plan_json_has_a_schema_and_null_for_nothing(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """`schema` versions the document; a kept slot's `new` is null, never "" or "-" (nor an
    unreadable file's slot name, runtime and device)."""
    add_unjudgeable_slots(seeded_slots)
    result = cli("plan", *host_args(host_dirs), "--assume-amd", "--assume-rocm=usable", "--json")
    doc = json.loads(result.stdout)
    assert cli_mod.JSON_SCHEMA == doc["schema"] == 3
    kept = next(s for s in doc["slots"] if s["slot"] == "img")
    assert ("keep", None) == (kept["action"], kept["new"])
    assert [] == [s for s in _strings(doc) if s in {"", "-"}]


def test_once_json(seeded_slots: Path, host_dirs: dict[str, Path]) -> None:
    """`once --json`: the counts, every slot's outcome and the exit code, as data."""
    add_unjudgeable_slots(seeded_slots)
    result = cli("once", *host_args(host_dirs), "--json")
    doc = json.loads(result.stdout)
    assert (3, 3, 3) == (doc["schema"], doc["exit_code"], result.returncode)
    assert (0, 13, 4) == (doc["relabelled"], doc["kept"], doc["problems"])
    assert {"amd": False, "rocm_lane": "not-amd", "reason": "not an AMD host"} == doc["host"]
    broken = next(s for s in doc["slots"] if s["path"].endswith("broken.toml"))
    assert ("unreadable", None) == (broken["status"], broken["slot"])
    assert [] == [s for s in _strings(doc) if s == ""]


def test_probe_json_on_a_non_amd_host(host_dirs: dict[str, Path]) -> None:
    """`probe --json`: the same verdict as the text (the lane state's one name, "not-amd"),
    with null where nothing was probed."""
    result = cli("probe", *host_args(host_dirs), "--json")
    doc = json.loads(result.stdout)
    assert 1 == result.returncode
    assert {"schema": 3, "amd": False, "rocm_lane": "not-amd", "service_user": None} == {
        k: doc[k] for k in ("schema", "amd", "rocm_lane", "service_user")
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the credential-dropping probe need root")
def test_probe_json_names_the_failing_node(host_dirs: dict[str, Path]) -> None:
    """The failing node, its kind and errno, as data."""
    make_usable_lane(host_dirs)
    os.chmod(host_dirs["kfd_path"], 0o600)
    doc = json.loads(cli("probe", *host_args(host_dirs), "--json").stdout)
    assert ("unusable", 54321) == (doc["rocm_lane"], doc["service_user"]["uid"])
    kfd = [f for f in doc["failures"] if f["path"] == str(host_dirs["kfd_path"])]
    assert [("permission", 13)] == [(f["kind"], f["errno"]) for f in kfd]


def test_status_json_when_not_running(tmp_path: Path) -> None:
    """What monitoring reads: the judged state, and null when there is no daemon snapshot."""
    result = cli("status", "--runtime-dir", str(tmp_path), "--json")
    doc = json.loads(result.stdout)
    assert (3, "not-running", None, 3) == (
        result.returncode,
        doc["state"],
        doc["daemon"],
        doc["schema"],
    )


def test_status_json_of_a_live_daemon_turns_empty_text_into_null(tmp_path: Path) -> None:
    """A live writer's snapshot, judged; "" in it is null."""
    s = cli_mod.settings.load(None, {"runtime_dir": str(tmp_path)})
    snapshot = {
        "pid": os.getpid(),
        "pid_start": status.process_start_time(os.getpid()),
        "updated_at": time.time(),
        "heartbeat": 30.0,
        "healthy": True,
        "health": "healthy",
        "ready": True,
        "lane": {"amd": True, "state": "usable", "reason": ""},
    }
    status.write_status(s, snapshot)
    result = cli("status", "--runtime-dir", str(tmp_path), "--json")
    doc = json.loads(result.stdout)
    assert (0, "running") == (result.returncode, doc["state"])
    assert doc["daemon"]["lane"]["reason"] is None


# -- 5. messages for people -------------------------------------------------------------------------

VERBS = [["once"], ["plan"], ["probe"], ["run"], ["status"], ["aiter", "plan"]]


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--set", "resync_interval=0"], "'resync_interval' = 0 is out of range"),
        (["--set", "resync_interval=soon"], "'resync_interval' has a bad value 'soon'"),
        (["--set", "log_format=xml"], "valid values are auto, console, json, journal"),
        (["--set", "slot_dir=/x"], "did you mean 'slots_dir'?"),
        (["--set", "aiter.heal=maybe"], "'aiter.heal' has a bad value 'maybe'"),
        (["--set", "aiter.heel=false"], "did you mean 'aiter.heal'?"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--log-format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_every_verb_refuses_with_one_prefix_and_no_python_internals(
    verb: list[str], args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hal0-reconciler: error: ...` for every verb, exit 1 for a usage error (never 2, which
    `plan` means as "changes pending"), the human line only. (In-process: each is refused before
    it runs.)"""
    try:
        code = cli_mod.main([*verb, "--runtime-dir", str(tmp_path), *args])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    stderr = capsys.readouterr().err
    last = stderr.splitlines()[-1]
    assert 1 == code, stderr
    assert last.startswith("hal0-reconciler: error: "), stderr
    assert says in last
    for internal in ("Errno", "could not convert", "is not a valid", "Traceback", "None"):
        assert internal not in stderr


def test_nested_settings_are_settable_from_the_command_line(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """`--set aiter.heal=false --set aiter.keep_quarantines=1` is accepted."""
    result = cli(
        "plan",
        *host_args(host_dirs),
        "--set",
        "aiter.heal=false",
        "--set",
        "aiter.keep_quarantines=1",
    )
    assert 0 == result.returncode, result.stderr


def test_a_missing_aiter_package_folder_is_said_once(tmp_path: Path) -> None:
    """One line, not one per table the folder would hold."""
    result = cli("aiter", "plan", "--package-dir", str(tmp_path / "nope"), "--no-slots")
    assert 1 == result.returncode
    folder = tmp_path / "nope"
    assert [
        f"hal0-reconciler: error: aiter package folder {folder} does not exist or is not a folder"
    ] == result.stderr.splitlines()
    assert "" == result.stdout


def test_status_on_a_non_amd_host_says_so(tmp_path: Path) -> None:
    """`status` says "not an AMD host", as `probe` does, not "rocm lane unusable"."""
    s = cli_mod.settings.load(None, {"runtime_dir": str(tmp_path)})
    snapshot = {
        "pid": os.getpid(),
        "pid_start": status.process_start_time(os.getpid()),
        "updated_at": 1000.0,
        "healthy": True,
        "health": "healthy",
        "ready": True,
        "lane": {"amd": False, "state": "unusable", "reason": "unusable"},
    }
    status.write_status(s, snapshot)
    text, _ = status.report(s, now=1001.0)
    assert "not an AMD host" in text
    assert "rocm lane" not in text


def test_log_lines_carry_no_none(host_dirs: dict[str, Path], seeded_slots: Path) -> None:
    """A field without a value is left out of the log line, not written as None/null."""
    host_dirs["amdgpu_module_dir"].mkdir(parents=True)
    (seeded_slots / "broken.toml").write_text("name = \n")
    result = cli(
        "once", *host_args(host_dirs), "--user", "no-such-user-here", "--log-format", "json"
    )
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert events, result.stderr
    assert [] == [e for e in events if None in e.values()]


# -- 6. colour only where it belongs ----------------------------------------------------------------


def _console_log(env: dict[str, str] | None = None, *extra: str) -> str:
    _, shown, _ = cli_on_a_terminal(
        "plan",
        "--slots-dir",
        "/nonexistent",
        "--log-format",
        "console",
        *extra,
        env=env,
        tty="stderr",
    )
    return shown


def test_colour_on_a_terminal_and_never_elsewhere(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """A terminal gets colour; NO_COLOR, TERM=dumb, --no-color and a pipe or file do not."""
    assert ESC in _console_log()
    assert ESC not in _console_log({"NO_COLOR": "1"})
    assert ESC not in _console_log({"TERM": "dumb"})
    assert ESC not in _console_log(None, "--no-color")
    add_unjudgeable_slots(seeded_slots)
    _, shown, _ = cli_on_a_terminal("once", *host_args(host_dirs))
    assert ESC in shown
    _, shown, _ = cli_on_a_terminal("once", *host_args(host_dirs), env={"NO_COLOR": "1"})
    assert ESC not in shown


def test_console_logs_into_a_file_have_no_escape_codes(
    host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """`--log-format console` with stderr redirected to a file writes plain text."""
    host_dirs["amdgpu_module_dir"].mkdir(parents=True)
    log = tmp_path / "log"
    with log.open("w") as sink:
        subprocess.run(
            [
                *(sys.executable, "-m", "hal0_reconciler", "once", *host_args(host_dirs)[:-2]),
                *("--log-format", "console", "--user", "no-such-user-here"),
            ],
            env={**os.environ, "PYTHONPATH": str(REPO / "src"), "TERM": "xterm"},
            stderr=sink,
            stdout=subprocess.DEVNULL,
            timeout=50,
            check=False,
        )
    text = log.read_text()
    assert "host.probe_failed" in text
    assert ESC not in text


# -- 7. help that teaches ---------------------------------------------------------------------------


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, (*path, name))
    return found


def _leaf_verbs() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return [
        (path, p)
        for path, p in _parsers(cli_mod.build_parser())
        if path and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    ]


def test_every_option_has_help() -> None:
    """No option or argument is left without a line of help."""
    missing = [
        (" ".join(path), a.dest)
        for path, p in _parsers(cli_mod.build_parser())
        for a in p._actions
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert [] == missing


@pytest.mark.parametrize("verb", [" ".join(path) for path, _ in _leaf_verbs()])
def test_every_verb_help_ends_with_its_exit_codes(verb: str) -> None:
    """`VERB --help` lists the common options once, in their own group, and its exit codes."""
    result = cli(*verb.split(), "--help")
    assert 0 == result.returncode
    text = result.stdout
    assert 1 == text.count("common options:")
    assert 1 == text.count("--slots-dir PATH")
    tail = text[text.index("exit status:") :]
    for code, meaning in exits.EXITS[verb]:
        assert f"  {code}  {meaning.split()[0]}" in tail, (code, tail)


def test_the_exit_codes_in_help_are_the_ones_the_code_uses() -> None:
    """The help's numbers are the constants the verbs return."""
    assert [0, 1, 3, 78] == [c for c, _ in exits.EXITS["once"]]
    assert [
        cli_mod.EXIT_OK,
        cli_mod.EXIT_ERROR,
        cli_mod.EXIT_PENDING,
        cli_mod.EXIT_UNJUDGED,
        cli_mod.EXIT_CONFIG,
    ] == [c for c, _ in exits.EXITS["plan"]]
    assert [
        status.EXIT_OK,
        status.EXIT_UNHEALTHY,
        status.EXIT_NOT_RUNNING,
        status.EXIT_UNKNOWN,
    ] == [c for c, _ in exits.EXITS["status"]]


# -- shell completion (generated by shtab with `make completions`; see the Makefile) ----------------


SHIPPED_COMPLETIONS = REPO / "packaging/completions"


@pytest.fixture(scope="module")
def completions() -> Path:
    """The completion scripts the package installs (committed, generated by shtab)."""
    return SHIPPED_COMPLETIONS


def test_the_shipped_completions_match_the_parser(tmp_path: Path) -> None:
    """`make completions` with the pinned shtab reproduces the committed scripts byte for byte:
    a CLI change without regenerating them fails here."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shtab = pytest.importorskip("shtab", reason="shtab (pinned in the test extra) is absent")
    stamp = (SHIPPED_COMPLETIONS / "hal0-reconciler").read_text().splitlines()[1]
    if f"(shtab {shtab.__version__})" not in stamp:
        pytest.skip(f"installed shtab {shtab.__version__} is not the one that made them: {stamp}")
    subprocess.run(
        ["make", "-s", "completions", f"PYTHON={sys.executable}", f"OUT={tmp_path}"],
        cwd=REPO,
        check=True,
        timeout=50,
        capture_output=True,
    )
    for name in ("hal0-reconciler", "_hal0-reconciler"):
        assert (SHIPPED_COMPLETIONS / name).read_text() == (tmp_path / name).read_text(), name


def _bash_complete(script: Path, *words: str) -> list[str]:
    program = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        'COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMP_LINE="${COMP_WORDS[*]}"\n'
        "COMP_POINT=${#COMP_LINE}; COMPREPLY=()\n"
        '_shtab_hal0_reconciler hal0-reconciler "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return result.stdout.split()


def test_bash_completion_knows_verbs_options_values_and_folders(
    completions: Path, tmp_path: Path
) -> None:
    """Verbs, sub-verbs, option names, choices, and only folders for a folder option."""
    script = completions / "hal0-reconciler"
    assert ["plan"] == _bash_complete(script, "hal0-reconciler", "pl")
    assert ["plan", "heal", "restore", "explain"] == _bash_complete(
        script, "hal0-reconciler", "aiter", ""
    )
    assert ["--assume-rocm"] == _bash_complete(script, "hal0-reconciler", "plan", "--assume-r")
    assert ["usable", "unusable"] == _bash_complete(
        script, "hal0-reconciler", "plan", "--assume-rocm", ""
    )
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.toml").write_text("")
    assert [str(tmp_path / "folder")] == _bash_complete(
        script, "hal0-reconciler", "plan", "--slots-dir", f"{tmp_path}/"
    )


def test_zsh_completion_is_valid_zsh(completions: Path) -> None:
    """The zsh script parses (zsh -n) and names every verb."""
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    script = completions / "_hal0-reconciler"
    subprocess.run(["zsh", "-n", str(script)], check=True, timeout=20)
    text = script.read_text()
    assert text.startswith("#compdef hal0-reconciler")
    for verb in ("once", "plan", "probe", "run", "status", "aiter"):
        assert verb in text


@pytest.mark.parametrize("fmt", ["json", "journal", "console"])
def test_a_field_without_a_value_is_left_out_of_the_line(fmt: str) -> None:
    """`slot=None` is not written (None is Python's word, not an operator's), in every format."""
    code = (
        "import structlog;from hal0_reconciler import _log;"
        "from hal0_reconciler.settings import LogFormat;"
        f"_log.configure(LogFormat('{fmt}'),'info');"
        "structlog.get_logger().warning('slot.write_failed', slot=None, path='/x.toml')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=30,
        check=True,
    )
    assert "slot.write_failed" in result.stderr
    assert "/x.toml" in result.stderr
    assert "slot" not in result.stderr.replace("slot.write_failed", "")
    assert "None" not in result.stderr
    assert "null" not in result.stderr
