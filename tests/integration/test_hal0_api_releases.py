"""The daemon's restart path against hal0's real API, every published release.

Each release's own ``hal0 serve`` runs once per module and auth mode (``helpers.hal0_real_api``:
its own ``HAL0_HOME``, a private ``/etc``, ``systemctl``/``podman`` stubs that fail). The daemon's
real code talks to it: ``Hal0Client`` (the peer check before any byte, the bearer key from
api.env, ``X-hal0-Agent``/``X-Request-ID``) and ``RestartFlow.step`` (update jobs, health, the
idle check, the POST, hal0's answer). Without a running model server the real hal0 shows:
a slot with no model stays ``offline`` (a restart answers 200 ``offline``); a slot with a model
ends in ``error`` when loaded (no systemd or manifest here), and its restart answers 500. A slot
really serving, and a slow load, are shown by the stand-in (``test_hal0_api_stand_in.py``).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hal0_reconciler.host.restarts import api as hal0_api
from hal0_reconciler.host.restarts import flow as restart_flow
from hal0_reconciler.host.restarts.flow import RestartRequest, RestartResult
from hal0_reconciler.settings import Settings
from helpers import hal0_real_api
from helpers.hal0_real_api import RELEASES, RealHal0Api

pytestmark = pytest.mark.timeout(300)

KEY = "k3y-for-tests"
CLIENT_KEY = "client-k3y"
NO_AUTH = frozenset({"0.9.8"})  # 0.9.8 has no api/auth.py: nothing is ever refused
# From 1.6.0 hal0 marks a job file it has not run itself (left by an earlier hal0-api) failed,
# ``api_restarted``, when its status is asked; earlier releases serve it as it is.
MARKS_FOREIGN_JOBS = frozenset(RELEASES[RELEASES.index("1.6.0") :])
PINS_ERA = frozenset(RELEASES[RELEASES.index("1.4.0") :])  # a load without a manifest: 500 pins
NO_MODEL = 'name = "{name}"\ntype = "llm"\ndevice = "gpu-vulkan"\nport = {port}\n'
WITH_MODEL = NO_MODEL.replace("gpu-vulkan", "cpu") + '\n[model]\ndefault = "m"\n'
OPEN, CLIENT, ADMIN = "open", "client", "admin"

# What the reconciler relies on, per route: the release's OpenAPI must hold it with these
# response codes, and the keyed server must treat it as this class (open: 200 without a key;
# client: 401 without a key, 200 with the client key; admin: 401 without, 403 with the client
# key). The same in every release from 1.0.0a2; 0.9.8 has the routes and no auth.
ROUTES = (
    ("GET", "/api/health", "hal0-api is up; the running version", ("200",), OPEN),
    ("GET", "/api/slots", "the slot list", ("200",), CLIENT),
    ("GET", "/api/slots/{name}", "hal0's message for a slot in error", ("200", "422"), ADMIN),
    ("GET", "/api/slots/{name}/state", "the idle check: state", ("200", "422"), ADMIN),
    ("GET", "/api/slots/metrics", "the idle check: load counters", ("200",), ADMIN),
    ("POST", "/api/slots/{name}/restart", "the restart", ("200", "422"), ADMIN),
    ("GET", "/api/updates/state", "update state (no progress flag)", ("200",), ADMIN),
    ("GET", "/api/updates/status/{job_id}", "an update job (mirrored to a file)", ("200", "422"), ADMIN),
    ("POST", "/api/updates/apply", "starts an update job", ("202",), ADMIN),
)  # fmt: skip


def _started(version: str, *, admin_key: str | None) -> Iterator[RealHal0Api]:
    hal0_real_api.skip_or_fail(version)
    home = Path(tempfile.mkdtemp(prefix=f"hal0-api-{version}-"))
    extra = {"HAL0_CLIENT_KEY": CLIENT_KEY} if admin_key else {}
    api = RealHal0Api(version, home, admin_key=admin_key, env=extra)
    api.slots.mkdir(parents=True)
    api.write_slot("agent", NO_MODEL.format(name="agent", port=18091))
    api.write_slot("coder", WITH_MODEL.format(name="coder", port=18092))
    api.write_slot("retired", WITH_MODEL.format(name="retired", port=18093))
    with api:
        yield api


@pytest.fixture(scope="module", params=RELEASES)
def open_api(request: pytest.FixtureRequest) -> Iterator[RealHal0Api]:
    """The release's hal0-api as installed by default: no key, enforcement off."""
    yield from _started(request.param, admin_key=None)


