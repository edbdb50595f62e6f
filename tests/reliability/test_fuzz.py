"""Fuzzing: mutated slot files, in-process and through the real ``plan`` and ``once``.

Seeded and reproducible (``HAL0_FUZZ_SEED``). Each case has a time limit (SIGALRM in-process,
a timeout per batch for the processes). Counted: tracebacks (crashes), hangs, writes to a file
that was not a valid llama.cpp ``gpu-vulkan`` slot (outside writes), and valid candidates
planted in every batch that were not relabelled (lost). Inputs that ever failed live in
``corpus/`` and run on every run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from hal0_reconciler import errors
from hal0_reconciler.model import Action, Catalog
from hal0_reconciler.slots import document, edit, image, limits, policy, runtime
from helpers import hal0_facts
from helpers.daemon_host import Host, slot_text
from helpers.hosts import DATA, ROCM_USABLE
from reliability import support

SEED = int(os.environ.get("HAL0_FUZZ_SEED", "9009"))
CORPUS = Path(__file__).parent / "corpus"
BASES = sorted((DATA / "slots").glob("*.toml")) + sorted((DATA / "slots_edit").glob("*.toml"))
CASE_SECONDS = 2.0  # per case, in-process: far above the measured worst case (see README)

_HOSTILE = [
    b"port = " + b"9" * 5000,
    b"[" + b".".join([b"a"] * 40) + b"]",
    b"x = " + b"[" * 600,
    b"x = " + b"{a = " * 300 + b"1" + b"}" * 300,
    b"k" * 400 + b" = 1",
    b'"' + b"q" * 300 + b'" = 2',
    b"\xff\xfe\x00",
    b'"""',
    b"'''",
    b"device = 5",
    b'device = ["gpu-vulkan"]',
    b'device = "gpu-vulkan"',
    b'device = " gpu-vulkan "',
    b'backend = "vulkan"',
    b"[slot]",
    b"[server.env]",
    b'AITER_X = "1"',
    b"[[slot]]",
    b"slot = 1",
    b"name = 7",
    b'type = "tts"',
    b'profile = "kokoro"',
    b'image_pin = "ghcr.io/hal0ai/hal0-combined:0822"',
]
_RARE = [b'big = "' + b"a" * 70000 + b'"', b"n = [" + b"1," * 20000 + b"]"]


def mutate(rng: random.Random, data: bytes, bases: list[bytes]) -> bytes:
    """One to three random edits of ``data``: bytes flipped, inserted, deleted, duplicated,
    lines spliced from other slots, hostile snippets, line endings changed."""
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(9)
        n = len(data)
        at = rng.randrange(n + 1)
        if op == 0 and n:
            data = data[: at % n] + bytes([rng.randrange(256)]) + data[at % n + 1 :]
        elif op == 1:
            data = data[:at] + rng.randbytes(rng.randint(1, 16)) + data[at:]
        elif op == 2 and n:
            end = min(n, at + rng.randint(1, 40))
            data = data[:at] + data[end:]
        elif op == 3 and n:
            end = min(n, at + rng.randint(1, 80))
            data = data[:end] + data[at:end] + data[end:]
        elif op == 4:
            lines = rng.choice(bases).splitlines(keepends=True) or [b"\n"]
            data = data[:at] + rng.choice(lines) + data[at:]
        elif op in (5, 6):
            snippet = rng.choice(_RARE) if rng.random() < 0.01 else rng.choice(_HOSTILE)
            lines = data.splitlines(keepends=True)
            spot = rng.randint(0, len(lines))
            data = b"".join([*lines[:spot], snippet, b"\n", *lines[spot:]])
        elif op == 7:
            data = data.replace(b"\n", b"\r\n") if rng.random() < 0.5 else data.replace(b"\r", b"")
        else:
            devices = [b"gpu-vulkan", b"gpu-rocm", b"cpu", b"", b"GPU-VULKAN", b"vulkan"]
            data = data.replace(b'"gpu-vulkan"', b'"' + rng.choice(devices) + b'"', 1)
    return data


def cases(count: int) -> Iterator[tuple[str, bytes]]:
    """The regression corpus first, then ``count`` seeded mutations."""
    for path in sorted(CORPUS.glob("*.toml")):
        yield f"corpus/{path.name}", path.read_bytes()
    bases = [p.read_bytes() for p in BASES]
    rng = random.Random(SEED)
    for n in range(count):
        yield f"seed {SEED} case {n}", mutate(rng, rng.choice(bases), bases)


class _CaseTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise _CaseTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_NONE_CAPABLE = dataclasses.replace(hal0_facts.ALLOWLIST_13, capable=frozenset())
"""hal0 facts under which no image runs on Vulkan: every gpu-vulkan llama.cpp slot moves."""


def pipeline(data: bytes, catalog: Catalog) -> str:
    """What a pass does with one file's bytes, minus the disk: decode, limits, parse, decide,
    edit, re-parse. Returns what happened; the engine's own errors are normal outcomes."""
    try:
        doc = document.parse_slot(data.decode("utf-8"), stem="fuzz")
    except (UnicodeDecodeError, errors.SlotParseError):
        return "refused"
    verdict = policy.decide(
        doc,
        runtime=runtime.runtime_of(doc, catalog),
        image=image.effective_image(doc, _NONE_CAPABLE) if doc.vulkan_candidate else None,
        facts=ROCM_USABLE,
        demoted_by_us=False,
    )
    if verdict.action is not Action.RELABEL or verdict.new is None:
        return "kept"
    try:
        result = edit.set_device(data.decode(), table=doc.table, new=verdict.new)
    except errors.EditRefused:
        return "edit-refused"
    tomllib.loads(result.text)
    return "relabelled"


