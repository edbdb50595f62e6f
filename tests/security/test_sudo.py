"""A command run through sudo must not hand out root.

The caller is an unprivileged user root runs the command for: ``SUDO_UID`` set (what sudo
sets; the real uid is then 0), or a real uid that is not 0 (a harness that keeps euid 0 and
sets the real uid to the attacker's, as a setuid wrapper would, without any setuid file). The
host's paths are real: each run is in a private mount namespace whose /etc, /usr/lib and
/usr/bin are overlays holding this test's hal0, slot files, Quadlet units and a recording
``systemctl`` (root's, at /usr/bin/systemctl), so the host's own files are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.host import caller
from hal0_reconciler.host.restarts import api as hal0_api
from helpers.attacker import Attacker, Tally
from helpers.daemon_host import drop_slot
from helpers.hal0_tree import Hal0Tree
from helpers.hosts import REPO

pytestmark = pytest.mark.timeout(90)

_RECORDER = """#!/bin/sh
echo "$@" >> {log}
if [ "$1" = is-active ]; then shift; for u in "$@"; do echo active; done; fi
exit 0
"""
_EVIL = "#!/bin/sh\necho ran >> {marker}\nexit 0\n"
_AS_CALLER = (
    "import os, sys; uid = int(sys.argv[1]); os.setresuid(uid, 0, 0);"
    " os.execv(sys.executable, [sys.executable, '-m', 'hal0_reconciler', *sys.argv[2:]])"
)


@dataclass
class Box:
    """The overlays' upper folders and what the run leaves behind."""

    tmp: Path
    attacker: Attacker

    @property
    def etc(self) -> Path:
        return self.tmp / "root/etc"

    @property
    def systemctl_log(self) -> Path:
        return self.tmp / "systemctl.log"

    @property
    def marker(self) -> Path:
        return self.tmp / "evil-ran"

    @property
    def evil(self) -> Path:
        return self.tmp / "evil"

    def run(
        self,
        *argv: str,
        sudo: bool = True,
        real_uid: bool = False,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        mounts = []
        for target, upper in (
            ("/etc", "root/etc"),
            ("/usr/lib", "root/usr/lib"),
            ("/usr/bin", "bin"),
        ):
            work = self.tmp / f"work{target.replace('/', '-')}"
            work.mkdir(exist_ok=True)
            mounts.append(
                f"mount -t overlay overlay -o lowerdir={target},upperdir={self.tmp / upper},"
                f"workdir={work} {target}"
            )
        script = " && ".join([*mounts, 'exec "$0" "$@"'])
        environment = {k: v for k, v in os.environ.items() if k not in {"SUDO_UID", "HAL0_HOME"}}
        environment |= {"PYTHONPATH": str(REPO / "src"), **(env or {})}
        if sudo:
            environment |= {"SUDO_UID": str(self.attacker.uid), "SUDO_USER": self.attacker.name}
        python = (
            [sys.executable, "-c", _AS_CALLER, str(self.attacker.uid)]
            if real_uid
            else [sys.executable, "-m", "hal0_reconciler"]
        )
        return subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, *python, *argv],
            capture_output=True,
            text=True,
            env=environment,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture
