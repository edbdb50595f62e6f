"""Property: a pass changes nothing, or exactly the device value; a second pass changes nothing."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hal0_reconciler import settings as settings_mod
from hal0_reconciler.model import HostFacts, LaneState
from hal0_reconciler.reconcile import Reconciler

DEVICES = ["gpu-vulkan", "gpu-rocm", "cpu", "npu", "gpu-cuda", ""]
TYPES = ["llm", "embedding", "reranking", "tts", "transcription", "image", None]
PROFILES = ["coding", "vulkan", "kokoro", "comfyui", "flm", "tts", "unknown-profile", None]
FACTS = st.sampled_from(
    [
        HostFacts(amd=True, lane=LaneState.USABLE),
        HostFacts(amd=True, lane=LaneState.UNUSABLE),
        HostFacts(amd=True, lane=LaneState.UNSETTLED),
        HostFacts(amd=False, lane=LaneState.UNUSABLE),
    ]
)
comment = st.text(st.characters(blacklist_categories=["Cc", "Cs"]), max_size=30).map(
    lambda t: f"# {t}"
)


@st.composite
def slot_files(draw: st.DrawFn) -> str:
    nl = draw(st.sampled_from(["\n", "\r\n"]))
    nested = draw(st.booleans())
    lines = [draw(comment)]
    fields = [f'name = "s{draw(st.integers(0, 99))}"']
    t = draw(st.sampled_from(TYPES))
    if t:
        fields.append(f'type = "{t}"')
    p = draw(st.sampled_from(PROFILES))
    if p:
        fields.append(f'profile = "{p}"')
    device = draw(st.sampled_from(DEVICES))
    if draw(st.booleans()):
        q = draw(st.sampled_from(['"', "'"]))
        sp = draw(st.sampled_from([" = ", "=", "   =  "]))
        fields.append(f"device{sp}{q}{device}{q}" + draw(st.sampled_from(["", "  # label"])))
    if draw(st.booleans()):
        fields.append(f'backend = "{draw(st.sampled_from(["vulkan", "rocm", "", "cpu"]))}"')
    fields = draw(st.permutations(fields))
    if nested:
        lines.append('device = "gpu-vulkan"  # drift at the root')
        lines.append("")
        lines.append("[slot]")
    lines.extend(fields)
    lines += [
        "",
        "[model]",
        'default = "m"',
        "",
        "[server]",
        'extra_args = """',
        'device = "gpu-vulkan"',
        '"""',
    ]
    return nl.join(lines) + nl


def authoritative(data: dict[str, object]) -> dict[str, object]:
    slot = data.get("slot")
    return slot if isinstance(slot, dict) else data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=slot_files(), facts=FACTS)
def test_a_pass_changes_only_the_device_and_converges(text: str, facts: HostFacts) -> None:
    """After a pass the file is unchanged or differs only in its device (and dropped backend)."""
    with tempfile.TemporaryDirectory() as tmp:
        slots = Path(tmp, "slots")
        slots.mkdir()
        path = slots / "s.toml"
        path.write_bytes(text.encode())
        config = settings_mod.load(
            None,
            {
                "slots_dir": str(slots),
                "profiles_file": str(Path(tmp, "p.toml")),
                "state_dir": str(Path(tmp, "state")),
            },
        )
        Reconciler(config).reconcile(facts)
        after = path.read_bytes()
        old, new = tomllib.loads(text), tomllib.loads(after.decode())
        if after != text.encode():
            table_old, table_new = authoritative(old), authoritative(new)
            assert table_new["device"] in {"gpu-rocm", "cpu"}
            assert "backend" not in table_new
            expected = {k: v for k, v in table_old.items() if k not in {"device", "backend"}}
            assert expected == {k: v for k, v in table_new.items() if k != "device"}
            if "slot" in old:  # nested: everything outside [slot] is untouched
                assert {k: v for k, v in old.items() if k != "slot"} == {
                    k: v for k, v in new.items() if k != "slot"
                }
            if "\r\n" in text:  # a CRLF file stays CRLF: no bare LF appears
                assert after.decode().count("\n") == after.decode().count("\r\n")
        Reconciler(config).reconcile(facts)
        assert after == path.read_bytes()
