"""Frozen settings: defaults that match a real hal0 install, a TOML file, command-line overrides.

Field names equal the TOML keys. ``load()`` is this module's only I/O. Every host path is a
setting, so tests run against temp dirs. An unknown key is an error that names the key.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

from hal0_reconciler.boundedread import ReadRefused, read_bounded
from hal0_reconciler.errors import SettingsError, SettingsFileError

_T = TypeVar("_T")


class RestartFallback(enum.StrEnum):
    """What to do with an active slot whose label changed when hal0's API cannot restart it."""

    STOP = "stop"
    NONE = "none"


class LogFormat(enum.StrEnum):
    AUTO = "auto"  # journal under systemd (JOURNAL_STREAM), else console (json only if asked)
    CONSOLE = "console"
    JSON = "json"
    JOURNAL = "journal"


def hal0_root() -> Path:
    """``$HAL0_HOME`` when set and not blank (every hal0 root moves under it), else ``/``."""
    home = os.environ.get("HAL0_HOME", "")
    return Path(home) if home.strip() else Path("/")


def hal0_lib() -> Path:
    """hal0's shipped tree: ``/usr/lib/hal0``, or ``$HAL0_HOME/usr-lib/hal0`` (hal0's layout)."""
    home = os.environ.get("HAL0_HOME", "")
    return Path(home) / "usr-lib/hal0" if home.strip() else Path("/usr/lib/hal0")


def hal0_var_lib() -> Path:
    """hal0's state root: ``/var/lib/hal0``, or ``$HAL0_HOME/var-lib/hal0`` (hal0's layout)."""
    home = os.environ.get("HAL0_HOME", "")
    return Path(home) / "var-lib/hal0" if home.strip() else Path("/var/lib/hal0")


def default_config_path() -> Path:
    return hal0_root() / "etc/hal0/reconciler.toml"


@dataclass(frozen=True, kw_only=True)
class AiterTree:
    """One aiter install and the environments that boot from it."""

    package_dir: Path  # the installed `aiter/` package folder; its `configs/` holds the tables
    name: str = ""  # label in logs and reports; empty: the package folder
    jit_dir: Path | None = None  # None: aiter's own rule ($AITER_JIT_DIR, <pkg>/jit, ~/.aiter/jit)
    target: str = "auto"  # "auto" (KFD topology, GPU_ARCHS / CU_NUM) or "gfx942:304"
    base_env: dict[str, str] = field(default_factory=dict)
    slot_envs: bool = True  # also check every slot whose [server].env sets AITER_* variables
    routing_version: str = ""  # aiter version key in the routing data; empty: its `default`