@pytest.fixture(scope="module", params=RELEASES)
def keyed_api(request: pytest.FixtureRequest) -> Iterator[RealHal0Api]:
    """HAL0_ADMIN_KEY (and a client key) set, HAL0_REQUIRE_AUTH=1."""
    yield from _started(request.param, admin_key=KEY)


@pytest.fixture
def daemon_settings(make_settings, tmp_path: Path) -> Callable[..., Settings]:  # type: ignore[no-untyped-def]
    """The daemon's settings pointed at a real hal0: its URL, its update-jobs folder, an
    api.env holding ``key`` (none: no file)."""

    def make(api: RealHal0Api, *, key: str | None = None, **extra: object) -> Settings:
        env = tmp_path / "api.env"
        if key is not None:
            env.write_text(f"# hal0 api\nHAL0_ADMIN_KEY={key}\n")
        values: dict[str, object] = {
            "api_url": api.url,
            "api_env_file": str(env),
            "update_jobs_dir": str(api.home / "var-lib/hal0/update-jobs"),
            "hal0_api_user": "54321",  # root (hal0 runs as root here) and this uid are trusted
            "api_timeout": 20,
            "restart_timeout": 120,
            "idle_confirm": 0.2,
            "idle_recheck": 0.1,
        }
        return make_settings(**(values | extra))

    return make


def _step(settings: Settings, name: str, **request: bool) -> RestartResult | restart_flow.Later:
    flow = restart_flow.RestartFlow(settings)
    return flow.step(RestartRequest(name=name, token=name, **request), active=True, now=0.0)


def _errored(api: RealHal0Api, name: str) -> None:
    """Put a slot with a model in hal0's ``error`` state: its load fails here."""
    reply = api.request("POST", f"/api/slots/{name}/load", key=api.admin_key)
    assert reply.status == 500, reply
    assert (
        api.request("GET", f"/api/slots/{name}/state", key=api.admin_key).body["state"] == "error"
    )


def _posts(api: RealHal0Api) -> list[str]:
    return [line for line in api.access_log() if line.startswith("POST ")]


# -- the restart path, no key (hal0's default) ---------------------------------------------------


def test_health_answers_the_running_release_through_the_peer_check(
    open_api, daemon_settings
) -> None:
    """The daemon's client, its peer check passed (hal0 runs as root), reads /api/health."""
    client = hal0_api.Hal0Client(daemon_settings(open_api))
    try:
        body = client.get("/api/health").body
    finally:
        client.close()
    assert {"status": "ok", "name": "hal0", "version": open_api.version} == body


def test_an_offline_slot_is_left_for_its_next_load_without_a_post(
    open_api, daemon_settings
) -> None:
    """state offline: applies at the next load; hal0 saw health, state, metrics, and no POST."""
    before = len(open_api.access_log())
    with capture_logs() as logs:
        result = _step(daemon_settings(open_api), "agent")
    assert RestartResult.NEXT_LOAD == result
    seen = open_api.access_log()[before:]
    assert [
        "GET /api/health 200",
        "GET /api/slots/agent/state 200",
        "GET /api/slots/metrics 200",
    ] == seen
    assert any(e["event"] == "unit.restart_skipped_offline" for e in logs)


