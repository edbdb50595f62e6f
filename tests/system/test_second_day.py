"""An operator's second day, judged by the installed unit, systemd 252 and its journal: a
metrics folder missing at the start (said as such, picked up when it appears by a restart into a
sandbox that includes it), the file a clean stop leaves, metrics turned off and the package
removed (its file goes), a deprecated setting warned about at every load, and journal lines
that read plainly. One container for the module (the conftest's ``box``), tests in file order;
the last one removes the package."""

from __future__ import annotations

import time

import pytest

from helpers import nspawn
from system.test_in_systemd import (
    AMD_DIR,
    DEV,
    SLOTS,
    UNIT,
    amd_settings,
    configure,
    journal_entries,
    restart_service,
    settings_text,
    show,
    slot_text,
    wait_until,
)

pytestmark = pytest.mark.timeout(420)

PROM_DIR = "/var/lib/prometheus/node-exporter"
PROM = f"{PROM_DIR}/hal0_reconciler.prom"
RECORD = "/var/lib/hal0-reconciler/metrics-path"
MISSING = "does not exist: install prometheus-node-exporter or create it"
DEPRECATED = (
    "setting 'aiter.heal_shape_keyed' in /etc/hal0/reconciler.toml is deprecated and ignored; "
    "0.4.0 removes it"
)


def _status(box: nspawn.Container) -> tuple[int, str]:
    done = box.run("hal0-reconciler status", check=False)
    return done.returncode, done.stdout


def _gauge(box: nspawn.Container, name: str) -> str | None:
    text = box.run(f"cat {PROM}", check=False).stdout
    for line in text.splitlines():
        if line.startswith(f"hal0_reconciler_{name} "):
            return line.split()[1]
    return None


def _messages(box: nspawn.Container, args: str = "") -> list[str]:
    """The journal's text output of the unit (what `journalctl -u` shows, without the prefix)."""
    out = box.run(f"journalctl --no-pager -o cat -u {UNIT} {args}", check=False).stdout
    return out.splitlines()


def _metrics_settings(**extra: object) -> dict[str, object]:
    return amd_settings(metrics_textfile=PROM, **extra)


def test_a_missing_metrics_folder_is_said_and_picked_up_when_it_appears(
    box: nspawn.Container,
) -> None:
    """No prometheus-node-exporter: degraded with the folder named as missing (not "Read-only
    file system"), no parent made; `mkdir -p` later: the daemon exits 75, systemd restarts it
    into a sandbox that includes the folder, and the file is written. No `systemctl restart`."""
    box.run("rm -rf /var/lib/prometheus")
    configure(box, _metrics_settings())
    code, text = wait_until(
        "degraded with the missing folder",
        lambda: (r := _status(box)) and MISSING in r[1] and r,
    )
    assert 1 == code, text
    assert f"the folder {PROM_DIR} {MISSING}" in text
    assert "Read-only" not in text
    assert "DEGRADED" in show(box)["StatusText"]
    assert 0 != box.run("test -e /var/lib/prometheus", check=False).returncode
    restarts = int(show(box)["NRestarts"])
    since = show(box)["InvocationID"]
    box.run(f"mkdir -p {PROM_DIR}")
    wait_until("the textfile written", lambda: _gauge(box, "running") == "1", 60)
    assert int(show(box)["NRestarts"]) == restarts + 1
    said = journal_entries(box, f"-u {UNIT} _SYSTEMD_INVOCATION_ID={since}")
    assert any(
        f"the metrics folder {PROM_DIR} was created after the start" in str(e.get("MESSAGE"))
        for e in said
    )
    wait_until("healthy", lambda: _status(box)[0] == 0, 30)
    assert f"{PROM}\n" == box.read(RECORD)
    assert box.read(PROM).startswith("# hal0-reconciler metrics textfile")


def test_a_clean_stop_leaves_a_file_that_says_it_stopped(box: nspawn.Container) -> None:
    configure(box, _metrics_settings())
    wait_until("running 1", lambda: _gauge(box, "running") == "1", 30)
    box.run(f"systemctl stop {UNIT}")
    assert "0" == _gauge(box, "running")
    restart_service(box, "start")
    wait_until("running 1 again", lambda: _gauge(box, "running") == "1", 30)


def test_turning_metrics_off_by_a_reload_removes_the_file(box: nspawn.Container) -> None:
    configure(box, _metrics_settings())
    wait_until("running 1", lambda: _gauge(box, "running") == "1", 30)
    box.write("/etc/hal0/reconciler.toml", settings_text(**amd_settings()))
    box.run(f"systemctl reload {UNIT}", timeout=60)
    wait_until("the file removed", lambda: box.run(f"test -e {PROM}", check=False).returncode, 20)
    other = f"{PROM_DIR}/other.prom"
    box.write(other, "# HELP node_other Another textfile.\nnode_other 1\n")
    assert 0 == box.run(f"test -e {other}", check=False).returncode


