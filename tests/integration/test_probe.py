"""The ROCm-lane probe opens real device nodes as the service user, never as root."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from hal0_reconciler.host import probe
from hal0_reconciler.model import FailureKind, NodeFailure, ProbeResult
from helpers import devnodes
from helpers.devnodes import RENDER_GID, SERVICE_UID, DevTree

pytestmark = [devnodes.requires_root, pytest.mark.timeout(30)]

WITHOUT_GROUP = f"{SERVICE_UID}:{SERVICE_UID}"
WITH_GROUP = f"{SERVICE_UID}:{SERVICE_UID}:{RENDER_GID}"


@pytest.fixture
def dev():
    with devnodes.dev_tree() as tree:
        yield tree


def run_probe(dev: DevTree, spec: str, **kwargs) -> ProbeResult:
    return probe.probe_rocm_lane(
        kfd_path=dev.kfd,
        dri_dir=dev.dri,
        credentials=probe.resolve_credentials(spec),
        timeout=kwargs.pop("timeout", 10.0),
        **kwargs,
    )


def kinds(result: ProbeResult) -> dict[str, FailureKind]:
    return {f.path: f.kind for f in result.failures}


def open_fds() -> set[str]:
    return {p.name for p in Path("/proc/self/fd").iterdir()}


def test_world_accessible_nodes_make_the_lane_usable(dev):
    """kfd and a render node that anyone may open read-write make the lane usable."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o666)

    result = run_probe(dev, WITHOUT_GROUP)

    assert (True, True, str(dev.render(128)), (), None) == (
        result.usable,
        result.kfd_ok,
        result.render_node,
        result.failures,
        result.error,
    )


def test_group_owned_kfd_without_the_group_is_a_permission_failure_naming_kfd(dev):
    """kfd owned by the render group with mode 0660 is refused to a user outside that group."""
    devnodes.char_node(dev.kfd, mode=0o660, gid=RENDER_GID)
    devnodes.char_node(dev.render(128), mode=0o666)

    result = run_probe(dev, WITHOUT_GROUP)

    assert (False, False) == (result.usable, result.kfd_ok)
    assert [
        NodeFailure(str(dev.kfd), FailureKind.PERMISSION, errno.EACCES, "Permission denied")
    ] == list(result.failures)
    assert str(dev.kfd) in result.reason


def test_group_owned_kfd_with_the_supplementary_group_is_usable(dev):
    """The same 0660 group-owned kfd opens when the service user has the group as a supplementary group."""
    devnodes.char_node(dev.kfd, mode=0o660, gid=RENDER_GID)
    devnodes.char_node(dev.render(128), mode=0o660, gid=RENDER_GID)

    result = run_probe(dev, WITH_GROUP)

    assert (True, str(dev.render(128)), ()) == (result.usable, result.render_node, result.failures)


def test_owner_only_nodes_are_refused_although_the_caller_is_root(dev):
    """Root could open 0600 root-owned nodes; the service user cannot, so the lane is unusable."""
    devnodes.char_node(dev.kfd, mode=0o600)
    devnodes.char_node(dev.render(128), mode=0o600)

    result = run_probe(dev, WITH_GROUP)

    assert {
        str(dev.kfd): FailureKind.PERMISSION,
        str(dev.render(128)): FailureKind.PERMISSION,
    } == kinds(result)
    assert False is result.usable


def test_missing_kfd_is_a_missing_failure(dev):
    """No kfd node at all is reported as missing (ENOENT), not as a permission problem."""
    devnodes.char_node(dev.render(128), mode=0o666)

    result = run_probe(dev, WITHOUT_GROUP)

    assert (False, False, str(dev.render(128))) == (
        result.usable,
        result.kfd_ok,
        result.render_node,
    )
    assert [
        NodeFailure(str(dev.kfd), FailureKind.MISSING, errno.ENOENT, "No such file or directory")
    ] == list(result.failures)