def test_a_slot_in_error_is_restarted_and_hal0s_failure_is_reported(
    open_api, daemon_settings
) -> None:
    """state error: restarted at once (nothing is served); hal0's 500 is a failed restart
    naming hal0's code, and hal0's activity log names the reconciler and the request id."""
    _errored(open_api, "coder")
    settings = daemon_settings(open_api)
    flow = restart_flow.RestartFlow(settings)
    with capture_logs() as logs:
        result = flow.step(RestartRequest(name="coder", token="coder"), active=True, now=0.0)
    assert RestartResult.FAILED == result
    assert "POST /api/slots/coder/restart 500" in _posts(open_api)
    failure = flow.report.failures["coder"]
    if open_api.version in PINS_ERA:  # no manifest here: hal0 names the cause in the code
        code, cause = "runners.pins_invalid", "manifest.json not found"
    else:  # a bare 500: only the slot's message says what failed
        code, cause = "system.internal", "'daemon-reload']' returned non-zero exit status 1"
    said, _, slot_message = failure.partition("; slot: ")
    assert said.startswith(f"hal0 API answered 500 {code}")
    assert cause in slot_message, "hal0's message for the slot is part of the failure"
    started = next(e for e in logs if e["event"] == "unit.restart_started")
    records = open_api.request("GET", "/api/activity?limit=20").body["records"]
    restart = next(
        r for r in records if r.get("action") == "slot.restart" and r["target"] == "coder"
    )
    assert ("mcp:hal0-reconciler", started["request_id"]) == (
        restart["actor"],
        restart["request_id"],
    )
    assert restart["outcome"] != "ok"


def test_a_restart_hal0_answers_offline_applies_at_the_next_load(open_api, daemon_settings) -> None:
    """A slot in error whose model was removed: hal0's restart answers 200 ``offline`` and the
    daemon reads that answer's state (no second look)."""
    _errored(open_api, "retired")
    open_api.write_slot("retired", NO_MODEL.format(name="retired", port=18093))
    with capture_logs() as logs:
        result = _step(daemon_settings(open_api), "retired")
    assert RestartResult.NEXT_LOAD == result
    assert "POST /api/slots/retired/restart 200" in _posts(open_api)
    assert any(e["event"] == "unit.restart_left_offline" for e in logs)


def test_an_unknown_slot_fails_with_hal0s_not_found(open_api, daemon_settings) -> None:
    settings = daemon_settings(open_api)
    flow = restart_flow.RestartFlow(settings)
    result = flow.step(RestartRequest(name="nosuch", token="nosuch"), active=True, now=0.0)
    assert RestartResult.FAILED == result
    expected = "hal0 API answered 404 slot.not_found: slot 'nosuch' is not configured"
    assert expected == flow.report.failures["nosuch"]


def test_a_running_update_job_file_hal0_serves_holds_the_restart(open_api, daemon_settings) -> None:
    """The job file the daemon reads is the one hal0 serves as that job's status: queued or
    running holds every restart before any request; finished, the restart goes on."""
    jobs = open_api.home / "var-lib/hal0/update-jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    job_id = f"{int(time.time() * 1000) % 16**12:012x}"
    job = jobs / f"{job_id}.json"
    job.write_text(json.dumps({"id": job_id, "state": "running", "phase": "download"}))
    before = len(open_api.access_log())
    result = _step(daemon_settings(open_api), "agent")
    assert isinstance(result, restart_flow.Later)
    assert f"hal0 update {job_id} in progress" == result.reason
    assert [] == open_api.access_log()[before:], "nothing is asked of hal0 during an update"
    served = open_api.request("GET", f"/api/updates/status/{job_id}")
    assert (200, job_id) == (served.status, served.body["id"]), "hal0 serves that very file"
    on_disk = json.loads(job.read_text())
    if open_api.version in MARKS_FOREIGN_JOBS:  # not this hal0-api's job: marked interrupted
        assert ("failed", "api_restarted") == (on_disk["state"], on_disk.get("error_code"))
    else:
        assert "running" == on_disk["state"] == served.body["state"]
        job.write_text(json.dumps({"id": job_id, "state": "applied", "phase": "done"}))
    assert RestartResult.NEXT_LOAD == _step(daemon_settings(open_api), "agent")


def test_hal0_refuses_connections_while_it_boots(open_api) -> None:
    """Until it serves, every connection to hal0-api is refused (what the daemon reads as
    "hal0-api is starting": wait, never stop a slot); never an HTTP error or a silent socket."""
    assert open_api.boot_errors, "the first look came after the boot"
    assert {"ConnectionRefusedError"} == set(open_api.boot_errors)


# -- with an admin key (HAL0_ADMIN_KEY, require_auth on) -----------------------------------------


def test_health_needs_no_key(keyed_api, daemon_settings) -> None:
    client = hal0_api.Hal0Client(daemon_settings(keyed_api))
    try:
        assert keyed_api.version == client.get("/api/health").body["version"]
    finally:
        client.close()


