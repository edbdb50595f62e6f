"""status.json's slots, as the daemon renders them (only the entries that changed, from cached
fragments), always say what a full render would, and every change of them is published (the
revision the main loop republishes on moves); the unreadable-files gauge counts exactly the
entries shown unreadable. Driven through slot files that come, break, heal and go."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hal0_reconciler.daemon import publish, statusjson
from helpers.pass_bench import Bench


class Shown:
    """status.json's ``slots`` as the daemon renders it, next to a full render of it."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.daemon = publish.Sources(
            bench.passes, None, {}, bench.selfheal, 0.0, statusjson.SlotsJson()
        )
        self.plain = publish.Sources(bench.passes, None, {}, bench.selfheal, 0.0)
        self.last: dict[str, Any] | None = None
        self.revision = -1

    def check(self, step: str) -> dict[str, Any]:
        """After a batch: both renders agree, a change was published, the gauge is right."""
        rendered, _ = publish.compose(self.daemon, [], ready=True)
        text = b"".join(statusjson.dumps(rendered)).decode()
        slots = json.loads(text)["slots"]
        full, _ = publish.compose(self.plain, [], ready=True)
        assert full["slots"] == slots, (
            f"{step}: status.json's slots are not what a full render says: {slots}"
        )
        p = self.bench.passes.progress
        if slots != self.last:
            assert p.revision != self.revision, f"{step}: a change of the slots was not published"
        self.last, self.revision = slots, p.revision
        unreadable = sum(1 for e in slots.values() if e["status"] == "unreadable")
        assert unreadable == p.metrics.unreadable_files, (
            f"{step}: the unreadable gauge says {p.metrics.unreadable_files}, "
            f"status.json shows {unreadable}"
        )
        return slots


def _broken(path: Path) -> Path:
    path.write_text("name = [\n")
    return path


def test_the_status_slots_follow_files_that_come_break_heal_and_go(tmp_path: Path) -> None:
    """Partial and full passes over files appearing, going unreadable, fixed, deleted (seen
    and unseen): after each, status.json's slots are right, published, and counted."""
    bench = Bench(tmp_path)
    shown = Shown(bench)
    agent, coder = bench.slot("agent", "gpu-rocm"), bench.slot("coder", "gpu-rocm")
    bench.full()
    assert {"agent.toml", "coder.toml"} == set(shown.check("first full pass"))
    broken = _broken(bench.slots / "broken.toml")
    bench.changed(broken)
    assert "unreadable" == shown.check("a broken file appears")["broken.toml"]["status"]
    bench.slot("broken", "gpu-rocm")
    bench.changed(broken)
    assert "unchanged" == shown.check("the broken file fixed")["broken.toml"]["status"]
    _broken(broken)
    bench.changed(broken)
    shown.check("broken again")
    broken.unlink()
    bench.changed(broken)
    assert "broken.toml" not in shown.check("the unreadable file deleted")
    agent.unlink()
    bench.changed(agent)
    assert {"coder.toml"} == set(shown.check("a slot deleted"))
    _broken(bench.slots / "later.toml")
    bench.full()
    shown.check("a broken file found by a full pass")
    (bench.slots / "later.toml").unlink()  # its event lost
    coder.unlink()  # its event lost
    bench.slot("new", "gpu-rocm")
    bench.changed(bench.slots / "new.toml")
    shown.check("a new slot, two deletions unseen")
    bench.full()
    assert {"new.toml"} == set(shown.check("the full pass after the unseen deletions"))