def test_kfd_node_without_a_driver_is_a_missing_failure(dev):
    """A kfd node whose device number has no driver (ENXIO, as in containers) counts as missing."""
    major = devnodes.unregistered_char_major()
    devnodes.char_node(dev.kfd, mode=0o666, device=os.makedev(major, 0))
    devnodes.char_node(dev.render(128), mode=0o666)

    result = run_probe(dev, WITHOUT_GROUP)

    assert [(str(dev.kfd), FailureKind.MISSING, errno.ENXIO)] == [
        (f.path, f.kind, f.errno) for f in result.failures
    ]


def test_a_regular_file_named_like_a_render_node_is_not_a_char_device(dev):
    """A writable regular file called renderD128 opens, but is no device: the lane is unusable."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.regular_file(dev.render(128), mode=0o666)

    result = run_probe(dev, WITHOUT_GROUP)

    assert (False, True, None) == (result.usable, result.kfd_ok, result.render_node)
    assert {str(dev.render(128)): FailureKind.NOT_CHAR_DEVICE} == kinds(result)


def test_a_regular_file_named_kfd_is_not_a_char_device(dev):
    """A regular file at the kfd path is never taken for the device, even when it opens."""
    devnodes.regular_file(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o666)

    result = run_probe(dev, WITHOUT_GROUP)

    assert {str(dev.kfd): FailureKind.NOT_CHAR_DEVICE} == kinds(result)
    assert False is result.kfd_ok


def test_no_render_nodes_is_a_missing_failure_for_the_pattern(dev):
    """An empty dri directory gives a missing failure for <dri_dir>/renderD*."""
    devnodes.char_node(dev.kfd, mode=0o666)
    (dev.dri / "card0").touch()

    result = run_probe(dev, WITHOUT_GROUP)

    assert (False, True) == (result.usable, result.kfd_ok)
    assert {f"{dev.dri}/renderD*": FailureKind.MISSING} == kinds(result)


def test_missing_dri_directory_is_a_missing_failure_for_the_pattern(dev):
    """No dri directory at all gives the same missing failure for <dri_dir>/renderD*."""
    devnodes.char_node(dev.kfd, mode=0o666)
    dev.dri.rmdir()

    result = run_probe(dev, WITHOUT_GROUP)

    assert {f"{dev.dri}/renderD*": FailureKind.MISSING} == kinds(result)
    assert False is result.usable


def test_kfd_usable_but_render_node_refused_is_unusable_naming_the_render_node(dev):
    """When kfd opens but the only render node does not, the failure names the render node."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o660, gid=RENDER_GID)

    result = run_probe(dev, WITHOUT_GROUP)

    assert (False, True, None) == (result.usable, result.kfd_ok, result.render_node)
    assert {str(dev.render(128)): FailureKind.PERMISSION} == kinds(result)
    assert str(dev.render(128)) in result.reason


