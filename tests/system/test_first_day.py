"""An operator's first day under the real systemd 252: a typo never locks them out, `status`
answers while the file is broken, the metrics land where the documents say, no warning from
systemd about /etc/hal0's mode, and install / upgrade / purge leave exactly what they should.

One container for the module (its own, booted from the cached Debian 12 root); the tests run in
file order. The upgrade installs this tree rebuilt as the next version (only the version changed).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from helpers import nspawn
from helpers.nspawn import FILES
from system import debs
from system.test_in_systemd import (
    UNIT,
    amd_settings,
    configure,
    journal_entries,
    settings_text,
    show,
    wait_until,
)

pytestmark = pytest.mark.timeout(600)

CONFIG = "/etc/hal0/reconciler.toml"
TEMPLATE = "/usr/share/hal0-reconciler/reconciler.toml"
METRICS = "/var/lib/prometheus/node-exporter/hal0_reconciler.prom"  # the documented path
STATE = "/var/lib/hal0-reconciler"


def cursor(box: nspawn.Container) -> str:
    """Where the journal ends now (``--after-cursor`` reads only what comes next)."""
    out = box.run("journalctl -n 0 --show-cursor --no-pager").stdout
    return out.strip().rpartition("-- cursor: ")[2]


def systemd_said(box: nspawn.Container, after: str, priority: str = "debug") -> list[str]:
    """What systemd itself (PID 1) logged about the unit since ``after``."""
    args = f"-u {UNIT} _PID=1 -p {priority} --after-cursor='{after}'"
    return [str(e.get("MESSAGE")) for e in journal_entries(box, args)]


def start_limit_clean(box: nspawn.Container) -> None:
    """The earlier tests restarted often: a clean start-limit counter for this one."""
    box.run(f"systemctl reset-failed {UNIT}", check=False)


# --- 1. a typo, then restart -------------------------------------------------------------------


def test_a_typo_fails_with_78_without_a_retry_and_the_fix_restarts_at_once(
    box: nspawn.Container,
) -> None:
    """`systemctl restart` with a typo: the unit is failed with status 78 and systemd does not
    retry (RestartPreventExitStatus=78): no start-limit hit, NRestarts unchanged past
    RestartSec. Fixed, `check-config` says so and `systemctl restart` works at once, without
    `reset-failed`."""
    configure(box, amd_settings())
    start_limit_clean(box)
    restarts = int(show(box)["NRestarts"])
    box.write(CONFIG, settings_text(**amd_settings()) + "demote_grase = 1\n")
    refused = box.run("hal0-reconciler check-config; echo exit=$?", check=False).stdout
    assert "exit=78" in refused
    box.run(f"systemctl restart {UNIT}", check=False, timeout=60)
    failed = show(box)
    assert ("failed", "78") == (failed["ActiveState"], failed["ExecMainStatus"])
    time.sleep(7)  # past RestartSec=5s: an automatic restart would have happened by now
    later = show(box)
    assert ("failed", restarts) == (later["ActiveState"], int(later["NRestarts"]))
    assert "start-limit-hit" != later["Result"]
    said = journal_entries(box, f"-u {UNIT} -p err -n 50")
    assert any("unknown setting 'demote_grase'" in str(e.get("MESSAGE")) for e in said)
    box.write(CONFIG, settings_text(**amd_settings()))
    assert "valid" in box.run("hal0-reconciler check-config").stdout
    box.run(f"systemctl restart {UNIT}", timeout=60)
    assert "active" == show(box)["ActiveState"]


def test_repeated_typos_never_use_up_the_start_limit(box: nspawn.Container) -> None:
    """Four restarts with a broken file within the interval: each fails once with 78 and none
    is retried, so the fifth start with the fixed file is still allowed."""
    start_limit_clean(box)
    good = settings_text(**amd_settings())
    box.write(CONFIG, good + "[aiter\n")
    for _ in range(4):
        box.run(f"systemctl restart {UNIT}", check=False, timeout=60)
        assert "78" == show(box)["ExecMainStatus"]
    box.write(CONFIG, good)
    box.run(f"systemctl restart {UNIT}", timeout=60)
    assert "active" == show(box)["ActiveState"]


# --- 2. status with a broken file on disk -------------------------------------------------------


def test_status_json_answers_while_the_file_on_disk_is_broken(box: nspawn.Container) -> None:
    """The daemon runs on the settings it read; the file on disk breaks: `status --json` exits
    0 (running), says the state, and names the broken file in `settings_file_error`."""
    configure(box, amd_settings())
    wait_until("healthy", lambda: box.run("hal0-reconciler status", check=False).returncode == 0)
    box.write(CONFIG, settings_text(**amd_settings()) + "probe_timeout = 'soon'\n")
    done = box.run("hal0-reconciler status --json", check=False)
    doc = json.loads(done.stdout)
    assert (0, "running") == (done.returncode, doc["state"])
    assert doc["settings_file_error"].startswith(f"{CONFIG}: setting 'probe_timeout' has a bad")
    text = box.run("hal0-reconciler status", check=False).stdout
    assert "settings file on disk is invalid" in text
    box.write(CONFIG, settings_text(**amd_settings()))


# --- 3. the documented metrics path --------------------------------------------------------------


def test_the_metrics_are_written_at_the_documented_path(box: nspawn.Container) -> None:
    """Debian's node-exporter folder (the example, the man page, the rules, the README) is
    writable under the unit's sandbox: the textfile appears there."""
    box.run(f"mkdir -p {Path(METRICS).parent}")
    configure(box, amd_settings(metrics_textfile=METRICS))
    wait_until(
        "the metrics file", lambda: box.run(f"test -s {METRICS}", check=False).returncode == 0
    )
    text = box.read(METRICS)
    assert re.search(r"^hal0_reconciler_build_info\{", text, re.MULTILINE), text[:500]


