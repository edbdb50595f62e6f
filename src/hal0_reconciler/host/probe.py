"""The ROCm-lane probe: can the service user really open /dev/kfd and a render node?

Root passes every permission check, so the probe runs the ``open()`` calls in a child process
that starts as root (any interpreter root can execute will do, even one in a root-only
virtualenv), imports everything it needs, then drops to the service user's groups, gid and uid
for good and only then opens each node read-write. The child reports one JSON line; this
module turns it into a ``ProbeResult``. A child that cannot run, times out or prints garbage
gives a ``ProbeResult`` with ``error`` set: the probe never raises for that.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import sys
from typing import TYPE_CHECKING, Any

from hal0_reconciler import errors
from hal0_reconciler.host import proc
from hal0_reconciler.model import Credentials, FailureKind, NodeFailure, ProbeResult

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

_ID_MAX = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel
_NUMERIC_SPEC = re.compile(r"(\d+)(?::(\d+)(?::(\d+(?:,\d+)*)?)?)?")
_MISSING_ERRNOS = frozenset({errno.ENOENT, errno.ENXIO, errno.ENODEV})
_CHILD_ENV = {"LC_ALL": "C"}  # English strerror(); nothing else leaks into the child

CHILD_CODE = r"""
import errno, json, os, signal, stat, sys

def main():
    signal.pthread_sigmask(signal.SIG_SETMASK, ())  # a parent's held signals are not ours
    spec = json.loads(sys.argv[1])
    uid, gid, groups = spec["uid"], spec["gid"], spec["groups"]
    want = set(groups) | {gid}
    same = (
        os.getresuid() == (uid, uid, uid)
        and os.getresgid() == (gid, gid, gid)
        and set(os.getgroups()) | {os.getegid()} == want
    )
    if not same:
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
        except OSError as exc:
            return {"error": "cannot become uid %d gid %d: %s" % (uid, gid, exc.strerror)}
    if (
        os.getresuid() != (uid, uid, uid)
        or os.getresgid() != (gid, gid, gid)
        or set(os.getgroups()) | {os.getegid()} != want
    ):
        return {"error": "credentials did not change to uid %d gid %d" % (uid, gid)}
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            return {"error": "could regain root after dropping to uid %d" % uid}
    nodes = []
    for path in spec["paths"]:
        node = {"path": path, "ok": False, "errno": None, "message": "", "char": None}
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as exc:
            node["errno"], node["message"] = exc.errno, exc.strerror or str(exc)
            try:
                node["char"] = stat.S_ISCHR(os.stat(path).st_mode)
            except OSError:
                pass
        else:
            try:
                node["ok"], node["char"] = True, stat.S_ISCHR(os.fstat(fd).st_mode)
            finally:
                os.close(fd)
        nodes.append(node)
    return {"uid": os.geteuid(), "nodes": nodes}