def test_mutated_slot_files_in_process(tmp_path: Path) -> None:
    """Every case ends as refused, kept or relabelled within its time limit, never raising
    anything else; failing inputs are saved for the corpus."""
    count = support.scaled(10_000, 100_000)
    catalog = runtime.catalog_from_profiles({})
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    worst = (0.0, "")
    for name, data in cases(count):
        started = time.perf_counter()
        try:
            with time_limit(CASE_SECONDS):
                outcome = pipeline(data, catalog)
        except _CaseTimeout:
            support.FIGURES["hangs"] += 1
            outcome = "hang"
        except Exception as exc:
            support.FIGURES["crashes"] += 1
            outcome = f"crash {type(exc).__name__}"
        spent = time.perf_counter() - started
        worst = max(worst, (spent, name))
        support.FIGURES["cases"] += 1
        outcomes[outcome.split()[0]] = outcomes.get(outcome.split()[0], 0) + 1
        if outcome.startswith(("hang", "crash")):
            saved = tmp_path / f"failed-{len(failures)}.toml"
            saved.write_bytes(data)
            failures.append(f"{name}: {outcome} (input in {saved}; add it to {CORPUS})")
    support.NOTES["fuzz worst case per file (in-process)"] = (
        f"{worst[0] * 1000:.1f} ms ({worst[1]})"
    )
    support.NOTES["fuzz outcomes"] = json.dumps(outcomes, sort_keys=True)
    assert [] == failures
    assert outcomes.get("relabelled", 0) > count // 20, outcomes  # the fuzzer reaches the edit


def _valid_vulkan_llama(data: bytes, catalog: Catalog) -> bool:
    """The oracle for a write: the old bytes were a valid slot (UTF-8, TOML), whose
    authoritative table labels it gpu-vulkan (or legacy backend vulkan) and whose runtime is
    llama.cpp (whether its image is Vulkan-capable is the policy's business, tested elsewhere)."""
    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError, RecursionError):
        return False
    fields = _launched(parsed)
    device = fields.get("device")
    if isinstance(device, str) and device.strip():
        vulkan = device.strip() == "gpu-vulkan"
    else:
        backend = fields.get("backend")
        absent = device is None or isinstance(device, str)  # "" or blank counts as absent
        vulkan = absent and isinstance(backend, str) and backend.strip().lower() == "vulkan"
    if not vulkan:
        return False
    doc = document.parse_slot(data.decode(), stem="x", limits=_NO_LIMITS)
    return runtime.runtime_of(doc, catalog).value in {"llama-server", "llama.cpp"}


_NO_LIMITS = limits.Limits(
    max_bytes=1 << 30, max_depth=900, max_key_length=1 << 30, max_digits=4000
)


def _launched(parsed: dict[str, Any]) -> dict[str, Any]:
    """hal0's launch path: each key from [slot] when it has it, else the top level."""
    slot = parsed.get("slot")
    if not isinstance(slot, dict):
        return parsed
    return {**{k: v for k, v in parsed.items() if k != "slot"}, **slot}


def _exactly_relabelled(old: bytes, new: bytes) -> bool:
    """The new document is the old one with device = "gpu-rocm" and no legacy backend, in the
    table the launched device comes from (and the top level too when it said the same)."""
    expected = tomllib.loads(old.decode())
    slot = expected.get("slot")
    tables = [expected]
    if isinstance(slot, dict):
        holder = "device" if "device" in slot or "device" in expected else "backend"
        if holder in slot or holder not in expected:
            same = holder == "device" and expected.get("device") == slot.get("device")
            tables = [slot, expected] if same else [slot]
    for fields in tables:
        fields["device"] = "gpu-rocm"
        fields.pop("backend", None)
    return tomllib.loads(new.decode()) == expected


@pytest.mark.timeout(600)
def test_mutated_slot_files_through_plan_and_once(host: Host) -> None:
    """Batches of mutated files plus planted valid candidates, through real ``plan`` and
    ``once`` processes: no traceback, no hang, writes only to valid gpu-vulkan llama.cpp
    slots (each now exactly relabelled), every planted candidate relabelled."""
    count = support.scaled(10_000, 100_000)
    batch_size = 2000
    catalog = runtime.catalog_from_profiles({})
    all_cases = list(cases(count))
    problems: list[str] = []
    for start in range(0, len(all_cases), batch_size):
        for old in host.slots.iterdir():
            old.unlink()
        batch = all_cases[start : start + batch_size]
        before: dict[Path, bytes] = {}
        for n, (_, data) in enumerate(batch):
            path = host.slots / f"f{n:04d}.toml"
            path.write_bytes(data)
            before[path] = data
        planted = [host.slots / f"planted-{n}.toml" for n in range(5)]
        for n, path in enumerate(planted):
            path.write_text(slot_text(f"planted-{n}"))
        for verb in ("plan", "once"):
            try:
                done = support.run_cli(host, verb, timeout=120)
            except Exception:
                problems.append(f"batch {start}: {verb} hung")
                continue
            if support.tracebacks(done.stderr) or done.returncode not in (0, 1, 2, 3):
                support.FIGURES["crashes"] += 1
                problems.append(
                    f"batch {start}: {verb} exit {done.returncode}: {done.stderr[-2000:]}"
                )
        for path, data in before.items():
            now = path.read_bytes()
            if now == data:
                continue
            if not _valid_vulkan_llama(data, catalog) or not _exactly_relabelled(data, now):
                support.FIGURES["outside writes"] += 1
                problems.append(f"batch {start}: {path.name} was written but was no candidate")
        lost = [p.name for p in planted if b'device = "gpu-rocm"' not in p.read_bytes()]
        support.FIGURES["lost"] += len(lost)
        if lost:
            problems.append(f"batch {start}: planted candidates not relabelled: {lost}")
    assert [] == problems