# --- 4. /etc/hal0 at 0750: no warning from systemd ------------------------------------------------


def test_etc_hal0_at_0750_gets_no_warning_from_systemd_and_keeps_its_mode(
    box: nspawn.Container,
) -> None:
    """hal0 may keep /etc/hal0 at 0750: a restart logs nothing at warning or above from systemd
    for the unit (the `-p warning` view stays the daemon's own), no line at any priority about
    the folder's mode (ConfigurationDirectory='s check), and the mode stays 0750."""
    box.run("chmod 0750 /etc/hal0")
    after = cursor(box)
    configure(box, amd_settings())
    said = journal_entries(box, f"-u {UNIT} -p warning --after-cursor='{after}'")
    # systemd's own lines (PID 1 and the service's child before exec), not the daemon's
    assert [] == [str(e.get("MESSAGE")) for e in said if e.get("SYSLOG_IDENTIFIER") != UNIT]
    every = journal_entries(box, f"-u {UNIT} --after-cursor='{after}'")  # any priority
    about_mode = [str(e.get("MESSAGE")) for e in every if "mode is different" in str(e)]
    print("systemd about /etc/hal0's mode:", about_mode or "nothing")
    assert [] == about_mode
    assert "750" == box.run("stat -c %a /etc/hal0").stdout.strip()
    box.run("chmod 0755 /etc/hal0")


# --- 5. upgrade, purge, a broken leftover -----------------------------------------------------------


@pytest.fixture(scope="module")
def deb_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This tree rebuilt as ``<version>+upgrade1`` (version and Debian changelog only)."""
    return debs.rebuilt_newer(tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("next"))


def test_an_upgrade_keeps_the_operators_file_and_runs_the_new_version(
    box: nspawn.Container, deb_next: Path
) -> None:
    """apt install of the next version over this one: the service was stopped before the unpack and started
    after (a new pid, the new version), the operator's settings file byte for byte the same,
    no prompt."""
    configure(box, amd_settings())
    before = show(box)["MainPID"]
    mine = box.read(CONFIG)
    mark = cursor(box)
    shutil.copy2(deb_next, box.files / deb_next.name)  # type: ignore[attr-defined]
    box.run(f"apt install -y {FILES}/{deb_next.name}", timeout=180)
    after = show(box)
    assert ("active", True) == (after["ActiveState"], after["MainPID"] not in {before, "0"})
    version = deb_next.name.split("_")[1]
    assert f"hal0-reconciler {version}" == box.run("hal0-reconciler --version").stdout.strip()
    assert mine == box.read(CONFIG)
    prerm = box.read("/var/lib/dpkg/info/hal0-reconciler.prerm")
    assert "deb-systemd-invoke stop" in prerm  # before the unpack, not a restart after it
    said = systemd_said(box, mark)
    stopped = next(i for i, m in enumerate(said) if m.startswith("Stopped"))
    assert any(m.startswith("Started") for m in said[stopped:]), said


def test_purge_removes_the_state_and_an_unchanged_template_only(
    box: nspawn.Container, deb: Path
) -> None:
    """Purge with the shipped template in place: the settings file and the state folder go,
    /etc/hal0 and hal0's files stay. With an edited file, the file stays."""
    box.run(f"cp {TEMPLATE} {CONFIG} && systemctl restart {UNIT}", timeout=60)
    box.run(f"test -d {STATE}")
    box.write("/etc/hal0/slots/keep.toml", 'name = "keep"\n')
    box.run("apt purge -y hal0-reconciler", timeout=180)
    assert 0 != box.run(f"test -e {CONFIG}", check=False).returncode
    assert 0 != box.run(f"test -e {STATE}", check=False).returncode
    box.run("test -f /etc/hal0/slots/keep.toml")
    box.run(f"apt install -y {FILES}/{deb.name}", timeout=180)
    box.run(f"cmp {TEMPLATE} {CONFIG}")
    box.run(f"echo 'demote_grace = 5.0' >> {CONFIG}")
    box.run("apt purge -y hal0-reconciler", timeout=180)
    assert "demote_grace = 5.0" in box.read(CONFIG)


def test_a_broken_leftover_config_makes_the_install_say_so(
    box: nspawn.Container, deb: Path
) -> None:
    """A leftover invalid settings file: the install succeeds (the package is configured) and
    says on the terminal that the service was not started, why, and what to run."""
    box.write(CONFIG, "slot_dir = '/x'\n")
    done = box.run(f"apt install -y {FILES}/{deb.name} 2>&1", timeout=180)
    said = done.stdout
    assert "the service was not started: the settings file is invalid" in said
    assert "unknown setting 'slot_dir'" in said
    assert "hal0-reconciler check-config" in said
    assert "failed" == show(box)["ActiveState"]
    assert "78" == show(box)["ExecMainStatus"]