@dataclass(frozen=True, kw_only=True)
class AiterSettings:
    """The ``[aiter]`` table: the trees to check and how to heal them."""

    trees: tuple[AiterTree, ...] = ()
    heal: bool = True  # the daemon invalidates stale modules; False: report only
    heal_shape_keyed: bool = False  # deprecated in 0.2.0, ignored (warned about when set)
    keep_quarantines: int = 3
    routing_file: Path | None = None  # operator override of the shipped routing data
    kfd_topology_dir: Path = Path("/sys/class/kfd/kfd/topology/nodes")
    settle_window: float = 2.0
    table_max_bytes: int = 64 << 20  # a larger tuned table is refused, never read
    table_max_rows: int = 200_000  # a table of more lines is refused, never parsed
    child_timeout: float = 10.0  # seconds the owner's child has to answer each request
    module_max_bytes: int = 1 << 30  # a larger module is not checked (degraded), never read
    check_budget: float = 30.0  # seconds one aiter check may take before the rest waits


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the reconciler reads from its configuration. Immutable once loaded."""

    # hal0 paths
    slots_dir: Path = field(default_factory=lambda: hal0_root() / "etc/hal0/slots")
    lock_file: Path | None = None  # None: hal0's sibling lock file `<slots_dir>.lock`
    lock_timeout: float = 10.0
    slot_max_bytes: int = 16384  # a larger slot file is reported, never parsed
    profiles_file: Path = field(default_factory=lambda: hal0_root() / "etc/hal0/profiles.toml")
    # what the installed hal0 believes about images (read from its files; None: read)
    hal0_venv: Path = field(default_factory=lambda: hal0_lib() / "venv")
    hal0_release_dir: Path = field(default_factory=lambda: hal0_lib() / "current")
    hal0_config_file: Path = field(default_factory=lambda: hal0_root() / "etc/hal0/hal0.toml")
    manifest_file: Path | None = None  # None: the installed release's own search order
    restore_marker: Path = field(
        default_factory=lambda: hal0_var_lib() / "runner-migration.restored"
    )  # hal0 1.4+'s downgrade restore marker (its conversion stands down while it holds)
    assume_hal0: str | None = None  # what-if: judge by this hal0 release's rules, not the installed
    vulkan_validated_images: tuple[str, ...] | None = None  # overrides VULKAN_CAPABLE_IMAGE_REFS
    stale_images: tuple[str, ...] | None = None  # overrides STALE_ROCMFPX_IMAGE_REFS
    default_runner_image: str | None = None  # overrides DEFAULT_ROCMFPX_IMAGE
    # host facts
    service_user: str = "auto"  # "auto": as the slot services run; a name or "uid[:gid[:g1,...]]"
    slot_unit_dirs: tuple[Path, ...] = (
        Path("/etc/containers/systemd"),
        Path("/etc/systemd/system/hal0-slot@.service.d"),
    )  # where a User= for hal0-slot@ units would be set (none: root, as rootful Podman runs them)
    kfd_path: Path = Path("/dev/kfd")
    dri_dir: Path = Path("/dev/dri")
    amdgpu_module_dir: Path = Path("/sys/module/amdgpu")
    probe_timeout: float = 5.0
    # the reconciler's own folders
    state_dir: Path = Path("/var/lib/hal0-reconciler")
    runtime_dir: Path = Path("/run/hal0-reconciler")
    # the daemon loop
    resync_interval: float = 300.0
    settle_window: float = 0.2
    settle_cap: float = 2.0
    demote_grace: float = 60.0
    fight_limit: int = 3
    fight_window: float = 600.0
    watch_dev: bool = True
    stuck_after: float = 120.0  # a pass or restart running longer is "stuck": WATCHDOG=1 stops
    # restarting what changed
    api_url: str = "http://127.0.0.1:8080"
    api_env_file: Path = field(default_factory=lambda: hal0_root() / "etc/hal0/api.env")
    api_timeout: float = 3.0
    restart_fallback: RestartFallback = RestartFallback.NONE
    restart_min_interval: float = 60.0
    systemctl: str = "systemctl"
    restart_timeout: float | None = None  # None: the installed hal0 release's restart budget
    busy_bound: float = 1800.0  # a slot busy this long: degraded (and still waited for)
    restart_busy: bool = False  # past busy_bound, restart a busy slot anyway (opt-in)
    idle_confirm: float = 10.0  # no load counters: idle in two reads this far apart
    idle_recheck: float = 5.0  # a busy slot is looked at again this often
    api_wait_bound: float = 600.0  # hal0-api not answering this long: unavailable, fallback
    warming_recheck: float = 600.0  # a restart left warming (or unanswered): looked at once then
    hal0_api_unit: str = "hal0-api.service"
    hal0_api_user: str = "auto"  # "auto": the User= of hal0_api_unit (hal0 when none is read)
    hal0_api_unit_dirs: tuple[Path, ...] = (
        Path("/etc/systemd/system"),
        Path("/run/systemd/system"),
        Path("/usr/lib/systemd/system"),
        Path("/lib/systemd/system"),
    )
    update_jobs_dir: Path = field(default_factory=lambda: hal0_var_lib() / "update-jobs")
    update_job_max_age: float = 7200.0  # an older queued/running job is a crashed update
    # slot names or ids the reconciler never relabels or restarts (blanks stripped, empties dropped)
    hands_off: frozenset[str] = frozenset()
    quadlet_dir: Path = field(default_factory=lambda: hal0_root() / "etc/containers/systemd")
    apply_others_labels: bool = False  # restart for a label another writer set (an operator)
    restart_concurrency: int = 1  # restarts at once per host (each load can evict idle slots)
    # reporting
    metrics_textfile: Path | None = None
    log_format: LogFormat = LogFormat.AUTO
    log_level: str = "info"
    # aiter registry self-heal
    aiter: AiterSettings = field(default_factory=AiterSettings)

    @property
    def effective_lock_file(self) -> Path:
        return self.lock_file if self.lock_file is not None else Path(f"{self.slots_dir}.lock")


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric setting (both ends included)."""

    low: float
    high: float
    unit: str = "seconds"

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int | float) and self.low <= value <= self.high  # nan: False

    def __str__(self) -> str:
        return f"{self.low:g} to {self.high:g}" + (f" {self.unit}" if self.unit else "")