def test_a_deprecated_setting_warns_at_every_load_and_still_starts(box: nspawn.Container) -> None:
    """0.1.0's `[aiter] heal_shape_keyed`: the service starts (no exit 78), the journal warns
    at the start and at each reload, check-config says so and exits 0."""
    text = settings_text(**amd_settings()) + "[aiter]\nheal_shape_keyed = true\n"
    box.write("/etc/hal0/reconciler.toml", text)
    since = box.run("date +%s").stdout.strip()
    restart_service(box)
    assert "active" == show(box)["ActiveState"]
    box.run(f"systemctl reload {UNIT}", timeout=60)
    warned = [
        m for m in _messages(box, f"-p warning --since @{since}") if m.startswith("settings.")
    ]
    assert 2 == len(warned), warned
    assert all(m.startswith("settings.deprecated message=") and DEPRECATED in m for m in warned)
    checked = box.run("hal0-reconciler check-config", check=False)
    assert 0 == checked.returncode
    assert checked.stdout.startswith("/etc/hal0/reconciler.toml: valid, with 1 deprecated")
    assert DEPRECATED in checked.stdout


def test_journal_lines_read_plainly(box: nspawn.Container) -> None:
    """In `journalctl`'s text output: a reload lists what changed as `a, b` (and says none
    changed as such), a refused file's TOML error keeps its one backslash, a failing lane is
    `unusable` with the time left before demotions, and no line says "unsettled"."""
    configure(box, amd_settings(demote_grace=600.0))
    time.sleep(1.1)  # `--since` counts whole seconds: no line of an earlier test in this one's
    since = box.run("date +%s").stdout.strip()
    box.write("/etc/hal0/reconciler.toml", settings_text(**amd_settings(demote_grace=300.0)))
    box.run(f"systemctl reload {UNIT}", timeout=60)
    box.run(f"systemctl reload {UNIT}", timeout=60)
    box.write("/etc/hal0/reconciler.toml", 'demote_grace = "abc\n')
    box.run(f"systemctl reload {UNIT}", check=False, timeout=60)
    box.write("/etc/hal0/reconciler.toml", settings_text(**amd_settings(demote_grace=300.0)))
    box.run(f"systemctl reload {UNIT}", timeout=60)
    box.run(f"mkdir -p {AMD_DIR} {SLOTS}")
    box.write(f"{SLOTS}/plain.toml", slot_text("plain"))
    box.dev.remove_kfd()  # type: ignore[attr-defined]
    try:
        wait_until(
            "the lane change logged",
            lambda: any("host.rocm_lane_changed" in m for m in _messages(box, f"--since @{since}")),
            30,
        )
    finally:
        box.dev.make_kfd()  # type: ignore[attr-defined]
    wait_until(
        "the lane back",
        lambda: any("new=usable" in m for m in _messages(box, f"--since @{since}")),
        30,
    )
    lines = _messages(box, f"--since @{since}")
    reloaded = [m for m in lines if m.startswith("daemon.reloaded ")]
    assert "daemon.reloaded config=/etc/hal0/reconciler.toml changed=demote_grace" == reloaded[0]
    assert "daemon.reloaded config=/etc/hal0/reconciler.toml changed=none" == reloaded[1]
    refused = [m for m in lines if m.startswith("daemon.reload_failed ")]
    assert 1 == len(refused), refused
    assert "Illegal character '\\n'" in refused[0]
    assert "\\\\" not in refused[0]
    changed = [m for m in lines if m.startswith("host.rocm_lane_changed ")]
    assert changed[0].startswith("host.rocm_lane_changed old=usable new=unusable reason=")
    assert f"{DEV}/kfd" in changed[0]
    assert " demotion_in=300s" in changed[0] or " demotion_in=299s" in changed[0]
    assert changed[-1].startswith("host.rocm_lane_changed old=unusable new=usable reason=")
    assert f"{DEV}/kfd and {DEV}/dri/renderD128 open read-write" in changed[-1]
    assert [] == [m for m in _messages(box) if "unsettled" in m]
    assert [] == [m for m in lines if '["' in m or '[\\"' in m]


def test_a_slot_file_that_cannot_be_judged_is_degraded_in_systemd_and_status(
    box: nspawn.Container,
) -> None:
    """systemd's StatusText (STATUS=) and `status` (exit 1) name the file and why; the unit
    stays active, the watchdog content (no restart); fixed, healthy again."""
    configure(box, amd_settings())
    restarts = int(show(box)["NRestarts"])
    box.write(f"{SLOTS}/broken.toml", 'name = "broken"\ndevice = \n')
    wait_until(
        "degraded in StatusText",
        lambda: (
            f"DEGRADED: slot file {SLOTS}/broken.toml cannot be judged" in show(box)["StatusText"]
        ),
        30,
    )
    code, text = _status(box)
    assert 1 == code
    assert f"problem: slot file {SLOTS}/broken.toml cannot be judged: not valid TOML" in text
    box.run("sleep 35")  # past WatchdogSec=30: degraded keeps pinging
    assert ("active", restarts) == (show(box)["ActiveState"], int(show(box)["NRestarts"]))
    box.write(f"{SLOTS}/broken.toml", slot_text("broken"))
    wait_until("healthy again", lambda: _status(box)[0] == 0, 30)


def test_removing_the_package_removes_its_metrics_file(box: nspawn.Container) -> None:
    """dpkg's remove (the postrm): the file the daemon wrote goes, another textfile stays."""
    configure(box, _metrics_settings())
    wait_until("running 1", lambda: _gauge(box, "running") == "1", 30)
    box.run("apt remove -y hal0-reconciler", timeout=120)
    assert 0 != box.run(f"test -e {PROM}", check=False).returncode
    assert 0 == box.run(f"test -e {PROM_DIR}/other.prom", check=False).returncode
