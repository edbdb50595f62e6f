"""The probe's pure parts: who the service user is, and what a node's errno means."""

from __future__ import annotations

import errno
import os
import pwd

import pytest

from hal0_reconciler import errors
from hal0_reconciler.host import probe
from hal0_reconciler.model import Credentials, FailureKind, NodeFailure


@pytest.mark.parametrize(
    ("err", "is_char", "expected"),
    [
        pytest.param(None, True, None, id="opened-char-device"),
        pytest.param(errno.ENOENT, None, FailureKind.MISSING, id="enoent"),
        pytest.param(errno.ENXIO, True, FailureKind.MISSING, id="enxio-no-driver"),
        pytest.param(errno.ENODEV, True, FailureKind.MISSING, id="enodev"),
        pytest.param(errno.EACCES, True, FailureKind.PERMISSION, id="eacces"),
        pytest.param(errno.EPERM, True, FailureKind.POLICY, id="eperm-cgroup-or-lsm"),
        pytest.param(errno.EBUSY, True, FailureKind.OTHER, id="other-errno"),
        pytest.param(None, False, FailureKind.NOT_CHAR_DEVICE, id="opened-regular-file"),
        pytest.param(errno.EACCES, False, FailureKind.NOT_CHAR_DEVICE, id="refused-regular-file"),
    ],
)
def test_classify(err, is_char, expected):
    """Each errno (and device type) maps to one failure kind."""
    assert expected == probe.classify(err, is_char)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("54321:54321", Credentials("54321", 54321, 54321, (54321,)), id="uid-gid"),
        pytest.param(
            "54321:54321:54322,54323",
            Credentials("54321", 54321, 54321, (54321, 54322, 54323)),
            id="uid-gid-groups",
        ),
        pytest.param(
            " 54321:100:100,54322 ", Credentials("54321", 54321, 100, (100, 54322)), id="dedupe"
        ),
        pytest.param(
            "54321:54321:", Credentials("54321", 54321, 54321, (54321,)), id="empty-groups"
        ),
    ],
)
def test_numeric_credentials(spec, expected):
    """A numeric spec is taken as given; the primary gid always leads the groups."""
    assert expected == probe.resolve_credentials(spec)


def test_a_user_name_takes_uid_gid_and_groups_from_the_user_database():
    """A name resolves through the user database, with groups from getgrouplist."""
    entry = pwd.getpwuid(0)
    expected_groups = tuple(
        dict.fromkeys([entry.pw_gid, *os.getgrouplist(entry.pw_name, entry.pw_gid)])
    )

    assert Credentials(
        entry.pw_name, 0, entry.pw_gid, expected_groups
    ) == probe.resolve_credentials(entry.pw_name)


def test_a_bare_uid_known_to_the_user_database_takes_its_gid_and_groups():
    """A uid without a gid borrows gid and groups from its user database entry."""
    entry = pwd.getpwuid(0)

    assert probe.resolve_credentials(entry.pw_name) == probe.resolve_credentials("0")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            "hal0-no-such-user",
            "service user 'hal0-no-such-user' does not exist",
            id="unknown-name",
        ),
        pytest.param("", "service user is not set", id="empty"),
        pytest.param(
            "54329",
            "service user uid 54329 has no user database entry: give it as 'uid:gid'",
            id="unknown-bare-uid",
        ),
        pytest.param(
            "4294967295:1",
            "service user '4294967295:1': id 4294967295 is out of range",
            id="uid-minus-one",
        ),
    ],
)
def test_unresolvable_service_users_raise_one_human_line(spec, message):
    """A service user that cannot be resolved raises ProbeFailed naming it."""
    with pytest.raises(errors.ProbeFailed) as caught:
        probe.resolve_credentials(spec)

    assert message == str(caught.value)


CREDS = Credentials("hal0", 54321, 54321, (54321,))
OK = ("/dev/kfd", True, None, "", True)


def test_verdict_takes_the_first_render_node_that_opened():
    """The lane's render node is the first that opened; earlier refusals stay listed."""
    result = probe.verdict(
        credentials=CREDS,
        kfd=OK,
        renders=[
            ("/dev/dri/renderD128", False, errno.EACCES, "Permission denied", True),
            ("/dev/dri/renderD129", True, None, "", True),
            ("/dev/dri/renderD130", True, None, "", True),
        ],
    )

    assert (True, True, "/dev/dri/renderD129") == (result.usable, result.kfd_ok, result.render_node)
    assert (
        NodeFailure(
            "/dev/dri/renderD128", FailureKind.PERMISSION, errno.EACCES, "Permission denied"
        ),
    ) == (result.failures)


def test_verdict_without_kfd_is_unusable_even_with_a_render_node():
    """A render node alone does not make the lane usable."""
    result = probe.verdict(
        credentials=CREDS,
        kfd=("/dev/kfd", False, errno.EPERM, "Operation not permitted", True),
        renders=[("/dev/dri/renderD128", True, None, "", True)],
    )

    assert (False, False, "/dev/dri/renderD128") == (
        result.usable,
        result.kfd_ok,
        result.render_node,
    )
    assert [FailureKind.POLICY] == [f.kind for f in result.failures]


def test_render_nodes_are_in_numeric_order(tmp_path):
    """renderD1000 comes after renderD129, and entries that are not render nodes are ignored."""
    for name in ("renderD1000", "renderD129", "card0", "renderD128"):
        (tmp_path / name).touch()

    nodes, failure = probe.render_nodes(tmp_path)

    assert ([tmp_path / "renderD128", tmp_path / "renderD129", tmp_path / "renderD1000"], None) == (
        nodes,
        failure,
    )
