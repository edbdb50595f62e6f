"""The command line, run as a real subprocess against temp dirs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hosts import REPO

pytestmark = pytest.mark.timeout(60)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    environment.pop("JOURNAL_STREAM", None)
    environment.pop("NOTIFY_SOCKET", None)
    return subprocess.run(
        [sys.executable, "-m", "hal0_reconciler", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=50,
        check=False,
    )


def host_args(host_dirs: dict[str, Path]) -> list[str]:
    """Every host path as its command-line flag (the keys are the settings' names)."""
    flags = [
        arg for key, path in host_dirs.items() for arg in (f"--{key.replace('_', '-')}", str(path))
    ]
    return [*flags, "--user", "54321:54321", "--log-format", "json"]


def make_usable_lane(host_dirs: dict[str, Path]) -> None:
    host_dirs["amdgpu_module_dir"].mkdir(parents=True)
    for node in (host_dirs["kfd_path"], host_dirs["dri_dir"] / "renderD128"):
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chmod(node, 0o666)  # mknod's mode is cut by the umask


def test_plan_shows_pending_relabels_and_exits_2(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """`plan` lists what would change and why, changes nothing, and exits 2 when changes are pending."""
    before = {p.name: p.read_bytes() for p in seeded_slots.iterdir()}
    result = cli("plan", *host_args(host_dirs), "--assume-amd", "--assume-rocm=usable")
    assert 2 == result.returncode, result.stderr
    rows = {
        line.split()[0]: line.split()
        for line in result.stdout.splitlines()[4:]
        if line.strip() and "pending" not in line
    }
    assert [
        "agent",
        "agent.toml",
        "llama-server",
        "gpu-vulkan",
        "relabel",
        "gpu-rocm",
        "image-not-vulkan-capable-rocm-usable",
        "ghcr.io/hal0ai/hal0-rocmfpx:ade07ba",
        "bundled",
        "no",
    ] == rows["agent"]
    assert "keep" == rows["img"][4]
    assert "6 change(s) pending" in result.stdout
    assert before == {p.name: p.read_bytes() for p in seeded_slots.iterdir()}


def test_plan_json_for_machines(seeded_slots: Path, host_dirs: dict[str, Path]) -> None:
    """`plan --json` gives the same verdicts as data."""
    result = cli("plan", *host_args(host_dirs), "--assume-amd", "--assume-rocm=unusable", "--json")
    assert 2 == result.returncode, result.stderr
    doc = json.loads(result.stdout)
    by_slot = {s["slot"]: s for s in doc["slots"]}
    assert ("relabel", "cpu") == (by_slot["coder"]["action"], by_slot["coder"]["new"])
    assert 6 == doc["pending"]
    assert {"amd": True, "rocm_lane": "unusable"} == {
        k: doc["host"][k] for k in ("amd", "rocm_lane")
    }


def test_plan_says_beforehand_when_a_write_would_lose_comments(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """A slot whose label cannot be edited in place is flagged in the table and in --json."""
    exotic = seeded_slots / "exotic.toml"
    exotic.write_text('# lost\n[slot]\nname = "x"\ndevice = "gpu-vulkan"\n[slot.backend]\nv = 1\n')
    (seeded_slots / "broken.toml").write_text("device = \n")  # a message, but no write
    args = [*host_args(host_dirs), "--assume-amd", "--assume-rocm=usable"]
    table = cli("plan", *args).stdout.splitlines()
    doc = json.loads(cli("plan", *args, "--json").stdout)
    notes = [line for line in table if line.startswith("note:")]
    assert 1 == len(notes), table
    assert notes[0].startswith("note: exotic.toml: the write would rewrite the whole file"), notes
    assert "backend is a table of its own" in notes[0]
    lost = {s["file"]: (s["loses_comments"], s["loses_comments_why"]) for s in doc["slots"]}
    assert lost.pop("exotic.toml")[0] is True
    assert (False, None) == lost.pop("broken.toml")
    assert {(False, None)} == set(lost.values())


def test_plan_on_a_non_amd_host_has_nothing_to_do(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """Without amdgpu, `plan` says so and exits 0."""
    result = cli("plan", *host_args(host_dirs))
    assert 0 == result.returncode, result.stderr
    assert "not AMD" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the credential-dropping probe need root")
def test_once_applies_then_converges_silently(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """`once` relabels with the real probe; a second `once` changes nothing and logs nothing."""
    make_usable_lane(host_dirs)
    first = cli("once", *host_args(host_dirs), "--log-format", "json")
    assert 0 == first.returncode, first.stderr
    events = [json.loads(line)["event"] for line in first.stderr.splitlines()]
    assert ["slot.relabeled"] * 6 == events
    snapshot = {p.name: p.read_bytes() for p in seeded_slots.iterdir()}
    second = cli("once", *host_args(host_dirs))
    assert (0, "") == (second.returncode, second.stderr)
    assert snapshot == {p.name: p.read_bytes() for p in seeded_slots.iterdir()}
    assert 0 == cli("plan", *host_args(host_dirs)).returncode


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the credential-dropping probe need root")
def test_probe_reports_the_failing_node(host_dirs: dict[str, Path]) -> None:
    """`probe` names the node the service user cannot open, and why; exit 1."""
    make_usable_lane(host_dirs)
    os.chmod(host_dirs["kfd_path"], 0o600)
    result = cli("probe", *host_args(host_dirs))
    assert 1 == result.returncode
    assert "ROCm lane: unusable" in result.stdout
    assert f"{host_dirs['kfd_path']}: permission errno 13" in result.stdout
    assert "probed as: 54321 (uid 54321, gid 54321, groups 54321)" in result.stdout
    assert "why this identity: the service_user setting" in result.stdout


def test_probe_says_which_hal0_it_read(host_dirs: dict[str, Path]) -> None:
    """`probe` carries the hal0 facts used: version, default image, capable set, and where
    each came from."""
    make_usable_lane(host_dirs)
    result = cli("probe", *host_args(host_dirs))
    assert 0 == result.returncode, result.stderr
    assert "hal0 1.1.0: schema allowlist, capable: ghcr.io/hal0ai/hal0-combined:0822" in (
        result.stdout
    )
    assert "default image: ghcr.io/hal0ai/hal0-rocmfpx:ade07ba" in result.stdout
    assert f"capable: {host_dirs['hal0_venv']}" in result.stdout


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="a read-only slot file only stops non-root writers; here we make the directory unwritable",
)
def test_once_exits_1_when_a_file_cannot_be_written(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """When a write fails, `once` logs it, leaves the file intact and exits 1."""
    make_usable_lane(host_dirs)
    result = cli(
        "once",
        *host_args(host_dirs),
        "--lock-file",
        str(host_dirs["slots_dir"] / "no-such-dir" / "x.lock"),
        "--log-format",
        "json",
    )
    assert 1 == result.returncode
    assert {"slot.write_failed"} == {
        json.loads(line)["event"] for line in result.stderr.splitlines()
    }
    assert 'device = "gpu-vulkan"' in (seeded_slots / "agent.toml").read_text()


def test_bad_setting_is_named(tmp_path: Path) -> None:
    """An unknown key in the settings file stops the command with the key's name, exit 78."""
    cfg = tmp_path / "r.toml"
    cfg.write_text("slot_dir = '/x'\n")
    result = cli("plan", "--config", str(cfg))
    assert 78 == result.returncode
    assert "unknown setting 'slot_dir'" in result.stderr


def test_a_probe_that_cannot_run_demotes_nothing(
    seeded_slots: Path, host_dirs: dict[str, Path]
) -> None:
    """A mistyped service user makes the probe fail: `once` says so, demotes nothing and exits
    1 (the pass could not do its job)."""
    host_dirs["amdgpu_module_dir"].mkdir(parents=True)
    before = {p.name: p.read_bytes() for p in seeded_slots.iterdir()}
    result = cli(
        "once", *host_args(host_dirs), "--user", "no-such-user-here", "--log-format", "json"
    )
    assert 1 == result.returncode, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert ["host.probe_failed"] == [e["event"] for e in events]
    assert "no-such-user-here" in events[0]["reason"]
    assert before == {p.name: p.read_bytes() for p in seeded_slots.iterdir()}


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            ["--slots-dir", "/nonexistent-slots"],
            "slots directory /nonexistent-slots does not exist",
        ),
        (["--slots-dir", "/etc/hostname"], "slots directory /etc/hostname is not a directory"),
        (
            ["--set", "slots_dir="],
            "setting 'slots_dir' has a bad value '': a path must not be empty",
        ),
        (
            ["--slots-dir", ""],
            (
                "argument --slots-dir: a path must not be empty (it would mean this folder) "
                "(see hal0-reconciler {verb} --help)"
            ),
        ),
    ],
)
@pytest.mark.parametrize("verb", ["once", "plan"])
def test_a_wrong_slots_folder_is_an_error_not_no_changes(
    verb: str, flag: list[str], message: str
) -> None:
    """A typo in the slots folder exits 1 with one line, instead of reporting nothing to do."""
    result = cli(verb, *flag)
    error = result.stderr.splitlines()[-1]
    assert (1, f"hal0-reconciler: error: {message.format(verb=verb)}") == (result.returncode, error)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the credential-dropping probe need root")
def test_once_restarts_the_active_slots_it_relabelled(
    seeded_slots: Path, host_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """`once` applies a relabel like the daemon: hal0's API restarts the active slot, only that one."""
    from helpers.fake_systemctl import FakeSystemctl
    from helpers.hal0_api_server import Hal0Api

    make_usable_lane(host_dirs)
    systemctl = FakeSystemctl(tmp_path / "bin", {"hal0-slot@coder.service": "active"})
    with Hal0Api() as api:
        result = cli(
            "once",
            *host_args(host_dirs),
            "--set",
            f"systemctl={systemctl.path}",
            "--set",
            f"api_url={api.url}",
            "--set",
            f"api_env_file={tmp_path / 'none.env'}",
        )
    assert 0 == result.returncode, result.stderr
    assert [("POST", "/api/slots/coder/restart", None)] == api.requests
    assert "unit.restarted" in result.stderr


def test_probe_on_a_non_amd_host_exits_1(host_dirs: dict[str, Path]) -> None:
    """`probe` without amdgpu says so and exits 1: there is no ROCm lane to use."""
    result = cli("probe", *host_args(host_dirs))
    assert 1 == result.returncode
    assert "ROCm lane: not probed (not an AMD host)" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the credential-dropping probe need root")
@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        pytest.param('name = "Bad Name"\n', "name 'Bad Name' breaks", id="name"),
        pytest.param('name = "ok"\nid = "../../x"\n', "id '../../x' breaks", id="id"),
    ],
)
def test_a_slot_hal0_could_not_run_is_reported_never_named_to_systemctl_or_the_api(
    host_dirs: dict[str, Path], tmp_path: Path, fields: str, problem: str
) -> None:
    """A relabelled slot whose name or id breaks hal0's patterns is said once, and neither
    `systemctl` nor hal0's API ever sees it (not even an is-active look-up)."""
    from helpers.fake_systemctl import FakeSystemctl
    from helpers.hal0_api_server import Hal0Api

    make_usable_lane(host_dirs)
    (host_dirs["slots_dir"] / "odd.toml").write_text(
        f'# a slot written by hand\n{fields}type = "llm"\ndevice = "gpu-vulkan"\n'
    )
    systemctl = FakeSystemctl(tmp_path / "bin", {})
    with Hal0Api() as api:
        result = cli(
            "once",
            *host_args(host_dirs),
            "--set",
            f"systemctl={systemctl.path}",
            "--set",
            f"api_url={api.url}",
            "--log-format",
            "json",
        )
    assert 0 == result.returncode, result.stderr
    assert 'device = "gpu-rocm"' in (host_dirs["slots_dir"] / "odd.toml").read_text()
    assert ([], []) == (systemctl.calls(), api.requests)
    events = [json.loads(line) for line in result.stderr.splitlines()]
    invalid = [e for e in events if e["event"] == "slot.name_invalid"]
    assert 1 == len(invalid), events
    assert problem in invalid[0]["reason"]
