"""The stand-in (``helpers.hal0_api_server``) answers in the newest release's shapes.

The same requests go to hal0's real newest release and to the stand-in set up alike (a slot
with no model, a slot whose load fails, an unknown slot, no key): status codes must be equal,
error envelopes and small bodies equal field for field (types included), and every field the
stand-in answers in a slot body must be one the real release answers, with the same type.
"""

from __future__ import annotations

import http.client
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import hal0_real_api
from helpers.hal0_api_server import Hal0Api
from helpers.hal0_real_api import RELEASES, RealHal0Api

pytestmark = pytest.mark.timeout(300)

NEWEST = RELEASES[-1]
KEY = "k3y-for-tests"
NO_MODEL = 'name = "{name}"\ntype = "llm"\ndevice = "gpu-vulkan"\nport = {port}\n'
FAILS = 'name = "{name}"\ntype = "llm"\ndevice = "cpu"\nport = {port}\n\n[model]\ndefault = "m"\n'
SLOTS = ("agent", "coder")


def shape(doc: Any) -> Any:
    """A JSON document's structure: keys kept, each scalar replaced by its type's name."""
    if isinstance(doc, dict):
        return {k: shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [shape(v) for v in doc[:1]]
    return "null" if doc is None else type(doc).__name__


def not_in(ours: Any, theirs: Any, where: str = "") -> list[str]:
    """Where ``ours`` has a field ``theirs`` lacks, or another type (recursively)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return [
            miss
            for key, value in ours.items()
            for miss in (
                not_in(value, theirs[key], f"{where}.{key}")
                if key in theirs
                else [f"{where}.{key}: not answered by hal0"]
            )
        ]
    if isinstance(ours, list) and isinstance(theirs, list):
        return not_in(ours[0], theirs[0], f"{where}[0]") if ours and theirs else []
    return [] if ours == theirs else [f"{where}: {ours} here, {theirs} in hal0"]


def _real(admin_key: str | None) -> Iterator[RealHal0Api]:
    hal0_real_api.skip_or_fail(NEWEST)
    home = Path(tempfile.mkdtemp(prefix="hal0-api-shapes-"))
    api = RealHal0Api(NEWEST, home, admin_key=admin_key)
    api.slots.mkdir(parents=True)
    api.write_slot("agent", NO_MODEL.format(name="agent", port=18191))
    api.write_slot("coder", FAILS.format(name="coder", port=18192))
    with api:
        yield api


@pytest.fixture(scope="module")
def real() -> Iterator[RealHal0Api]:
    yield from _real(None)


@pytest.fixture(scope="module")
def real_keyed() -> Iterator[RealHal0Api]:
    yield from _real(KEY)


@pytest.fixture
def stand_in() -> Iterator[Hal0Api]:
    with Hal0Api(version=NEWEST, configured=SLOTS) as api:
        api.slot("agent", state="offline", outcome="offline", deferred=None, port=18191)
        api.slot("agent", model_id=None)
        api.slot("coder", state="offline", outcome="error", deferred=None, port=18192)
        yield api


def ask(url: str, method: str, path: str, key: str | None = None) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def both(real: RealHal0Api, stand_in: Hal0Api, method: str, path: str, **kw: Any) -> tuple:
    return ask(real.url, method, path, **kw), ask(stand_in.url, method, path, **kw)


def test_health_is_the_same_document(real, stand_in) -> None:
    theirs, ours = both(real, stand_in, "GET", "/api/health")
    assert theirs == ours == (200, {"status": "ok", "name": "hal0", "version": NEWEST})


def test_state_has_the_same_fields(real, stand_in) -> None:
    (status, theirs), (our_status, ours) = both(real, stand_in, "GET", "/api/slots/agent/state")
    assert status == our_status == 200
    assert ["name", "state", "port", "model_id", "backend"] == list(theirs) == list(ours)
    assert (theirs["state"], theirs["port"]) == (ours["state"], ours["port"]) == ("offline", 18191)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/slots/nosuch/state"),
        ("GET", "/api/slots/nosuch"),
        ("POST", "/api/slots/nosuch/restart"),
        ("GET", "/api/nosuch"),
    ],
)
def test_not_found_is_the_same_envelope(real, stand_in, method: str, path: str) -> None:
    theirs, ours = both(real, stand_in, method, path)
    assert theirs == ours
    assert theirs[0] == 404


def test_a_restart_left_offline_answers_the_same_fields(real, stand_in) -> None:
    (status, theirs), (our_status, ours) = both(real, stand_in, "POST", "/api/slots/agent/restart")
    assert status == our_status == 200
    assert shape(theirs) == shape(ours)
    assert theirs["state"] == ours["state"] == "offline"
    assert theirs["metadata"]["message"] == ours["metadata"]["message"]


def test_a_failing_load_answers_the_same_envelope_and_leaves_error(real, stand_in) -> None:
    """A 500 with hal0's envelope (the code names the cause, which differs), state error, and
    hal0's message in ``GET /api/slots/{name}``'s metadata."""
    (status, theirs), (our_status, ours) = both(real, stand_in, "POST", "/api/slots/coder/restart")
    assert status == our_status == 500
    assert (
        shape(theirs) == shape(ours) == {"error": {"code": "str", "message": "str", "details": {}}}
    )
    theirs_state, ours_state = both(real, stand_in, "GET", "/api/slots/coder/state")
    assert theirs_state[1]["state"] == ours_state[1]["state"] == "error"
    (_, their_slot), (_, our_slot) = both(real, stand_in, "GET", "/api/slots/coder")
    assert their_slot["metadata"]["message"] == theirs["error"]["message"]
    assert isinstance(our_slot["metadata"]["message"], str)
    assert our_slot["metadata"]["message"]
    assert [] == not_in(shape(our_slot), shape(their_slot)), "the stand-in answers hal0's fields"


def test_metrics_rows_without_counters_have_the_same_fields(real, stand_in) -> None:
    """No llama-server --metrics: requests_processing 0, requests_deferred absent."""
    (status, theirs), (our_status, ours) = both(real, stand_in, "GET", "/api/slots/metrics")
    assert status == our_status == 200
    assert shape(theirs["agent"]) == shape(ours["agent"])
    assert "requests_deferred" not in theirs["agent"]
    assert theirs["agent"]["requests_processing"] == ours["agent"]["requests_processing"] == 0


def test_no_key_is_the_same_refusal(real_keyed) -> None:
    with Hal0Api(version=NEWEST, key=KEY, configured=SLOTS) as stand_in:
        for method, path in (
            ("GET", "/api/slots/agent/state"),
            ("POST", "/api/slots/agent/restart"),
        ):
            theirs, ours = both(real_keyed, stand_in, method, path)
            assert theirs == ours
            assert theirs[0] == 401
        theirs, ours = both(real_keyed, stand_in, "GET", "/api/health")
        assert theirs == ours
        assert theirs[0] == 200
