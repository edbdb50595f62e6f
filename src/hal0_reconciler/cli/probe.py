"""``probe``: the host facts, hal0's facts and the ROCm-lane verdict for the service user."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hal0_reconciler import console, settings
from hal0_reconciler.cli import hostview
from hal0_reconciler.cli.exits import EXIT_ERROR, EXIT_OK, JSON_SCHEMA

if TYPE_CHECKING:
    from hal0_reconciler.host.hal0 import reader as hal0
    from hal0_reconciler.model import HostFacts


def _probe_doc(current: settings.Settings, facts: HostFacts, read: hal0.Hal0Read) -> dict[str, Any]:
    """What `probe` found, as data; the text output is printed from it."""
    doc: dict[str, Any] = {
        "schema": JSON_SCHEMA,
        "amd": facts.amd,
        "amdgpu_module_dir": str(current.amdgpu_module_dir),
        "hal0": {**hostview.hal0_json(read), "sources": dict(sorted(read.facts.sources.items()))},
        "rocm_lane": facts.lane.value if facts.amd else "not-amd",
        "reason": facts.lane_reason if facts.amd else "not an AMD host",
        "service_user": None,
        "failures": [],
    }
    probe = facts.probe
    if probe is not None and probe.credentials is not None:
        c = probe.credentials
        doc["service_user"] = {
            "name": c.user,
            "uid": c.uid,
            "gid": c.gid,
            "groups": c.groups,
            "why": c.why,
        }
    if probe is not None:
        doc["render_node"] = probe.render_node
        doc["failures"] = [
            {"path": f.path, "kind": f.kind.value, "errno": f.errno, "message": f.message}
            for f in probe.failures
        ]
    return doc


def probe(current: settings.Settings, *, as_json: bool = False) -> int:
    from hal0_reconciler.host import facts as host_facts
    from hal0_reconciler.host.hal0 import reader as hal0
    from hal0_reconciler.model import LaneState

    facts = host_facts.gather(current)
    read = hal0.read_facts(current)
    code = EXIT_OK if facts.amd and facts.lane is LaneState.USABLE else EXIT_ERROR
    doc = _probe_doc(current, facts, read)
    if as_json:
        console.dump_json({**doc, "exit_code": code})
        return code
    say, inert = console.say, console.inert  # paths, names and reasons: shown inert
    say(f"AMD host: {'yes' if facts.amd else 'no'} ({inert(current.amdgpu_module_dir)})")
    say("\n".join(hostview.hal0_lines(read)))
    for fact, source in doc["hal0"]["sources"].items():
        say(f"  {inert(fact)}: {inert(source)}")
    if not facts.amd:
        say("ROCm lane: not probed (not an AMD host)")
        return code
    user = doc["service_user"]
    if user is not None:
        groups = ",".join(str(g) for g in user["groups"])
        say(
            f"probed as: {inert(user['name'])} (uid {user['uid']}, gid {user['gid']}, "
            f"groups {groups or '-'})"
        )
        say(f"  why this identity: {inert(user['why'] or 'given')}")
    say(f"ROCm lane: {facts.lane.value}: {inert(facts.lane_reason)}")
    for failure in doc["failures"]:
        errno = failure["errno"]
        errno_text = f" errno {errno}" if errno is not None else ""
        where, message = inert(failure["path"]), inert(failure["message"])
        say(f"  {where}: {failure['kind']}{errno_text}: {message}")
    return code
