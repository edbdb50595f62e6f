"""Terminal output is inert: what files say (names, paths, images, messages) can never drive the
operator's terminal. Every control character is shown escaped in human-readable output; JSON
keeps the exact string."""

from __future__ import annotations

import codecs
import io
import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hal0_reconciler import _log, console
from helpers.attacker import Attacker, Tally
from integration.test_cli import host_args, make_usable_lane
from integration.test_cli_operator import cli_on_a_terminal
from security.test_host_reads import in_a_child, run_cli

pytestmark = pytest.mark.timeout(120)

# erase the line, move up, set the window title (OSC ... BEL), a right-to-left override
HOSTILE = "ev\x1b[2K\x1b[1Ail\x1b]0;owned\x07\u202egpj.exe\x9b2J\x7f\nforged"
HOSTILE_SHOWN = "ev\\x1b[2K\\x1b[1Ail\\x1b]0;owned\\x07\\u202egpj.exe\\x9b2J\\x7f\\nforged"
FILE_NAME = "x\x1b[31mred\u2066.toml"
FILE_SHOWN = "x\\x1b[31mred\\u2066.toml"
IMAGE = "ghcr.io/evil/img\x1b[2J\x1b[H:tag"
IMAGE_SHOWN = "ghcr.io/evil/img\\x1b[2J\\x1b[H:tag"
VERSION = "0.9.9\x1b]8;;http://evil\x1b\\link"
VERSION_SHOWN = "0.9.9\\x1b]8;;http://evil\\x1b\\link"

# the rule, written down here independently of the code under test
CONTROLS = frozenset(
    (*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))
)
RAW = frozenset(CONTROLS - {0x0A})


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, every control character as a ``\\uXXXX`` escape."""
    return json.dumps(text, ensure_ascii=True)


def raw_controls(text: str) -> list[str]:
    """The control characters of ``text`` other than the newline (what a terminal acts on)."""
    return [hex(ord(c)) for c in text if ord(c) in RAW]


# -- the escaper --------------------------------------------------------------------------------


@given(st.text())
def test_nothing_the_escaper_returns_holds_a_control_character(text: str) -> None:
    """Whatever the text, inert() returns no control character (newline included)."""
    assert [] == [c for c in console.inert(text) if ord(c) in CONTROLS]
    assert [] == raw_controls(console.inert_lines(text))


@given(st.text(st.characters(blacklist_characters=[chr(c) for c in CONTROLS])))
def test_printable_text_is_unchanged(text: str) -> None:
    """Text with no control character comes out of the escaper exactly as it went in."""
    assert text == console.inert(text)
    assert text == console.inert_lines(text)


@given(st.text(st.characters(max_codepoint=0x7F, blacklist_characters="\\")))
def test_escaped_ascii_reads_back_as_the_original(text: str) -> None:
    """For ASCII, the escaped form means the original: Python's escapes decode back to it."""
    assert text == codecs.decode(console.inert(text), "unicode_escape")


@given(st.text())
def test_json_output_keeps_the_exact_string_and_no_control_character(text: str) -> None:
    """`--json` documents carry the exact string, and their bytes hold no control character
    but the layout's newlines (json.dumps escapes them itself)."""
    out = io.StringIO()
    console.dump_json({"slot": text or "x"}, out)
    assert (text or "x") == json.loads(out.getvalue())["slot"]
    assert [] == raw_controls(out.getvalue())


def test_the_escapes_are_in_python_s_style() -> None:
    """ESC is \\x1b, the C1 CSI \\x9b, a bidi override \\u202e, newline and tab by name."""
    assert "\\x1b[2J \\x9b \\x7f \\u202e \\u2069 \\n \\t \\x00" == console.inert(
        "\x1b[2J \x9b \x7f \u202e \u2069 \n \t \x00"
    )


def test_say_keeps_only_the_console_s_own_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a colour terminal, say(painted=True) keeps paint()'s codes and escapes any other."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    console.say(f"{console.paint('ok', 'green', out)} \x1b[2J\x1b[8m", out, painted=True)
    assert "\x1b[32mok\x1b[0m \\x1b[2J\\x1b[8m\n" == out.getvalue()


# -- the verbs ----------------------------------------------------------------------------------


