"""Upgrades as an operator makes them, under the real systemd 252 of Debian 12: the 0.1.0 and
0.2.0 packages built from their recorded commits (0.1.0 = 12f8b41, 0.2.0 = 6aef203, with their
own packaging/build-deb), installed, run until they relabel and demote, then upgraded with
``apt install`` to this tree's package. The settings file stays byte for byte, the demotion
memory carries over (the new daemon puts the demoted slot back when the lane returns), the unit
is active again (stopped before the unpack, started after), an upgrade from 0.1.x says once why
the ``hal0`` account 0.1 declared stays, and the journal has no error. Then a reinstall with a
bad setting prints only the postinst's own explanation.

The old packages are cached under ``HAL0_TEST_CACHE`` (``old-debs/<commit>/``): built once.
Each test boots its own container from the cached Debian 12 root.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import nspawn, rootfs
from helpers.hal0_tree import Hal0Tree
from helpers.nspawn import FILES
from system import conftest as suite
from system import debs
from system.conftest import FakeDev
from system.test_first_day import cursor, systemd_said
from system.test_in_systemd import (
    SLOTS,
    UNIT,
    amd_settings,
    device_of,
    journal_entries,
    settings_text,
    show,
    slot_text,
    wait_until,
)

pytestmark = pytest.mark.timeout(900)

CONFIG = "/etc/hal0/reconciler.toml"
DEMOTIONS = "/var/lib/hal0-reconciler/demotions.json"
SYSUSERS = "/usr/lib/sysusers.d/hal0-reconciler.conf"
DEBHELPER_NOISE = "Could not execute systemctl"
ACCOUNT_NOTE = "the 'hal0' account"


@pytest.fixture(scope="module")
def new_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This tree's package, newer than 0.2.0 to apt (rebuilt as ``+upgrade1`` while the tree
    still says 0.2.0)."""
    return debs.rebuilt_newer(
        tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("newdeb"), above="0.2.0"
    )


@pytest.fixture
def host(tmp_path: Path) -> Iterator[nspawn.Container]:
    """A booted Debian 12 with the fake GPU nodes and an installed hal0 of the ade07ba era (its
    default image is not Vulkan-capable: a gpu-vulkan llama.cpp slot is relabelled); no
    hal0-reconciler yet."""
    root = rootfs.ensure()
    files = tmp_path / "files"
    files.mkdir()
    dev = Path(tempfile.mkdtemp(prefix="hal0-nspawn-dev-"))
    box = nspawn.Container(
        root=root, binds={files: FILES, dev: nspawn.DEV}, log_path=tmp_path / "console.log"
    )
    box.files = files  # type: ignore[attr-defined]
    box.dev = FakeDev(dev)  # type: ignore[attr-defined]
    Hal0Tree(files / "hal0").install("ade07ba")
    try:
        box.boot()
        box.run(f"cp -a {FILES}/hal0/usr/lib/hal0 /usr/lib/hal0")
        yield box
    finally:
        box.shutdown()
        shutil.rmtree(dev, ignore_errors=True)


@pytest.fixture(autouse=True)
def _remember_host(request: pytest.FixtureRequest) -> None:
    """The suite's report hook attaches the journal of a failing test's container (the
    suite's ``_remember_box`` empties its list after each test)."""
    if "host" in request.fixturenames:
        suite._CURRENT.append(request.getfixturevalue("host"))


def apt_install(box: nspawn.Container, deb: Path) -> str:
    """``apt install`` of ``deb`` as an operator runs it; everything it printed."""
    shutil.copy2(deb, box.files / deb.name)  # type: ignore[attr-defined]
    done = box.run(f"apt install -y {FILES}/{deb.name} 2>&1", timeout=240)
    return done.stdout


def run_old_release_until_it_demotes(box: nspawn.Container, version: str) -> str:
    """The old release installed and configured (with 0.1.0's deprecated aiter setting), one
    slot relabelled to gpu-rocm, then the lane lost and a second slot demoted to cpu. The lane
    stays lost. Returns the settings file as written."""
    apt_install(box, debs.old_deb(version))
    assert version == box.run("hal0-reconciler --version").stdout.split()[-1]
    box.run(f"mkdir -p /srv/hal0-amd/amdgpu {SLOTS}")
    mine = settings_text(**amd_settings()) + "\n[aiter]\nheal_shape_keyed = true\n"
    box.write(CONFIG, mine)
    box.run(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}", timeout=60)
    assert "active" == show(box)["ActiveState"]
    box.write(f"{SLOTS}/rocmable.toml", slot_text("rocmable"))
    wait_until("rocmable relabelled", lambda: device_of(box, "rocmable") == "gpu-rocm", 20)
    box.dev.remove_kfd()  # type: ignore[attr-defined]
    box.write(f"{SLOTS}/stranded.toml", slot_text("stranded"))
    wait_until("stranded demoted to cpu", lambda: device_of(box, "stranded") == "cpu", 30)
    wait_until("the demotion recorded", lambda: "stranded" in box.read(DEMOTIONS), 10)
    return mine