def box(tmp_path: Path, attacker: Attacker) -> Box:
    """One running slot whose unit disagrees with its label: enough for ``plan`` to ask
    systemctl about it (the attack of a read-only verb)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare for a private mount namespace")
    root = tmp_path / "root"
    Hal0Tree(root).install("ade07ba")
    slots = root / "etc/hal0/slots"
    slots.mkdir(parents=True)
    drop_slot(slots, "agent", device="gpu-rocm")
    quadlets = root / "etc/containers/systemd"
    quadlets.mkdir(parents=True)
    (quadlets / "hal0-slot@agent.container").write_text(
        "[Container]\nImage=ghcr.io/hal0ai/hal0-toolbox-cpu:v1\nContainerName=hal0-slot-agent\n"
    )
    (tmp_path / "bin").mkdir()
    recorder = tmp_path / "bin/systemctl"
    recorder.write_text(_RECORDER.format(log=tmp_path / "systemctl.log"))
    recorder.chmod(0o755)
    made = Box(tmp_path, attacker)
    made.evil.write_text(_EVIL.format(marker=made.marker))
    made.evil.chmod(0o755)
    return made


PLAN = ("plan", "--assume-amd", "--assume-rocm=usable")


def test_plan_set_systemctl_runs_that_program_for_root_but_not_for_a_sudo_caller(
    box: Box, attacks: Tally
) -> None:
    """Root itself may choose systemctl (it runs: the attack is real); the caller through sudo
    (``SUDO_UID``, or a real uid that is not 0) is refused, and the program never runs."""
    as_root = box.run(*PLAN, f"--set=systemctl={box.evil}", sudo=False)
    assert box.marker.exists(), ("the setup never reaches systemctl", as_root.stderr)
    box.marker.unlink()
    for real_uid in (False, True):
        attacks.tried("sudo plan --set systemctl")
        done = box.run(*PLAN, f"--set=systemctl={box.evil}", real_uid=real_uid)
        assert 1 == done.returncode, done.stderr
        assert "--set systemctl (a program root runs)" in done.stderr
        assert f"uid {box.attacker.uid}" in done.stderr
        assert not box.marker.exists(), "the caller's program ran as root"
        attacks.held("sudo plan --set systemctl")


def test_a_sudo_run_takes_systemctl_from_roots_own_folder_whatever_the_settings_say(
    box: Box, attacks: Tally
) -> None:
    """The settings file names another systemctl: root's run uses it, a run through sudo runs
    /usr/bin/systemctl (root's file, on a way only root can change) instead."""
    attacks.tried("sudo run with a settings file's systemctl")
    (box.etc / "hal0/reconciler.toml").write_text(f'systemctl = "{box.evil}"\n')
    done = box.run(*PLAN, "--json")
    assert 0 == done.returncode, done.stderr
    assert not box.marker.exists(), "a sudo run ran the settings file's systemctl"
    assert "is-active hal0-slot@agent.service" in box.systemctl_log.read_text()
    doc = json.loads(done.stdout)
    assert "agent" in doc["labels_not_applied"]
    as_root = box.run(*PLAN, sudo=False)
    assert box.marker.exists(), as_root.stderr
    attacks.held("sudo run with a settings file's systemctl")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("once", "--set=api_url=http://127.0.0.1:1"), "--set api_url (the peer root sends"),
        (("once", "--set=hal0_api_user={uid}"), "--set hal0_api_user (a user root trusts"),
        (("once", "--set=hal0_api_unit=evil.service"), "--set hal0_api_unit"),
        (("once", "--set=hal0_api_unit_dirs=[]"), "--set hal0_api_unit_dirs (a path"),
        (("plan", "--config={tmp}/secret"), "--config (a path root reads or writes)"),
        (("plan", "--slots-dir={tmp}"), "--slots-dir (a path"),
        (("plan", "--set=state_dir={tmp}"), "--set state_dir (a path"),
        (("plan", "--set=metrics_textfile={tmp}/m.prom"), "--set metrics_textfile (a path"),
        (("plan", "--set=aiter.trees=x"), "--set aiter.trees (a path"),
        (("plan", "--set=aiter=x"), "--set aiter (a path"),
        (("plan", "--set=aiter.routing_file=/x"), "--set aiter.routing_file (a path"),
        (("probe", "--user=root"), "--user (the user root runs the probe as)"),
        (("reload", "--pid=1"), "--pid (the process root signals)"),
        (("run",), "run (the daemon is systemd's to start"),
        (("aiter", "plan", "--package-dir={tmp}"), "--package-dir (a path"),
        # a verb that writes runs only as root's settings say: hands-off slots, the facts,
        # the rules and the limits root writes by are the file's, not the caller's
        (("once", "--set=hands_off=[]"), "--set hands_off (it changes what root writes)"),
        (("once", "--set=demote_grace=0"), "--set demote_grace (it changes what root writes)"),
        (("once", "--set=apply_others_labels=true"), "--set apply_others_labels (it changes"),
        (("once", "--assume-hal0=1.0.0"), "--assume-hal0 (it changes what root writes)"),
        (("aiter", "heal", "--target=gfx942:304"), "--target (it changes what root writes)"),
    ],
)
def test_a_sudo_caller_may_not_choose_for_root(
    box: Box, attacks: Tally, argv: tuple[str, ...], named: str
) -> None:
    """Programs, peers, trusted users, processes and paths: each refused before anything is
    read or run (a key name of a root-only file is never echoed)."""
    attacks.tried("sudo caller chooses for root")
    (box.tmp / "secret").write_text("root_only_key_name = 1\n")
    (box.tmp / "secret").chmod(0o600)
    filled = [a.format(tmp=box.tmp, uid=box.attacker.uid) for a in argv]
    done = box.run(*filled)
    assert 1 == done.returncode, done.stderr
    assert named in done.stderr
    assert "root_only_key_name" not in done.stderr + done.stdout
    attacks.held("sudo caller chooses for root")


def test_hal0_home_is_refused_for_a_sudo_caller(box: Box, attacks: Tally) -> None:
    """HAL0_HOME moves every path: kept by a sudoers env_keep, it is still refused."""
    attacks.tried("sudo caller sets HAL0_HOME")
    done = box.run("plan", env={"HAL0_HOME": str(box.tmp)})
    assert 1 == done.returncode
    assert "HAL0_HOME" in done.stderr
    attacks.held("sudo caller sets HAL0_HOME")


def test_root_itself_reads_the_config_it_names(box: Box) -> None:
    """The same ``--config`` for root itself: read (its key named in the error)."""
    (box.tmp / "secret").write_text("root_only_key_name = 1\n")
    done = box.run("plan", f"--config={box.tmp}/secret", sudo=False)
    assert 78 == done.returncode
    assert "root_only_key_name" in done.stderr