def test_second_render_node_that_opens_makes_the_lane_usable(dev):
    """Render nodes are tried in order; the first that opens is the lane's node."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o600)
    devnodes.char_node(dev.render(129), mode=0o666)

    result = run_probe(dev, WITHOUT_GROUP)

    assert (True, str(dev.render(129))) == (result.usable, result.render_node)
    assert {str(dev.render(128)): FailureKind.PERMISSION} == kinds(result)


def test_a_real_system_user_gets_its_supplementary_groups_from_the_user_database(dev):
    """A service user named in the user database is probed with the groups useradd gave it."""
    with devnodes.system_group() as (group, gid), devnodes.system_user((group,)) as user:
        devnodes.char_node(dev.kfd, mode=0o660, gid=gid)
        devnodes.char_node(dev.render(128), mode=0o660, gid=gid)
        credentials = probe.resolve_credentials(user)

        result = probe.probe_rocm_lane(
            kfd_path=dev.kfd, dri_dir=dev.dri, credentials=credentials, timeout=10.0
        )

        assert gid in credentials.groups
        assert (True, str(dev.render(128))) == (result.usable, result.render_node)


def test_a_real_system_user_outside_the_render_group_is_refused(dev):
    """The same nodes refuse a real system user that useradd did not put in the render group."""
    with devnodes.system_group() as (_, gid), devnodes.system_user() as user:
        devnodes.char_node(dev.kfd, mode=0o660, gid=gid)
        devnodes.char_node(dev.render(128), mode=0o660, gid=gid)

        result = run_probe(dev, user)

        assert {
            str(dev.kfd): FailureKind.PERMISSION,
            str(dev.render(128)): FailureKind.PERMISSION,
        } == kinds(result)


@pytest.mark.timeout(120)
def test_an_interpreter_the_service_user_cannot_execute_still_gives_true_verdicts(dev, tmp_path):
    """The child starts as root, so a root-only venv interpreter still probes as the service user."""
    python = devnodes.root_only_venv(tmp_path)
    assert False is devnodes.can_exec_as(SERVICE_UID, SERVICE_UID, python)
    devnodes.char_node(dev.kfd, mode=0o660, gid=RENDER_GID)
    devnodes.char_node(dev.render(128), mode=0o666)

    allowed = run_probe(dev, WITH_GROUP, interpreter=str(python))
    refused = run_probe(dev, WITHOUT_GROUP, interpreter=str(python))

    assert (True, None) == (allowed.usable, allowed.error)
    assert {str(dev.kfd): FailureKind.PERMISSION} == kinds(refused)


def test_a_hanging_child_is_killed_and_reaped_within_the_timeout(dev, tmp_path):
    """A child that never answers gives an error result soon after the timeout, with nothing left running."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o666)
    pidfile = tmp_path / "sleeper.pid"
    hang = devnodes.script(tmp_path / "hang", f"sleep 60 &\necho $! > {pidfile}\nwait\n")
    fds_before = open_fds()

    started = time.monotonic()
    result = run_probe(dev, WITHOUT_GROUP, interpreter=str(hang), timeout=1.0)
    elapsed = time.monotonic() - started

    assert (False, None) == (result.usable, result.render_node)
    assert result.error is not None
    assert "timed out after 1.0s" in result.error
    assert elapsed < 10  # not the sleeper's 60 s: generous for a loaded machine
    assert [] == psutil.Process().children(recursive=True)
    assert True is devnodes.dies_within(int(pidfile.read_text()), 10.0)
    assert fds_before == open_fds()


def test_a_child_that_prints_garbage_gives_an_error_result(dev, tmp_path):
    """Output that is not the child's JSON report is an error result, not an exception."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o666)
    liar = devnodes.script(tmp_path / "liar", 'echo "all good, trust me"\n')

    result = run_probe(dev, WITHOUT_GROUP, interpreter=str(liar))

    assert (False, False) == (result.usable, result.kfd_ok)
    assert result.error is not None
    assert "all good, trust me" in result.error


def forged_report(uid: int, paths: list[Path]) -> str:
    nodes = [
        {"path": str(p), "ok": True, "errno": None, "message": "", "char": True} for p in paths
    ]
    return f"echo '{json.dumps({'uid': uid, 'nodes': nodes})}'\n"


def test_a_report_for_other_nodes_than_asked_is_an_error_result(dev, tmp_path):
    """A well-formed report that does not cover the nodes asked for is not believed."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o666)
    forged = devnodes.script(
        tmp_path / "forged", forged_report(SERVICE_UID, [Path("/dev/null"), Path("/dev/null")])
    )

    result = run_probe(dev, WITHOUT_GROUP, interpreter=str(forged))

    assert (False, f"probe child as 54321 (uid 54321): report for {dev.kfd} is malformed") == (
        result.usable,
        result.error,
    )


