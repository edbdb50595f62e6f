"""What the installed aiter is, read without importing it: its version and core.py's facts.

The version comes from the package's own ``_version.py`` (written by setuptools_scm), else from
the distribution metadata beside the package (``amd_aiter-*.dist-info/METADATA`` or
``aiter-*.dist-info``, or a develop install's ``*.egg-info/PKG-INFO``). ``aiter/jit/core.py`` is
read as text and its facts found with ``ast`` (``rules.code_facts``). Only regular files are
opened (a FIFO never blocks a check), and each is read at most ``MAX_BYTES``.
"""

from __future__ import annotations

import ast
import stat
from dataclasses import dataclass, field
from pathlib import Path

from hal0_reconciler import fsio
from hal0_reconciler.aiter.rules import sets as rules

MAX_BYTES = 4 * 1024 * 1024
_DIST_NAMES = ("amd_aiter", "aiter")


@dataclass(frozen=True)
class Installed:
    """The facts of one aiter install that choose its rule set."""

    package_dir: Path
    version: str | None = None
    version_from: Path | None = None
    facts: dict[str, bool] | None = None  # None: core.py not readable
    notes: tuple[str, ...] = field(default_factory=tuple)


def read_installed(package_dir: Path) -> Installed:
    """Version and core.py facts of the aiter package in ``package_dir``."""
    notes: list[str] = []
    version, where = _version(package_dir, notes)
    facts = None
    core = package_dir / "jit" / "core.py"
    text = _read_regular(core, notes)
    if text is not None:
        facts = rules.code_facts(text)
    return Installed(package_dir, version, where, facts, tuple(notes))


def choose(book: rules.RuleBook, package_dir: Path) -> tuple[rules.Choice, Installed]:
    """The rule set for the aiter in ``package_dir``, and what was read to choose it."""
    found = read_installed(package_dir)
    return rules.choose(book, version=found.version, facts=found.facts), found


def rules_text() -> str:
    """The shipped rule sets (which aiter version reads its tables how)."""
    return shipped_text("rules.toml")


def shipped_text(name: str) -> str:
    """A data file shipped beside this module: read directly (importlib.resources and the
    zipfile machinery it imports cost more than the read), through importlib when the package
    is not a plain folder."""
    try:
        return Path(__file__).with_name(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        from importlib import resources  # noqa: PLC0415 - a zipped install only

        return resources.files(__package__ or "").joinpath(name).read_text(encoding="utf-8")


class Installs:
    """The rule set of each aiter install, read again only when its version file, core.py or
    the folder beside the package (its distribution metadata) change."""

    def __init__(self) -> None:
        self.book = rules.parse_rules(rules_text())
        self._cache: dict[Path, tuple[tuple[object, ...], rules.Choice, Installed]] = {}

    def choose(self, package_dir: Path) -> tuple[rules.Choice, Installed]:
        stamp = tuple(
            _stamp(p)
            for p in (
                package_dir / "_version.py",
                package_dir / "jit" / "core.py",
                package_dir.parent,
            )
        )
        cached = self._cache.get(package_dir)
        if cached is None or cached[0] != stamp:
            choice, found = choose(self.book, package_dir)
            cached = (stamp, choice, found)
            self._cache[package_dir] = cached
        return cached[1], cached[2]


def _stamp(path: Path) -> tuple[int, ...] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return fsio.full_identity(st)


def _version(package_dir: Path, notes: list[str]) -> tuple[str | None, Path | None]:
    own = package_dir / "_version.py"
    text = _read_regular(own, notes)
    if text is not None:
        value = _assigned_version(text)
        if value:
            return value, own
        notes.append(f"{own} sets no __version__")
    found: dict[str, Path] = {}
    try:
        siblings = sorted(package_dir.parent.iterdir())
    except OSError:
        siblings = []
    for entry in siblings:
        name = entry.name
        meta = None
        if name.endswith(".dist-info") and name.split("-", 1)[0].lower() in _DIST_NAMES:
            meta = entry / "METADATA"
        elif (
            name.endswith(".egg-info")
            and name.removesuffix(".egg-info").split("-", 1)[0].lower() in _DIST_NAMES
        ):
            meta = entry / "PKG-INFO"
        if meta is None:
            continue
        text = _read_regular(meta, notes)
        value = _metadata_version(text) if text is not None else None
        if value:
            found.setdefault(value, meta)
    if len(found) == 1:
        ((value, meta),) = found.items()
        return value, meta
    if len(found) > 1:
        notes.append(
            "several aiter versions are recorded beside the package ("
            + ", ".join(f"{v} in {p.parent.name}" for v, p in sorted(found.items()))
            + "): the version does not decide"
        )
    return None, None


def _assigned_version(text: str) -> str | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        value = getattr(node, "value", None)
        if (
            any(isinstance(t, ast.Name) and t.id in {"__version__", "version"} for t in targets)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            return value.value.strip() or None
    return None


def _metadata_version(text: str) -> str | None:
    for line in text.splitlines():
        if not line.strip():
            return None  # the headers end at the first empty line
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "version":
            return value.strip() or None
    return None


def _read_regular(path: Path, notes: list[str]) -> str | None:
    """The text of ``path`` when it is a regular file; None (and a note on errors) otherwise."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(f"cannot read {path}: {exc.strerror or exc}")
        return None
    if not stat.S_ISREG(st.st_mode):
        notes.append(f"{path} is not a regular file: not read")
        return None
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        notes.append(f"cannot read {path}: {exc.strerror or exc}")
        return None
    if len(data) > MAX_BYTES:
        notes.append(f"{path} is over {MAX_BYTES} bytes: not read")
        return None
    return data.decode("utf-8", errors="replace")