# Every numeric setting has a range (dotted names for nested tables): a zero interval busy-loops,
# a negative window means nothing. tests/unit/test_settings_ranges.py checks none is missing.
RANGES: dict[str, Range] = {
    "lock_timeout": Range(0.1, 3600),
    "slot_max_bytes": Range(1024, 1 << 20, "bytes"),
    "probe_timeout": Range(0.5, 300),
    "resync_interval": Range(0.5, 86400),
    "settle_window": Range(0.01, 60),
    "settle_cap": Range(0.01, 600),
    "demote_grace": Range(0, 86400),
    "fight_limit": Range(1, 1000, "relabels"),
    "fight_window": Range(1, 86400),
    "stuck_after": Range(0.5, 86400),
    "api_timeout": Range(0.1, 300),
    "restart_min_interval": Range(0, 86400),
    "restart_timeout": Range(1, 86400),
    "busy_bound": Range(0, 7 * 86400),
    "idle_confirm": Range(0, 3600),
    "idle_recheck": Range(0.05, 3600),
    "api_wait_bound": Range(0, 86400),
    "warming_recheck": Range(0.05, 86400),
    "update_job_max_age": Range(1, 30 * 86400),
    "restart_concurrency": Range(1, 8, "restarts"),
    "aiter.keep_quarantines": Range(0, 1000, "quarantines"),
    "aiter.settle_window": Range(0.01, 600),
    "aiter.table_max_bytes": Range(1024, 1 << 30, "bytes"),
    "aiter.table_max_rows": Range(100, 10_000_000, "rows"),
    "aiter.child_timeout": Range(0.5, 600),
    "aiter.module_max_bytes": Range(1 << 20, 1 << 40, "bytes"),
    "aiter.check_budget": Range(1, 3600),
}

# Text settings with a closed set of values (enum settings list theirs themselves).
CHOICES: dict[str, tuple[str, ...]] = {
    "log_level": ("debug", "info", "warning", "error"),
}


# Settings removed or renamed in a release (dotted name -> what to do instead): a file that
# still sets one is accepted for one release with a deprecation warning, never refused after an
# upgrade. A name that is a current setting again is never dropped.
REMOVED: dict[str, str] = {}

# Settings still read but without effect (dotted name -> the release that removes them, what to
# do instead): warned about at every load of the file, from the file or ``--set``, never refused.
DEPRECATED: dict[str, tuple[str, str]] = {
    "aiter.heal_shape_keyed": (
        "0.4.0",
        "it has had no effect since 0.2.0 (a shape-keyed module is never healed): remove it",
    ),
}


@dataclass(frozen=True)
class Loaded:
    """What ``read`` found: the settings, the file they came from (None: no file, defaults),
    and one warning line per removed setting the file or the command line still sets."""

    settings: Settings
    path: Path | None
    deprecated: tuple[str, ...] = ()


