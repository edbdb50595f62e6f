"""Which rules the installed aiter follows: rule sets (TOML text), versions, core.py facts.   [pure]

aiter changed how it reads ``AITER_CONFIG_*`` and merges tables between versions. The rule sets
ship as ``rules.toml`` beside ``routing.toml``; this module parses them, compares PEP 440 versions
(no third-party parser: release, pre/post/dev and local parts are enough for aiter's tags),
finds the facts ``markers`` name in the text of ``aiter/jit/core.py`` (with ``ast``, never
importing it), and chooses the set for one install. Reading the files is ``installed.py``'s job.
"""

from __future__ import annotations

import ast
import enum
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hal0_reconciler.errors import ReconcilerError


class RulesError(ReconcilerError):
    """The rule data is malformed (names the key)."""


class EmptyValue(enum.StrEnum):
    DROPS_DEFAULT = "drops-default"  # os.getenv(VAR, default) is "": overlays only
    FAILS = "fails"  # the merge reads the path "" first: the load fails


class Overlays(enum.StrEnum):
    """Which ``model_configs/`` files an unset variable merges in."""

    NONE = "none"
    STEM_ANYWHERE = "stem-anywhere"  # glob("*<stem>*"), "untuned" not in str(path)
    STEM_CSV = "stem-csv"  # glob("*<stem>*.csv"), "untuned" not in path.name


class ListMissing(enum.StrEnum):
    """What a ``:``-list naming missing files does."""

    FIRST_FAILS = "first-fails"  # read_csv(path_list[0]) unchecked; later ones skipped
    SKIPPED = "skipped"  # every missing one skipped; none left: FileNotFoundError


class DedupMerge(enum.StrEnum):
    EXACT_ONLY = "exact-only"
    REWRITE_AND_RERUN = "rewrite-and-rerun"
    IN_MEMORY_WINNER = "in-memory-winner"


MARKERS = ("rewrites_duplicates", "reads_first_path", "overlay_csv_glob", "merges_overlays")
"""The core.py facts a rule set may name (``code_facts`` finds each)."""


@dataclass(frozen=True)
class RuleSet:
    name: str
    summary: str
    empty_value: EmptyValue
    dedup_merge: DedupMerge
    overlays: Overlays = Overlays.STEM_CSV
    list_missing: ListMissing = ListMissing.SKIPPED
    dedup_keys: tuple[str, ...] = ("cu_num", "gfx", "_tag")
    routing: str = ""  # the version key in routing.toml; empty: the routing data's default
    versions: tuple[str, ...] = ()
    revisions: tuple[str, ...] = ()
    markers: Mapping[str, bool] = field(default_factory=dict)
    build_cu: Mapping[str, int] = field(default_factory=dict)

    def holds_version(self, version: str) -> bool:
        """Whether every bound in ``versions`` holds for ``version`` (never, without bounds)."""
        if not self.versions:
            return False
        key = version_key(version)
        return all(_bound_holds(b, key) for b in self.versions)

    def holds_revision(self, revision: str) -> bool:
        rev = revision.lower()
        return any(
            rev.startswith(r.lower()) or r.lower().startswith(rev)
            for r in self.revisions
            if len(rev) >= 7
        )

    def agrees(self, facts: Mapping[str, bool]) -> bool:
        """Whether core.py's facts match every marker this set names."""
        return all(facts.get(k) == v for k, v in self.markers.items())


@dataclass(frozen=True)
class RuleBook:
    sets: tuple[RuleSet, ...]
    newest: RuleSet


@dataclass(frozen=True)
class Choice:
    """The rule set chosen for one install, and how (said in ``aiter plan``)."""

    rules: RuleSet
    how: str  # "version 0.1.21.dev46+ge4048607a5", "aiter/jit/core.py", "newest known (...)"
    note: str | None = None  # said once: an unknown version, a disagreement