def hostile_world(host_dirs: dict[str, Path], attacker: Attacker) -> Path:
    """A slot file whose name, file name and image pin carry escape sequences, written by the
    attacker (who owns the slots folder, as hal0's API user does), and a hal0 VERSION with an
    OSC 8 hyperlink."""
    slots = host_dirs["slots_dir"]
    path = slots / FILE_NAME
    path.write_text(
        f'name = {toml_string(HOSTILE)}\ntype = "llm"\ndevice = "gpu-vulkan"\n'
        f"image_pin = {toml_string(IMAGE)}\n"
    )
    attacker.chown(slots, path)
    (host_dirs["hal0_release_dir"] / "VERSION").write_text(VERSION + "\n")
    return path


def test_plan_shows_hostile_names_escaped_and_json_keeps_them_exact(
    attacker: Attacker, attacks: Tally, host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """`plan`'s table shows a slot's name, file name and image and hal0's version escaped;
    `plan --json` gives each exact string."""
    hostile_world(host_dirs, attacker)
    args = (*host_args(host_dirs), "--assume-amd", "--assume-rocm=usable")
    attacks.tried("escape sequences", 4)
    shown = run_cli("plan", *args, home=tmp_path)
    assert 2 == shown.returncode, shown.stderr
    assert [] == raw_controls(shown.stdout)
    row = next(line for line in shown.stdout.splitlines() if line.startswith("ev"))
    assert [HOSTILE_SHOWN, FILE_SHOWN, "llama-server", "gpu-vulkan", "relabel", "gpu-rocm"] == (
        row.split()[:6]
    )
    assert IMAGE_SHOWN in row.split()
    assert f"(installed {VERSION_SHOWN})" in shown.stdout
    machine = run_cli("plan", *args, "--json", home=tmp_path)
    doc = json.loads(machine.stdout)
    (slot,) = doc["slots"]
    assert (HOSTILE, FILE_NAME, IMAGE) == (slot["slot"], slot["file"], slot["image"])
    assert VERSION == doc["hal0"]["version"]
    attacks.held("escape sequences", 4)


def test_once_on_a_colour_terminal_keeps_its_colours_and_escapes_the_names(
    attacker: Attacker, attacks: Tally, host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """`once` on a terminal: its own green "relabelled", the slot's escape sequences escaped."""
    make_usable_lane(host_dirs)
    hostile_world(host_dirs, attacker)
    attacks.tried("escape sequences")
    env = {"HAL0_HOME": str(tmp_path)}
    code, shown, _ = cli_on_a_terminal("once", *host_args(host_dirs), "--no-restart", env=env)
    assert 0 == code, shown
    line = next(line for line in shown.splitlines() if "relabelled" in line)
    label = f"{HOSTILE_SHOWN} ({FILE_SHOWN})"
    assert f"  \x1b[32mrelabelled\x1b[0m {label}: gpu-vulkan -> gpu-rocm" == line
    assert ["0x1b", "0x1b"] == raw_controls(line)  # the two of the colour, nothing else
    attacks.held("escape sequences")


def test_status_shows_a_hostile_slot_name_escaped(attacks: Tally, tmp_path: Path) -> None:
    """`status` (text) shows a slot name and reason from the status file escaped."""
    runtime = tmp_path / "run"
    runtime.mkdir()
    raw = Path(f"/proc/{os.getpid()}/stat").read_bytes()
    snapshot = {
        "pid": os.getpid(),
        "pid_start": float(raw[raw.rfind(b")") + 2 :].split()[19]),
        "ready": True,
        "healthy": True,
        "heartbeat": 30.0,
        "updated_at": time.time() + 3600,
        "slots": {FILE_NAME: {"name": HOSTILE, "status": "unchanged", "reason": IMAGE}},
        "problems": [f"slot {HOSTILE}: {IMAGE}"],
    }
    (runtime / "status.json").write_text(json.dumps(snapshot))
    attacks.tried("escape sequences")
    result = run_cli("status", "--runtime-dir", str(runtime), home=tmp_path)
    assert 0 == result.returncode, result.stdout
    assert [] == raw_controls(result.stdout)
    lines = result.stdout.splitlines()
    assert f"{HOSTILE_SHOWN} ({FILE_SHOWN})" == lines[-2].split()[0] + " " + lines[-2].split()[1]
    assert f"  problem: slot {HOSTILE_SHOWN}: {IMAGE_SHOWN}" == lines[-1]
    attacks.held("escape sequences")


def test_status_shows_a_hostile_runtime_path_escaped(attacks: Tally, tmp_path: Path) -> None:
    """`status` names the status file it did not find; a path with escape sequences (the
    report's own words, not a value) is escaped by the output itself."""
    runtime = tmp_path / f"run{HOSTILE}"
    attacks.tried("escape sequences")
    result = run_cli("status", "--runtime-dir", str(runtime), home=tmp_path)
    assert 3 == result.returncode
    assert [] == raw_controls(result.stdout)
    shown = console.inert_lines(str(runtime / "status.json"))
    assert f"hal0-reconciler: not running (no {shown})\n" == result.stdout
    attacks.held("escape sequences")


def test_an_error_line_shows_a_hostile_path_escaped(attacks: Tally, tmp_path: Path) -> None:
    """The one error line names a path with escape sequences escaped."""
    missing = tmp_path / f"slots{HOSTILE}"
    attacks.tried("escape sequences")
    result = run_cli("plan", "--slots-dir", str(missing), home=tmp_path)
    assert 1 == result.returncode
    assert [] == raw_controls(result.stderr)
    assert f"{tmp_path}/slots{HOSTILE_SHOWN}" in result.stderr
    attacks.held("escape sequences")


def test_aiter_explain_shows_a_hostile_kernel_name_escaped(attacks: Tally, tmp_path: Path) -> None:
    """`aiter explain` of a crafted message: the kernel name it quotes is shown escaped."""
    text = "kernel 'fmha\x1b[2Jx' is not present in the compiled registry"
    attacks.tried("escape sequences")
    result = run_cli("aiter", "explain", text, home=tmp_path)
    assert [] == raw_controls(result.stdout + result.stderr)
    assert "kernel fmha\\x1b[2Jx" in result.stdout.splitlines()
    attacks.held("escape sequences")


def test_aiter_plan_shows_a_hostile_slot_escaped_and_json_keeps_it_exact(
    attacker: Attacker, attacks: Tally, tmp_path: Path
) -> None:
    """`aiter plan` names a slot file it could not read, its escape sequences escaped; `aiter
    plan --json` keeps the exact name."""
    package, slots = tmp_path / "aiter", tmp_path / "slots"
    package.mkdir()
    slots.mkdir()
    stem = f"bad{HOSTILE}"
    (slots / f"{stem}.toml").write_text("garbage = = \n")
    attacker.chown(slots, slots / f"{stem}.toml")
    args = ("--package-dir", str(package), "--slots-dir", str(slots), "--target", "gfx942:304")
    attacks.tried("escape sequences")
    shown = run_cli("aiter", "plan", *args, home=tmp_path)
    assert [] == raw_controls(shown.stdout + shown.stderr)
    assert shown.stdout.splitlines()[0].startswith(
        f"! slot bad{HOSTILE_SHOWN} unreadable, its environment is not checked: not valid TOML"
    )
    machine = run_cli("aiter", "plan", "--json", *args, home=tmp_path)
    assert [stem] == list(json.loads(machine.stdout)["slots_unreadable"])
    attacks.held("escape sequences")


def test_log_lines_escape_values_and_native_fields_stay_exact(attacks: Tally) -> None:
    """The journal line (and so the native MESSAGE) shows a slot name escaped; the native
    SLOT= field keeps the exact value."""
    attacks.tried("escape sequences")
    event = {"event": f"slot.relabeled{HOSTILE}", "slot": HOSTILE, "level": "warning"}
    line = _log.journal_line("warning", dict(event))
    fields = _log.native_fields(line, dict(event))
    assert f"<4>slot.relabeled{HOSTILE_SHOWN} slot=" in line
    assert [] == raw_controls(line)
    assert [] == raw_controls(fields["MESSAGE"])
    assert HOSTILE == fields["SLOT"]
    attacks.held("escape sequences")


def test_the_console_log_renderer_escapes_values(attacks: Tally, tmp_path: Path) -> None:
    """The console log format (a person at a terminal) shows a logged value escaped."""
    code = f"""
from hal0_reconciler import _log
from hal0_reconciler.settings import LogFormat
_log.configure(LogFormat.CONSOLE, "info")
_log.get_logger("t").warning("slot.relabeled", slot={HOSTILE!r})
"""
    attacks.tried("escape sequences")
    result = in_a_child(code, home=tmp_path)
    assert [] == raw_controls(result.stderr), result.stderr
    assert f"slot={HOSTILE_SHOWN}" in result.stderr
    attacks.held("escape sequences")