def load(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Read settings from ``path`` (default: /etc/hal0/reconciler.toml when it exists).

    ``overrides`` (from the command line) win over the file; keys are field names.
    An explicitly given ``path`` must exist. Raises SettingsError naming the bad key.
    """
    return read(path, overrides).settings


def read(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Loaded:
    """``load`` with what the command line reports: the file read and the deprecated settings.

    Raises SettingsFileError when the file is to blame (missing when named, unreadable, not
    TOML, a bad key or value: the message starts with its path), SettingsError when only the
    command line's overrides are (a bad ``--set`` value: a usage error)."""
    raw: dict[str, Any] = {}
    source: Path | None = None
    if path is None:
        candidate = default_config_path()
        found = _read_toml(candidate, missing_ok=True)
        if found is not None:
            source, raw = candidate, found
    else:
        source, raw = path, _read_toml(path) or {}
    merged = dict(raw)
    _merge(merged, overrides or {})
    deprecated = _drop_removed(merged, source) + _deprecated(raw, overrides or {}, source)
    try:
        built = _validated(merged)
    except SettingsError as exc:
        if source is None:
            raise
        if overrides:  # blame the file only when it is wrong by itself
            try:
                _validated(_without_removed(raw))
            except SettingsError:
                pass
            else:
                raise
        raise SettingsFileError(f"{source}: {exc}") from None
    return Loaded(built, source, deprecated)


def without_file(overrides: Mapping[str, Any]) -> Settings:
    """The defaults and ``overrides`` only: what ``status`` and ``reload`` run on while the
    settings file is invalid. SettingsError (a usage error) when an override is bad."""
    raw: dict[str, Any] = {}
    _merge(raw, overrides)
    _drop_removed(raw, None)
    return _validated(raw)


def _validated(raw: dict[str, Any]) -> Settings:
    built = _build(Settings, raw, where="")
    if built.settle_cap < built.settle_window:
        raise SettingsError(
            f"setting 'settle_cap' = {built.settle_cap:g} is out of range: allowed "
            f"{built.settle_window:g} (settle_window) to {RANGES['settle_cap'].high:g} seconds"
        )
    return built


def _without_removed(raw: dict[str, Any]) -> dict[str, Any]:
    copy = dict(raw)
    _drop_removed(copy, None)
    return copy


def _drop_removed(raw: dict[str, Any], source: Path | None) -> tuple[str, ...]:
    """Take the removed settings out of ``raw`` (tables copied, never changed in place); one
    warning line for each."""
    lines: list[str] = []
    current: set[str] | None = None
    for name, advice in REMOVED.items():
        *tables, leaf = name.split(".")
        holder: Any = raw
        for table in tables:
            holder = holder.get(table) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or leaf not in holder:
            continue
        current = set(setting_names()) if current is None else current
        if name in current:
            continue
        _pop_copied(raw, [*tables, leaf])
        where = f" in {source}" if source is not None else ""
        lines.append(f"setting {name!r}{where} was removed and is ignored: {advice}")
    return tuple(lines)


def _lookup(raw: Mapping[str, Any], name: str) -> bool:
    """Whether the dotted ``name`` is set in ``raw`` (nested tables followed)."""
    *tables, leaf = name.split(".")
    holder: Any = raw
    for table in tables:
        holder = holder.get(table) if isinstance(holder, Mapping) else None
    return isinstance(holder, Mapping) and leaf in holder


def _deprecated(
    raw: Mapping[str, Any], overrides: Mapping[str, Any], source: Path | None
) -> tuple[str, ...]:
    """One warning line per deprecated setting the file or the command line sets."""
    lines: list[str] = []
    for name, (removed_in, advice) in DEPRECATED.items():
        places = [f"in {source}"] if source is not None and _lookup(raw, name) else []
        places += ["by --set"] if _lookup(overrides, name) else []
        lines += [
            f"setting {name!r} {where} is deprecated and ignored; {removed_in} removes it: {advice}"
            for where in places
        ]
    return tuple(lines)


def _pop_copied(raw: dict[str, Any], keys: list[str]) -> None:
    if len(keys) == 1:
        raw.pop(keys[0], None)
        return
    inner = dict(raw[keys[0]])
    raw[keys[0]] = inner
    _pop_copied(inner, keys[1:])


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    """Overrides win key by key; a nested table (``aiter``) is merged, not replaced."""
    for key, value in extra.items():
        if value is None:
            continue
        current = base.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged = dict(current)
            _merge(merged, value)
            base[key] = merged
        else:
            base[key] = value


def setting_names(cls: type[Any] = Settings, where: str = "") -> list[str]:
    """Every settable name, nested ones dotted (``aiter.heal``)."""
    names: list[str] = []
    for f in dataclasses.fields(cls):
        hint = _hint(cls, f.name)
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            names += setting_names(hint, f"{where}{f.name}.")
        else:
            names.append(where + f.name)
    return names


def changed(old: Any, new: Any, where: str = "") -> list[str]:
    """The settings whose values differ between two Settings (nested ones dotted), in field
    order: what a reload says it changed."""
    names: list[str] = []
    for f in dataclasses.fields(old):
        before, after = getattr(old, f.name), getattr(new, f.name)
        if dataclasses.is_dataclass(before) and not isinstance(before, type):
            names += changed(before, after, f"{where}{f.name}.")
        elif before != after:
            names.append(where + f.name)
    return names


def _unknown(name: str) -> SettingsError:
    names = setting_names()
    leaf = name.rpartition(".")[2]
    close = [n for n in names if n.rpartition(".")[2] == leaf]  # the right key, wrong table
    if not close:
        import difflib  # noqa: PLC0415 - only for this message

        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return SettingsError(f"unknown setting {name!r}{hint}")


SETTINGS_MAX_BYTES = 1 << 20
"""The cap on the settings file (the documented example is ~10 KB)."""


def _read_toml(path: Path, *, missing_ok: bool = False) -> dict[str, Any] | None:
    """The settings file's table: a regular file (a link to one is followed: the operator's),
    never a FIFO or a device, at most ``SETTINGS_MAX_BYTES``; missing → None when allowed.
    SettingsFileError (naming the path) when it cannot be had."""
    try:
        data = read_bounded(
            path, max_bytes=SETTINGS_MAX_BYTES, follow_links=True, missing_ok=missing_ok
        )
    except ReadRefused as exc:
        if exc.reason.startswith("missing"):
            raise SettingsFileError(f"{path}: settings file not found") from None
        raise SettingsFileError(f"{path}: cannot read the settings file: {exc.reason}") from None
    if data is None:
        return None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SettingsFileError(f"{path}: the settings file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsFileError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise SettingsFileError(f"{path}: not valid TOML: nested too deeply") from None


def _build(cls: type[_T], raw: Mapping[str, Any], *, where: str) -> _T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            raise _unknown(where + key)
        kwargs[key] = _coerce(_hint(cls, key), value, name=f"{where}{key}")
    return cls(**kwargs)


_HINTS: dict[tuple[type[Any], str], Any] = {}


def _hint(cls: type[Any], name: str) -> Any:
    """The type of one field (what ``typing.get_type_hints`` gives for it), evaluated only when
    that field is set: evaluating all of them costs more than the rest of loading."""
    key = (cls, name)
    if key not in _HINTS:
        owner = next(c for c in cls.__mro__ if name in vars(c).get("__annotations__", {}))
        annotation = vars(owner)["__annotations__"][name]
        module = vars(sys.modules[owner.__module__])
        _HINTS[key] = eval(annotation, module) if isinstance(annotation, str) else annotation  # noqa: S307 - our own annotations
    return _HINTS[key]


def _coerce(hint: Any, value: Any, *, name: str) -> Any:
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is not None and type(None) in args:  # X | None
        if value is None or value == "":
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, name=name)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise SettingsError(f"setting {name!r} must be a table")
        return _build(hint, value, where=f"{name}.")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise SettingsError(f"setting {name!r} must be a list")
        return tuple(_coerce(args[0], v, name=f"{name}[{i}]") for i, v in enumerate(value))
    if origin is frozenset:  # a set of names: each stripped once here, empty ones dropped
        if not isinstance(value, list | tuple | set | frozenset):
            raise SettingsError(f"setting {name!r} must be a list")
        items = (_coerce(args[0], v, name=f"{name}[{i}]") for i, v in enumerate(value))
        return frozenset(s for s in (str(v).strip() for v in items) if s)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise SettingsError(f"setting {name!r} must be a table of strings")
        return dict(value)
    try:
        converted = _scalar(hint, value)
    except _BadValue as exc:
        raise SettingsError(f"setting {name!r} has a bad value {value!r}: {exc}") from None
    allowed = RANGES.get(name)
    if allowed is not None and converted not in allowed:
        raise SettingsError(f"setting {name!r} = {converted:g} is out of range: allowed {allowed}")
    choices = CHOICES.get(name)
    if choices is not None and converted not in choices:
        raise SettingsError(
            f"setting {name!r} has a bad value {value!r}: valid values are {', '.join(choices)}"
        )
    return converted


class _BadValue(Exception):
    """A value of the wrong kind; the message says what was expected, for a person."""


_KIND_WORDS = {float: "a number", int: "a whole number", bool: "true or false", str: "text"}


def _scalar(hint: Any, value: Any) -> Any:
    if hint is Path:
        return _path(_expect(value, str))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        valid = [str(m.value) for m in hint]
        if value not in valid:
            raise _BadValue(f"valid values are {', '.join(valid)}")
        return hint(value)
    if hint in _KIND_WORDS:
        return _expect(value, hint)
    raise _BadValue(f"unsupported type {hint!r}")  # pragma: no cover


def _path(text: str) -> Path:
    """A path setting; an empty one would silently mean the current directory."""
    if not text.strip():
        raise _BadValue("a path must not be empty")
    return Path(text)


def _expect(value: Any, kind: type) -> Any:
    """``value`` as ``kind``; command-line overrides arrive as text and are converted."""
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        if kind is bool and text in {"true", "false"}:
            return text == "true"
        try:
            if kind is int:
                return int(text)
            if kind is float:
                return float(text)
        except ValueError:
            pass
    elif kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    elif isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise _BadValue(f"expected {_KIND_WORDS.get(kind, kind.__name__)}")