def check_upgraded(box: nspawn.Container, said: str, mine: str, mark: str, before: str) -> str:
    """What every upgrade must leave: the new version running in a new process (stopped
    before the unpack, started after), the operator's settings byte for byte, no debhelper
    noise, the demotion memory honoured once the lane returns, and no error in the journal.
    Returns the new daemon's invocation id."""
    version = box.run("dpkg-query -W -f '${Version}' hal0-reconciler").stdout.strip()
    assert f"hal0-reconciler {version}" == box.run("hal0-reconciler --version").stdout.strip()
    after = show(box)
    assert ("active", True) == (after["ActiveState"], after["MainPID"] not in {before, "0"})
    assert mine == box.read(CONFIG)
    assert DEBHELPER_NOISE not in said, said
    assert "the service was not started" not in said, said
    systemd = systemd_said(box, mark)
    stopped = next(i for i, m in enumerate(systemd) if m.startswith("Stopped"))
    assert any(m.startswith("Started") for m in systemd[stopped:]), systemd
    invocation = after["InvocationID"]
    assert "stranded" in box.read(DEMOTIONS)  # the old release's memory, read by the new one
    box.dev.make_kfd()  # type: ignore[attr-defined]
    wait_until("stranded back on gpu-rocm", lambda: device_of(box, "stranded") == "gpu-rocm", 30)
    assert "gpu-rocm" == device_of(box, "rocmable")
    restored = journal_entries(box, f"-u {UNIT} SLOT=stranded _SYSTEMD_INVOCATION_ID={invocation}")
    assert "slot.restored_to_rocm" in {e.get("EVENT") for e in restored}
    errors = journal_entries(box, f"-u {UNIT} -p err _SYSTEMD_INVOCATION_ID={invocation}")
    assert [] == [e.get("MESSAGE") for e in errors]
    warned = journal_entries(box, f"-u {UNIT} -p warning _SYSTEMD_INVOCATION_ID={invocation}")
    # 0.1.0's deprecated setting: accepted, and said (the message or its fields name it)
    assert any("heal_shape_keyed" in str(e) for e in warned), [e.get("MESSAGE") for e in warned]
    status = box.run("hal0-reconciler status --json", check=False)
    assert "running" == json.loads(status.stdout)["state"], status.stdout
    return invocation


def test_an_upgrade_from_0_1_0_keeps_settings_and_demotions_and_explains_the_hal0_account(
    host: nspawn.Container, new_deb: Path
) -> None:
    """0.1.0 declared a ``hal0`` account in sysusers.d (made at its install): after the
    upgrade the declaration is gone with the old package, the account stays (it may be
    hal0's own), and the upgrade says so exactly once, with its uid."""
    mine = run_old_release_until_it_demotes(host, "0.1.0")
    account = host.run("getent passwd hal0").stdout.strip()
    host.run(f"test -f {SYSUSERS}")
    before, mark = show(host)["MainPID"], cursor(host)
    said = apt_install(host, new_deb)
    check_upgraded(host, said, mine, mark, before)
    assert 1 == said.count(ACCOUNT_NOTE), said
    uid = account.split(":")[2]
    assert f"{ACCOUNT_NOTE} (uid {uid})" in said
    assert "is left in place" in said
    assert "it is not removed" in said
    assert account == host.run("getent passwd hal0").stdout.strip()
    assert 0 != host.run(f"test -e {SYSUSERS}", check=False).returncode


def test_an_upgrade_from_0_2_0_keeps_settings_and_demotions_and_says_nothing_of_accounts(
    host: nspawn.Container, new_deb: Path
) -> None:
    """0.2.0 made no account: the upgrade says nothing about one (even with a hal0 account
    present, as hal0's installer makes it)."""
    host.run("useradd --system --home-dir /var/lib/hal0 --shell /usr/sbin/nologin hal0")
    mine = run_old_release_until_it_demotes(host, "0.2.0")
    before, mark = show(host)["MainPID"], cursor(host)
    said = apt_install(host, new_deb)
    check_upgraded(host, said, mine, mark, before)
    assert ACCOUNT_NOTE not in said, said


def test_a_reinstall_with_a_bad_setting_prints_only_the_postinsts_explanation(
    host: nspawn.Container, new_deb: Path
) -> None:
    """A bad setting, then ``apt install --reinstall``: the package is configured, the unit is
    failed with 78 (the start was tried), and the terminal shows the postinst's own
    explanation (the file's problem, what to run) and nothing from deb-systemd-invoke or
    systemctl about the failed start."""
    apt_install(host, new_deb)
    assert "active" == show(host)["ActiveState"]
    host.write(CONFIG, settings_text(**amd_settings()) + "demote_grase = 1\n")
    done = host.run(f"apt install --reinstall -y {FILES}/{new_deb.name} 2>&1", timeout=240)
    said = done.stdout
    assert "the service was not started: the settings file is invalid" in said, said
    assert "unknown setting 'demote_grase'" in said
    assert "'systemctl restart hal0-reconciler'" in said
    assert DEBHELPER_NOISE not in said, said
    assert "Job for hal0-reconciler.service failed" not in said, said
    assert "deb-systemd-invoke" not in said, said
    state = show(host)
    assert ("failed", "78") == (state["ActiveState"], state["ExecMainStatus"])
    status = host.run("dpkg-query -W -f '${db:Status-Abbrev}' hal0-reconciler").stdout
    assert status.startswith("ii"), status