def parse_rules(text: str) -> RuleBook:
    """The rule book in ``text``. Raises RulesError naming the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"rule data is not valid TOML: {exc}") from None
    raw_sets = data.get("rulesets")
    if not isinstance(raw_sets, dict) or not raw_sets:
        raise RulesError("rule data has no [rulesets.*]")
    sets = tuple(_ruleset(name, raw) for name, raw in raw_sets.items())
    newest = next((s for s in sets if s.name == data.get("newest")), None)
    if newest is None:
        raise RulesError(f"newest = {data.get('newest')!r} names no rule set")
    return RuleBook(sets, newest)


def _ruleset(name: str, raw: Any) -> RuleSet:
    where = f"rulesets.{name}"
    if not isinstance(raw, dict):
        raise RulesError(f"{where} must be a table")
    unknown = set(raw) - {
        "summary",
        "versions",
        "revisions",
        "markers",
        "empty_value",
        "overlays",
        "list_missing",
        "dedup_merge",
        "dedup_keys",
        "routing",
        "build_cu",
    }
    if unknown:
        raise RulesError(f"{where}: unknown key {min(unknown)!r}")
    versions = _strings(raw.get("versions", []), f"{where}.versions")
    for bound in versions:
        if _BOUND.fullmatch(bound) is None:
            raise RulesError(f"{where}.versions: {bound!r} is not like '>=0.1.12'")
        version_key(_BOUND.fullmatch(bound)[2])  # type: ignore[index]  # checked above
    markers = raw.get("markers", {})
    if not isinstance(markers, dict) or not all(
        k in MARKERS and isinstance(v, bool) for k, v in markers.items()
    ):
        raise RulesError(f"{where}.markers: only {', '.join(MARKERS)} = true|false")
    build_cu = raw.get("build_cu", {})
    if not isinstance(build_cu, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in build_cu.values()
    ):
        raise RulesError(f"{where}.build_cu must map gfx names to CU counts")
    choices: dict[str, type[enum.StrEnum]] = {
        "empty_value": EmptyValue,
        "overlays": Overlays,
        "list_missing": ListMissing,
        "dedup_merge": DedupMerge,
    }
    for key, kind in choices.items():
        if raw.get(key) not in {str(v) for v in kind}:
            raise RulesError(f"{where}.{key} must be one of {', '.join(str(v) for v in kind)}")
    try:
        return RuleSet(
            name=name,
            summary=str(raw.get("summary", "")),
            empty_value=EmptyValue(raw["empty_value"]),
            dedup_merge=DedupMerge(raw["dedup_merge"]),
            overlays=Overlays(raw["overlays"]),
            list_missing=ListMissing(raw["list_missing"]),
            dedup_keys=_strings(raw.get("dedup_keys", []), f"{where}.dedup_keys"),
            routing=str(raw.get("routing", "")),
            versions=versions,
            revisions=_strings(raw.get("revisions", []), f"{where}.revisions"),
            markers=dict(markers),
            build_cu={str(k).lower(): int(v) for k, v in build_cu.items()},
        )
    except ValueError as exc:
        raise RulesError(f"{where}: {exc}") from None


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RulesError(f"{where} must be a list of strings")
    return tuple(value)


# --- versions --------------------------------------------------------------------------------

_VERSION = re.compile(
    r"v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pren>\d*))?"
    r"(?:(?:-(?P<postn1>\d+))|(?:[-_.]?(?:post|rev|r)[-_.]?(?P<postn2>\d*)))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?",
    re.IGNORECASE,
)
_BOUND = re.compile(r"(>=|<=|>|<|==)\s*(\S+)")
_PRE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")

VersionKey = tuple[tuple[int, ...], tuple[float, int], tuple[float, int], tuple[float, int]]
"""Sortable form of a version: release, pre, post, dev (the local part does not order)."""


class VersionError(ValueError):
    """Not a PEP 440 version."""


def version_key(version: str) -> VersionKey:
    """A sortable key for a PEP 440 version. Raises VersionError."""
    match = _VERSION.fullmatch(version.strip())
    if match is None:
        raise VersionError(f"{version!r} is not a PEP 440 version")
    release = tuple(int(p) for p in match["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    dev = match["dev"]
    has_dev = dev is not None
    pre: tuple[float, int]
    if match["pre"] is not None:
        pre = (_PRE_ORDER[match["pre"].lower()], int(match["pren"] or 0))
    elif has_dev and match["postn1"] is None and match["postn2"] is None:
        pre = (-_INF, 0)  # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (_INF, 0)
    post_digits = match["postn1"] or match["postn2"]
    has_post = match["postn1"] is not None or match["postn2"] is not None
    post = (0.0, int(post_digits or 0)) if has_post else (-_INF, 0)
    dev_key = (0.0, int(dev or 0)) if has_dev else (_INF, 0)
    return release, pre, post, dev_key


def revision_of(version: str) -> str | None:
    """The git revision setuptools_scm put in the local part (``+ge4048607a5`` → e4048607a5)."""
    match = re.search(r"\+(?:.*[.-])?g([0-9a-f]{7,40})(?:[.-]|$)", version.strip())
    return match[1] if match else None


def _bound_holds(bound: str, key: VersionKey) -> bool:
    match = _BOUND.fullmatch(bound)
    if match is None:  # parse_rules refused it already
        return False
    other, mine = _padded(version_key(match[2]), key)
    return {
        ">=": mine >= other,
        "<=": mine <= other,
        ">": mine > other,
        "<": mine < other,
        "==": mine == other,
    }[match[1]]


def _padded(a: VersionKey, b: VersionKey) -> tuple[VersionKey, VersionKey]:
    """Both keys with releases of one length (1.0 == 1.0.0)."""
    width = max(len(a[0]), len(b[0]))
    return (
        (a[0] + (0,) * (width - len(a[0])), a[1], a[2], a[3]),
        (b[0] + (0,) * (width - len(b[0])), b[1], b[2], b[3]),
    )


# --- aiter/jit/core.py ---------------------------------------------------------------------------

_RERUN_TEXT = re.compile(r"re-run", re.IGNORECASE)
_FIRST_PATH_TEXT = re.compile(r"read_csv\(\s*path_list\[0\]\s*\)")
_CSV_GLOB_TEXT = re.compile(r"glob\(\s*f[\"']\*\{tuned_file_name\}\*\.csv[\"']\s*\)")


def code_facts(text: str) -> dict[str, bool]:
    """The ``MARKERS`` facts of core.py's source text (parsed with ``ast``; text as fallback)."""
    csv_glob = _CSV_GLOB_TEXT.search(text) is not None
    overlays = "model_configs" in text
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # hostile or newer syntax
        return {
            "rewrites_duplicates": "update_config_files" in text
            and _RERUN_TEXT.search(text) is not None,
            "reads_first_path": _FIRST_PATH_TEXT.search(text) is not None,
            "overlay_csv_glob": csv_glob,
            "merges_overlays": overlays,
        }
    merges = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "update_config_files"
    ]
    return {
        "rewrites_duplicates": any(_raises_rerun(f) for f in merges),
        "reads_first_path": any(_reads_first_path(f) for f in merges),
        "overlay_csv_glob": csv_glob,
        "merges_overlays": overlays,
    }


