"""Which names a module registered, at the speed of ``bytes.find``.                 [pure]

The rule (``registry``): a name is registered when its bytes followed by a NUL occur in the file.
Every occurrence of a name starts with the name's first bytes, so the names are grouped by a
shared prefix and each group costs one ``find`` pass over the file for that prefix (a skip
search that runs near memory speed over code and padding); at each hit the NUL-terminated
string from there is looked up in the group. When the names share no prefix worth searching
for, one pass collecting every printable NUL-terminated run (``registry.registered_in``'s
regular expression) answers them all instead.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable

_RUN = re.compile(rb"[\x20-\x7e]+\x00")
_PRINTABLE = re.compile(r"[\x20-\x7e]+")
_PREFIX = 8  # bytes a group's names share at least (shorter names search for themselves)
_MAX_GROUPS = 24  # more find passes than this: one regular-expression pass is cheaper

Fallback = Callable[[bytes, set[str]], dict[str, bool]]


def registered_in(
    data: bytes, names: Iterable[str], *, fallback: Fallback | None = None
) -> dict[str, bool]:
    """``{name: name + NUL occurs in data}`` for each name; ``fallback`` answers when the
    names would need too many passes."""
    wanted = set(names)
    encoded = {n: n.encode("utf-8", "surrogateescape") for n in wanted}
    answer: dict[str, bool] = {}
    groups: dict[bytes, dict[bytes, str]] = {}
    for name, raw in encoded.items():
        if not raw:
            answer[name] = False
            continue
        if b"\x00" in raw:  # not a C string: the plain search
            answer[name] = data.find(raw + b"\x00") != -1
            continue
        groups.setdefault(raw[:_PREFIX], {})[raw] = name
    if len(groups) > _MAX_GROUPS:
        runs = registered_in_runs if fallback is None else fallback
        return {**answer, **runs(data, set(wanted) - answer.keys())}
    for members in groups.values():
        answer.update(_scan_group(data, members))
    return answer


def _scan_group(data: bytes, members: dict[bytes, str]) -> dict[str, bool]:
    prefix = _common_prefix(list(members))
    longest = max(len(raw) for raw in members)
    left = set(members)
    found: dict[str, bool] = dict.fromkeys(members.values(), False)
    pos = data.find(prefix)
    while pos != -1 and left:
        end = data.find(b"\x00", pos + len(prefix), pos + longest + 1)
        if end != -1:
            raw = bytes(data[pos:end])
            if raw in left:
                found[members[raw]] = True
                left.discard(raw)
        pos = data.find(prefix, pos + 1)
    return found


def _common_prefix(raws: list[bytes]) -> bytes:
    first, last = min(raws), max(raws)
    size = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), None)
    return first[: len(first) if size is None else size]


def registered_in_runs(data: bytes, names: Iterable[str]) -> dict[str, bool]:
    """The NUL-terminated exact-suffix rule for each name over ``data`` (one pass collecting
    every printable NUL-terminated run)."""
    wanted = set(names)
    if not wanted:
        return {}
    runs = set(_RUN.findall(data))
    answer: dict[str, bool] = {}
    reversed_runs: list[bytes] | None = None
    for name in wanted:
        raw = name.encode("utf-8", "surrogateescape")
        if not raw:
            answer[name] = False
        elif not _PRINTABLE.fullmatch(name):
            answer[name] = data.find(raw + b"\x00") != -1
        elif raw + b"\x00" in runs:
            answer[name] = True
        else:
            if reversed_runs is None:
                reversed_runs = sorted(r[-2::-1] for r in runs)  # drop the NUL, reverse
            key = raw[::-1]
            i = bisect.bisect_left(reversed_runs, key)
            answer[name] = i < len(reversed_runs) and reversed_runs[i].startswith(key)
    return answer