def test_a_report_from_a_child_that_kept_another_uid_is_an_error_result(dev, tmp_path):
    """A report whose child did not end up as the service user (e.g. still root) is not believed."""
    devnodes.char_node(dev.kfd, mode=0o600)
    devnodes.char_node(dev.render(128), mode=0o600)
    as_root = devnodes.script(tmp_path / "as-root", forged_report(0, [dev.kfd, dev.render(128)]))

    result = run_probe(dev, WITHOUT_GROUP, interpreter=str(as_root))

    assert (False, "probe child reported uid 0, not 54321 (uid 54321)") == (
        result.usable,
        result.error,
    )


def test_a_failing_child_gives_an_error_result_with_its_last_stderr_line(dev, tmp_path):
    """A child that dies without a report is an error result quoting what it said on stderr."""
    devnodes.char_node(dev.kfd, mode=0o666)
    crash = devnodes.script(tmp_path / "crash", "echo 'Fatal Python error: boom' >&2\nexit 1\n")

    result = run_probe(dev, WITHOUT_GROUP, interpreter=str(crash))

    assert result.error is not None
    assert "exited with status 1: Fatal Python error: boom" in result.error


def test_a_missing_interpreter_gives_an_error_result(dev):
    """An interpreter path that does not exist is an error result naming it, never an exception."""
    result = run_probe(dev, WITHOUT_GROUP, interpreter="/nonexistent/python3")

    assert result.error is not None
    assert "python3" in result.error
    assert "not found" in result.error


def test_the_probe_leaks_no_file_descriptor_and_no_child(dev):
    """After a probe the caller holds the same descriptors and has no child process."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o666)
    before = open_fds()

    for _ in range(3):
        run_probe(dev, WITHOUT_GROUP)

    assert before == open_fds()
    assert [] == psutil.Process().children(recursive=True)


UNPRIVILEGED_CALLER = """
import json, sys
from pathlib import Path
from hal0_reconciler.host import probe
kfd, dri, spec = sys.argv[1:4]
r = probe.probe_rocm_lane(kfd_path=Path(kfd), dri_dir=Path(dri),
                          credentials=probe.resolve_credentials(spec), timeout=10.0)
print(json.dumps({"usable": r.usable, "error": r.error,
                  "failures": [[f.path, f.kind.value] for f in r.failures]}))
"""


def run_as_unprivileged_caller(dev: DevTree, spec: str) -> dict[str, object]:
    system_python = Path("/usr/bin/python3.11")
    if not system_python.exists():
        pytest.skip("no world-executable /usr/bin/python3.11 to run an unprivileged caller")
    src = Path(probe.__file__).resolve().parents[2]
    done = subprocess.run(
        [str(system_python), "-c", UNPRIVILEGED_CALLER, str(dev.kfd), str(dev.dri), spec],
        user=SERVICE_UID,
        group=SERVICE_UID,
        extra_groups=[RENDER_GID],
        env={"PYTHONPATH": str(src), "LC_ALL": "C"},
        capture_output=True,
        check=True,
        timeout=30,
    )
    return json.loads(done.stdout)


def test_an_unprivileged_caller_probing_as_itself_needs_no_credential_switch(dev):
    """A caller that already is the service user (same uid, gid, groups) probes without root."""
    devnodes.char_node(dev.kfd, mode=0o660, gid=RENDER_GID)
    devnodes.char_node(dev.render(128), mode=0o600)
    devnodes.char_node(dev.render(129), mode=0o660, gid=RENDER_GID)

    report = run_as_unprivileged_caller(dev, WITH_GROUP)

    assert {
        "usable": True,
        "error": None,
        "failures": [[str(dev.render(128)), "permission"]],
    } == report


def test_an_unprivileged_caller_cannot_probe_as_someone_else(dev):
    """Without root the child cannot change credentials, and says so instead of probing as itself."""
    devnodes.char_node(dev.kfd, mode=0o666)
    devnodes.char_node(dev.render(128), mode=0o666)

    report = run_as_unprivileged_caller(dev, "54329:54329")

    assert False is report["usable"]
    assert isinstance(report["error"], str)
    assert "cannot become uid 54329" in report["error"]