def _reads_first_path(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``read_csv(<paths>[0])``: the merge reads the first path without checking it exists."""
    return any(
        isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("read_csv")
        and node.args
        and isinstance(node.args[0], ast.Subscript)
        and isinstance(node.args[0].slice, ast.Constant)
        and node.args[0].slice.value == 0
        for node in ast.walk(func)
    )


def _raises_rerun(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in ast.walk(func):
        if isinstance(node, ast.Raise) and node.exc is not None:
            text = " ".join(
                c.value
                for c in ast.walk(node.exc)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
            if _RERUN_TEXT.search(text):
                return True
    return False


# --- choosing ------------------------------------------------------------------------------------


def choose(book: RuleBook, *, version: str | None, facts: Mapping[str, bool] | None) -> Choice:
    """The rule set for an install with ``version`` (None: unknown) and core.py ``facts``."""
    by_version: list[RuleSet] = []
    bad_version = None
    if version:
        revision = revision_of(version)
        by_version = [s for s in book.sets if revision and s.holds_revision(revision)]
        if not by_version:
            try:
                by_version = [s for s in book.sets if s.holds_version(version)]
            except VersionError as exc:
                bad_version = str(exc)
    if len(by_version) == 1 and (facts is None or by_version[0].agrees(facts)):
        return Choice(by_version[0], f"version {version}")
    if facts is not None:
        by_code = [s for s in book.sets if s.agrees(facts)]
        both = [s for s in by_code if s in by_version]
        picked = both or by_code
        if picked:
            chosen = picked[-1] if book.newest not in picked else book.newest
            note = None
            if by_version and chosen not in by_version:
                note = (
                    f"aiter {version} reads as {', '.join(s.name for s in by_version)} by its "
                    f"version, but aiter/jit/core.py shows {chosen.name}: following the code"
                )
            return Choice(
                chosen, "aiter/jit/core.py" + (f", version {version}" if version else ""), note
            )
    why = bad_version or (
        f"aiter {version} is newer or older than every known rule set"
        if version
        else "no aiter version found"
    )
    return Choice(
        book.newest,
        f"newest known ({why})",
        f"{why}: using the newest known rules {book.newest.name}",
    )