def test_with_the_key_from_api_env_the_restart_reaches_hal0(keyed_api, daemon_settings) -> None:
    """The bearer key from api.env is accepted: the POST reaches the slot manager (hal0's
    own 500 from the failing load, not 401)."""
    _errored(keyed_api, "coder")
    flow = restart_flow.RestartFlow(daemon_settings(keyed_api, key=KEY))
    result = flow.step(RestartRequest(name="coder", token="coder"), active=True, now=0.0)
    assert RestartResult.FAILED == result
    assert "POST /api/slots/coder/restart 500" in _posts(keyed_api)
    assert "answered 500" in flow.report.failures["coder"]


@pytest.mark.parametrize("key", [None, "wrong"], ids=["no-key", "wrong-key"])
def test_without_the_right_key_hal0_refuses_and_nothing_is_posted(
    keyed_api, daemon_settings, key: str | None
) -> None:
    """No key or a wrong one: 401 auth.required at the first look (the state), a failed
    restart naming hal0's error, no POST. 0.9.8 has no auth: the look succeeds."""
    before = len(_posts(keyed_api))
    flow = restart_flow.RestartFlow(daemon_settings(keyed_api, key=key))
    result = flow.step(RestartRequest(name="agent", token="agent"), active=True, now=0.0)
    assert before == len(_posts(keyed_api))
    if keyed_api.version in NO_AUTH:
        assert RestartResult.NEXT_LOAD == result
        return
    assert RestartResult.FAILED == result
    expected = "hal0 API answered 401 auth.required: authentication required"
    assert expected == flow.report.failures["agent"]


def test_routes_methods_and_auth_the_reconciler_relies_on(keyed_api) -> None:
    """The table above, against the release's own OpenAPI and its auth middleware."""
    doc = keyed_api.request("GET", "/api/openapi.json", key=KEY).body
    no_auth = keyed_api.version in NO_AUTH
    rows = []
    for method, path, _why, _codes, _cls in ROUTES:
        operation = doc["paths"].get(path, {}).get(method.lower())
        found = None if operation is None else tuple(sorted(operation["responses"]))
        concrete = path.replace("{name}", "agent").replace("{job_id}", "0123456789ab")
        if method == "POST" and (no_auth or path.startswith("/api/updates")):
            # never start an update or a restart only to learn its class
            anonymous = client = None
        else:
            anonymous = keyed_api.request(method, concrete).status
            client = keyed_api.request(method, concrete, key=CLIENT_KEY).status
        rows.append((method, path, found, anonymous, client))
    expected = []
    for method, path, _why, codes, cls in ROUTES:
        if method == "POST" and (no_auth or path.startswith("/api/updates")):
            anonymous = client = None
        elif no_auth or cls == OPEN:
            anonymous = client = 404 if path.endswith("{job_id}") else 200
        elif cls == CLIENT:
            anonymous, client = 401, 200
        else:
            anonymous, client = 401, 403
        expected.append((method, path, codes, anonymous, client))
    assert expected == rows


def test_the_peer_check_refuses_a_hal0_of_another_user(daemon_settings) -> None:
    """The newest release run as an unprivileged uid: trusted when it is hal0-api's user,
    else refused before a byte is sent (hal0's access log shows nothing)."""
    version = RELEASES[-1]
    hal0_real_api.skip_or_fail(version)
    home = Path(tempfile.mkdtemp(prefix="hal0-api-user-"))
    api = RealHal0Api(version, home, uid=54321)
    api.slots.mkdir(parents=True)
    api.write_slot("agent", NO_MODEL.format(name="agent", port=18094))
    with api:
        before = len(api.access_log())
        trusted = hal0_api.Hal0Client(daemon_settings(api, hal0_api_user="54321"))
        try:
            assert version == trusted.get("/api/health").body["version"]
        finally:
            trusted.close()
        assert len(api.access_log()) == before + 1
        other = hal0_api.Hal0Client(daemon_settings(api, hal0_api_user="54322"))
        with pytest.raises(hal0_api.ApiUntrusted, match="belongs to uid 54321"):
            other.get("/api/health")
        assert len(api.access_log()) == before + 1, "nothing sent to an untrusted listener"