result = main()
sys.stdout.write(json.dumps(result) + "\n")
sys.stdout.flush()
sys.exit(2 if "error" in result else 0)
"""
"""Runs in the child; everything is imported before the credentials change."""


def resolve_credentials(spec: str) -> Credentials:
    """The service user's uid, primary gid and groups, from a user name or ``uid[:gid[:g,…]]``.

    A name is looked up in the user database (groups from ``os.getgrouplist``); a bare uid
    that the user database knows takes its gid and groups from there. ``groups`` always
    includes the primary gid. Raises ProbeFailed naming the user when it cannot be resolved.
    """
    text = spec.strip()
    if not text:
        raise errors.ProbeFailed("service user is not set")
    numeric = _NUMERIC_SPEC.fullmatch(text)
    if numeric is None:
        try:
            entry = pwd.getpwnam(text)
        except KeyError:
            raise errors.ProbeFailed(f"service user {text!r} does not exist") from None
        return _from_passwd(entry)
    uid = _check_id(numeric.group(1), text)
    if numeric.group(2) is None:
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            raise errors.ProbeFailed(
                f"service user uid {uid} has no user database entry: give it as 'uid:gid'"
            ) from None
        return _from_passwd(entry)
    gid = _check_id(numeric.group(2), text)
    extra = [_check_id(g, text) for g in (numeric.group(3) or "").split(",") if g]
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Credentials(user=name, uid=uid, gid=gid, groups=_dedupe([gid, *extra]))


def probe_rocm_lane(
    *,
    kfd_path: Path,
    dri_dir: Path,
    credentials: Credentials,
    timeout: float,
    interpreter: str | None = None,
) -> ProbeResult:
    """Whether ``credentials`` can open ``kfd_path`` and a ``<dri_dir>/renderD*`` node read-write.

    The opens happen in a child run with ``interpreter`` (default: this one) that drops to
    ``credentials`` first. Never raises for a child that fails; the result carries ``error``.
    """
    renders, enumeration_failure = render_nodes(dri_dir)
    paths = [str(kfd_path), *(str(p) for p in renders)]
    spec = {
        "uid": credentials.uid,
        "gid": credentials.gid,
        "groups": list(credentials.groups),
        "paths": paths,
    }
    argv = [interpreter or sys.executable, "-I", "-c", CHILD_CODE, json.dumps(spec)]
    try:
        done = proc.run(argv, timeout=timeout, env=_CHILD_ENV)
    except errors.ProcFailed as exc:
        return _failed(credentials, f"probe child as {_who(credentials)} did not finish: {exc}")
    report = _parse_report(done.stdout)
    if isinstance(report, str):
        detail = done.failure_line or report
        return _failed(credentials, f"probe child as {_who(credentials)}: {detail}")
    if "error" in report:
        return _failed(credentials, f"probe child as {_who(credentials)}: {report['error']}")
    if report.get("uid") != credentials.uid:
        return _failed(
            credentials, f"probe child reported uid {report.get('uid')!r}, not {_who(credentials)}"
        )
    nodes = _parse_nodes(report, paths)
    if isinstance(nodes, str):
        return _failed(credentials, f"probe child as {_who(credentials)}: {nodes}")
    return verdict(
        credentials=credentials,
        kfd=nodes[0],
        renders=nodes[1:],
        extra_failures=(enumeration_failure,) if enumeration_failure else (),
    )


def render_nodes(dri_dir: Path) -> tuple[list[Path], NodeFailure | None]:
    """The ``renderD*`` entries of ``dri_dir`` in numeric order, or why there are none."""
    pattern = f"{dri_dir}/renderD*"
    try:
        names = [e.name for e in os.scandir(dri_dir) if e.name.startswith("renderD")]
    except (FileNotFoundError, NotADirectoryError):
        return [], NodeFailure(pattern, FailureKind.MISSING, errno.ENOENT, f"no {dri_dir}")
    except OSError as exc:
        return [], NodeFailure(pattern, FailureKind.OTHER, exc.errno, exc.strerror or str(exc))
    if not names:
        return [], NodeFailure(pattern, FailureKind.MISSING, errno.ENOENT, "no render nodes")
    return [dri_dir / n for n in sorted(names, key=lambda n: (len(n), n))], None


NodeReport = tuple[str, bool, int | None, str, bool | None]
"""One node as the child saw it: path, opened, errno, message, is a character device."""


def classify(err: int | None, is_char: bool | None) -> FailureKind | None:
    """Why a node is not usable (None: it is). A node that is not a character device never is."""
    if is_char is False:
        return FailureKind.NOT_CHAR_DEVICE
    if err is None:
        return None
    if err in _MISSING_ERRNOS:
        return FailureKind.MISSING
    if err == errno.EACCES:
        return FailureKind.PERMISSION
    if err == errno.EPERM:
        return FailureKind.POLICY
    return FailureKind.OTHER


def verdict(
    *,
    credentials: Credentials,
    kfd: NodeReport,
    renders: Sequence[NodeReport],
    extra_failures: Sequence[NodeFailure] = (),
) -> ProbeResult:
    """The lane verdict from the child's reports: usable when kfd and one render node opened.

    Every node that did not open is listed in ``failures``, even when the lane is usable.
    """
    failures: list[NodeFailure] = []
    kfd_ok = _opened(kfd, failures)
    render_node: str | None = None
    for report in renders:
        if _opened(report, failures) and render_node is None:
            render_node = report[0]
    failures.extend(extra_failures)
    return ProbeResult(
        usable=kfd_ok and render_node is not None,
        credentials=credentials,
        kfd_ok=kfd_ok,
        render_node=render_node,
        failures=tuple(failures),
        kfd_path=kfd[0],
    )


def _opened(report: NodeReport, failures: list[NodeFailure]) -> bool:
    """True when the node opened as a character device; else append why it did not."""
    path, opened, err, message, is_char = report
    kind = classify(err, is_char)
    if kind is None and opened:
        return True
    kind = kind or FailureKind.OTHER
    text = "not a character device" if kind is FailureKind.NOT_CHAR_DEVICE else message
    failures.append(NodeFailure(path, kind, err, text or kind.value))
    return False


def _parse_report(stdout: bytes) -> dict[str, Any] | str:
    lines = stdout.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        return "printed nothing"
    try:
        report = json.loads(lines[-1])
    except ValueError:
        return f"printed something that is not a report: {lines[-1][:80]!r}"
    if not isinstance(report, dict):
        return f"printed something that is not a report: {lines[-1][:80]!r}"
    return report


def _parse_nodes(report: Mapping[str, Any], paths: Sequence[str]) -> list[NodeReport] | str:
    raw = report.get("nodes")
    if not isinstance(raw, list) or len(raw) != len(paths):
        return "report does not cover the nodes asked for"
    nodes: list[NodeReport] = []
    for want, item in zip(paths, raw, strict=True):
        if not (
            isinstance(item, dict)
            and item.get("path") == want
            and isinstance(item.get("ok"), bool)
            and (item.get("errno") is None or type(item.get("errno")) is int)
            and isinstance(item.get("message"), str)
            and (item.get("char") is None or isinstance(item.get("char"), bool))
        ):
            return f"report for {want} is malformed"
        nodes.append((want, item["ok"], item["errno"], item["message"], item["char"]))
    return nodes


def _failed(credentials: Credentials, error: str) -> ProbeResult:
    return ProbeResult(
        usable=False, credentials=credentials, kfd_ok=False, render_node=None, error=error
    )


def _who(credentials: Credentials) -> str:
    return f"{credentials.user} (uid {credentials.uid})"


def _from_passwd(entry: pwd.struct_passwd) -> Credentials:
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return Credentials(
        user=entry.pw_name,
        uid=entry.pw_uid,
        gid=entry.pw_gid,
        groups=_dedupe([entry.pw_gid, *groups]),
    )


def _check_id(text: str, spec: str) -> int:
    value = int(text)
    if value > _ID_MAX:
        raise errors.ProbeFailed(f"service user {spec!r}: id {value} is out of range")
    return value


def _dedupe(ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(ids))
