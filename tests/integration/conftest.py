"""Fixtures the slot-pass tests share: counting parses, and reads that count as settled."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hal0_reconciler.slots import document, seen


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every slot parse, by file stem."""
    calls: list[str] = []
    real = document.parse_slot

    def counting(text: str, *, stem: str, **options: Any) -> document.SlotDoc:
        calls.append(stem)
        return real(text, stem=stem, **options)

    monkeypatch.setattr(document, "parse_slot", counting)
    return calls


@pytest.fixture
def settled_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read counts as settled when the file's ctime is older than the read at all (the real
    margin is a second: tests would have to sleep)."""
    monkeypatch.setattr(seen, "SETTLED_NS", 0)
    time.sleep(0.02)  # the files written just before are older than the first read