def test_what_may_be_delegated_runs(box: Box) -> None:
    """Numbers, switches and log choices: a sudo caller's plan runs and answers."""
    done = box.run(*PLAN, "--json", "--set=demote_grace=10", "--log-level=warning", "--no-color")
    assert 0 == done.returncode, done.stderr
    assert "agent" in json.loads(done.stdout)["labels_not_applied"]


def test_a_writing_verb_may_be_delegated_with_presentation_choices_only(box: Box) -> None:
    """``once`` with log choices, ``--json`` and ``--no-restart`` (it does less) runs for a
    sudo caller: only choices that change what root writes are refused."""
    done = box.run("once", "--json", "--no-restart", "--set=log_level=warning", "--no-color")
    assert "refused" not in done.stderr, done.stderr


def test_the_callers_uid_is_never_trusted_as_hal0_apis_owner(
    tmp_path: Path, attacker: Attacker, monkeypatch: pytest.MonkeyPatch, attacks: Tally
) -> None:
    """Even when hal0-api's unit names the caller (or the setting does), a run for that caller
    through sudo trusts root alone."""
    attacks.tried("sudo caller trusted as hal0-api")
    units = tmp_path / "units"
    units.mkdir()
    (units / "hal0-api.service").write_text(f"[Service]\nUser={attacker.name}\n")
    by_unit = settings_mod.load(None, {"hal0_api_unit_dirs": [str(units)]})
    by_setting = settings_mod.load(None, {"hal0_api_user": str(attacker.uid)})
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert frozenset({0, attacker.uid}) == hal0_api.accepted_uids(by_unit)
    monkeypatch.setenv("SUDO_UID", str(attacker.uid))
    assert frozenset({0}) == hal0_api.accepted_uids(by_unit)
    assert frozenset({0}) == hal0_api.accepted_uids(by_setting)
    attacks.held("sudo caller trusted as hal0-api")


def test_who_the_caller_is() -> None:
    """The real uid, then SUDO_UID, PKEXEC_UID, DOAS_USER; root's own 0 is not a delegation."""
    assert 1000 == caller.delegating_uid({}, real_uid=1000)
    assert 1000 == caller.delegating_uid({"SUDO_UID": "0"}, real_uid=1000)
    assert caller.delegating_uid({}, real_uid=0) is None
    assert caller.delegating_uid({"SUDO_UID": "0"}, real_uid=0) is None
    assert 1001 == caller.delegating_uid({"SUDO_UID": " 1001 "}, real_uid=0)
    assert 1002 == caller.delegating_uid({"PKEXEC_UID": "1002"}, real_uid=0)
    assert caller.delegating_uid({"SUDO_UID": "x"}, real_uid=0) is None
    assert 0 != caller.delegating_uid({"DOAS_USER": "nobody"}, real_uid=0)
    assert caller.delegating_uid({"DOAS_USER": "root"}, real_uid=0) is None
    assert -1 == caller.delegating_uid({"DOAS_USER": "no-such-user-here"}, real_uid=0)


@pytest.fixture
def root_only_folder() -> Iterator[Path]:
    """A folder on a way only root can change (/tmp is everyone's: not that)."""
    folder = Path(tempfile.mkdtemp(dir="/run", prefix="hal0-reconciler-test-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_systemctl_is_taken_only_from_a_way_only_root_can_change(
    root_only_folder: Path, attacker: Attacker
) -> None:
    """A candidate the attacker owns, one others may write, or one in a folder the attacker
    owns is skipped; root's own file is taken; so is nothing under a folder others may write
    (/tmp)."""
    tmp_path = root_only_folder
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    attacker.chown(theirs)
    planted = theirs / "systemctl"
    planted.write_text("#!/bin/sh\n")
    attacker.chown(planted)
    in_their_folder = theirs / "roots-systemctl"
    in_their_folder.write_text("#!/bin/sh\n")
    writable = tmp_path / "writable-systemctl"
    writable.write_text("#!/bin/sh\n")
    writable.chmod(0o777)
    good = tmp_path / "systemctl"
    good.write_text("#!/bin/sh\n")
    good.chmod(0o755)
    bad = (planted, in_their_folder, writable)
    if any(os.lstat(p).st_uid != 0 or os.lstat(p).st_mode & 0o022 for p in tmp_path.parents):
        pytest.skip("the test folder's parents are not root-only")
    assert str(good) == caller.fixed_systemctl((*bad, good))
    assert caller.fixed_systemctl(bad) is None  # none fits: nothing is run for the caller
    in_tmp = Path(tempfile.mkdtemp()) / "systemctl"
    in_tmp.write_text("#!/bin/sh\n")
    in_tmp.chmod(0o755)
    try:
        assert str(good) == caller.fixed_systemctl((in_tmp, good))
    finally:
        shutil.rmtree(in_tmp.parent)
