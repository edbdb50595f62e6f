"""Shared helpers and fixtures (re-exported by conftest.py): real tables, gcc-built modules (built once per session), aiter trees in tmp."""

from __future__ import annotations

import csv
import hashlib
import io
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import tablegen

from hal0_reconciler.aiter.rules import routing
from hal0_reconciler.aiter.rules import sets as aiter_rules
from hal0_reconciler.aiter.tables import rows as tables
from hal0_reconciler.settings import AiterSettings, AiterTree, Settings
from helpers.hosts import SHARED

FIXTURE_CONFIGS = SHARED / "fixtures/aiter/e4048607/aiter/configs"
DATA_CONFIGS = tablegen.WRITTEN_CONFIGS
"""Tables in aiter's format with rows of this project's own making (``tablegen``)."""
GFX950 = tables.Target("gfx950", 256)
GFX942 = tables.Target("gfx942", 80)
BPS = "a8w8_blockscale_bpreshuffle_tuned_gemm"
BPS_CK = "module_gemm_a8w8_blockscale_bpreshuffle"
BPS_CKTILE = "module_gemm_a8w8_blockscale_bpreshuffle_cktile"
OPUS = "module_deepgemm_opus"


@pytest.fixture(scope="session")
def real_configs() -> Path:
    if not FIXTURE_CONFIGS.is_dir():
        pytest.skip(f"real aiter tables not present at {FIXTURE_CONFIGS} (../shared/fixtures)")
    return FIXTURE_CONFIGS


@pytest.fixture(scope="session")
def rules() -> routing.Routing:
    from importlib import resources

    text = resources.files("hal0_reconciler.aiter.rules").joinpath("routing.toml").read_text()
    return routing.parse_routing(text)


@pytest.fixture(scope="session")
def book() -> aiter_rules.RuleBook:
    from importlib import resources

    text = resources.files("hal0_reconciler.aiter.rules").joinpath("rules.toml").read_text()
    return aiter_rules.parse_rules(text)


AT_E4048607 = "v0.1.15-e4048607"
"""The rule set of the revision the fixture tables come from (the newest verified)."""
OLDER = "v0.1.7-v0.1.11"


def ruleset(book: aiter_rules.RuleBook, name: str) -> aiter_rules.RuleSet:
    return next(s for s in book.sets if s.name == name)


def route_of(rules: routing.Routing, stem: str) -> routing.TableRoute:
    return next(t for t in rules.tables if t.stem == stem)


def names_for(configs: Path, rules: routing.Routing, target: tables.Target) -> dict[str, set[str]]:
    """module → names the committed tables (default + overlays) route to it for ``target``."""
    out: dict[str, set[str]] = {}
    for path in [configs / f"{BPS}.csv", *sorted((configs / "model_configs").glob(f"*{BPS}*.csv"))]:
        if "untuned" in path.name:
            continue
        table = tables.parse_table(
            path.read_bytes(), route=route_of(rules, BPS), targets=frozenset({target})
        )
        for row in table.rows:
            out.setdefault(row.module, set()).add(row.name)
    return out


class SoBuilder:
    """Builds name-keyed modules with gcc: each registered kernel name a NUL-terminated string
    literal, as the ``string_view -> function`` map of aiter's name-keyed generators leaves it."""

    def __init__(self, root: Path) -> None:
        if shutil.which("gcc") is None:
            pytest.skip("gcc is not installed")
        self.root = root
        self.count = 0

    def build(
        self, names: Iterable[str], *, flags: tuple[str, ...] = ("-O0",), pad_bytes: int = 0
    ) -> Path:
        self.count += 1
        src = self.root / f"m{self.count}.c"
        lines = ",\n".join(f'  "{n}"' for n in sorted(names))
        pad = f"\n__attribute__((used)) const char pad[{pad_bytes}] = {{1}};" if pad_bytes else ""
        src.write_text(
            "__attribute__((used)) const char *const registered_names[] = {\n"
            f"{lines}\n}};\n{pad}\n"
        )
        out = self.root / f"m{self.count}.so"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", *flags, "-o", str(out), str(src)], check=True, timeout=600
        )
        return out


ShapeEntry = tuple[tuple[str, ...], str]
"""One entry of a shape-keyed module's lookup: its key ((gfx,) cu_num, (B,) M, N, K) as text,
and the kernel name the generator instantiates for it."""


class ShapeModuleBuilder:
    """Builds shape-keyed modules the way aiter's generators lay them out: a lookup table of
    ``{"gfx", cu, (B,) M, N, K} -> kernel`` entries, constant-initialised (as aiter's POD
    ``GemmLookupKey`` tables are since #3255), each kernel a template instance whose only trace
    of its name is the mangled ``_Z<len><name>IfE...`` symbol, never a NUL-terminated string.
    Written in C with the C++ symbol names given as asm labels (gcc compiles it in a blink; a
    real table has hundreds of entries); cached by content for the session."""

    def __init__(self, root: Path) -> None:
        if shutil.which("gcc") is None:
            pytest.skip("gcc is not installed")
        self.root = root
        self._built: dict[str, Path] = {}

    def build(self, entries: Iterable[ShapeEntry], *, flags: tuple[str, ...] = ("-O0",)) -> Path:
        items = sorted(set(entries))
        kernels = sorted({_identifier(name) for _, name in items}) or ["hal0_placeholder_kernel"]
        width = max((len(key) for key, _ in items), default=5)
        ints = width - 1
        lines = [
            "typedef int (*fn)(int);",
            f"struct entry {{ const char *gfx; unsigned long gfx_len; int v[{ints}]; fn kernel; }};",
        ]
        index = {}
        for n, k in enumerate(kernels):
            index[k] = n
            mangled = f"_Z{len(k)}{k}IfEii"
            lines.append(f'int k{n}(int m) __asm__("{mangled}");')
            lines.append(f"int k{n}(int m) {{ return m + {n}; }}")
        lines.append(f"const struct entry hal0_lookup_table[{max(len(items), 1)}] = {{")
        for key, name in items:
            gfx, *rest = (*key, *("0",) * (width - len(key)))
            values = ", ".join(str(int(float(v))) for v in rest)
            lines.append(f'  {{"{gfx}", {len(gfx)}, {{{values}}}, k{index[_identifier(name)]}}},')
        lines.append("};")
        source = "\n".join(lines) + "\n"
        digest = hashlib.sha256((source + repr(flags)).encode()).hexdigest()[:16]
        out = self._built.get(digest)
        if out is None:
            src = self.root / f"shape-{digest}.c"
            src.write_text(source)
            out = self.root / f"shape-{digest}.so"
            subprocess.run(
                ["gcc", "-shared", "-fPIC", *flags, "-o", str(out), str(src)],
                check=True,
                timeout=600,
            )
            self._built[digest] = out
        return out


def _identifier(name: str) -> str:
    """A kernel name as a C++ identifier (real names already are; others are made so)."""
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name.strip()) or "unnamed"
    return text if not text[0].isdigit() else f"k_{text}"


@pytest.fixture(scope="session")
def shape_builder(tmp_path_factory: pytest.TempPathFactory) -> ShapeModuleBuilder:
    return ShapeModuleBuilder(tmp_path_factory.mktemp("shape-so"))


@pytest.fixture(scope="session")
def so_builder(tmp_path_factory: pytest.TempPathFactory) -> SoBuilder:
    return SoBuilder(tmp_path_factory.mktemp("so"))


@pytest.fixture(scope="session")
def built_modules(so_builder: SoBuilder, rules: routing.Routing) -> dict[str, Path]:
    """Healthy gfx950:256 modules for the committed tables, plus a stale ck module (3 names short)."""
    need = names_for(DATA_CONFIGS, rules, GFX950)
    ck = sorted(need[BPS_CK])
    return {
        BPS_CK: so_builder.build(ck),
        BPS_CKTILE: so_builder.build(need[BPS_CKTILE]),
        "stale_ck": so_builder.build(ck[3:]),
        "stale_cktile": so_builder.build(sorted(need[BPS_CKTILE])[1:]),
    }


def csv_text(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


TreeFactory = Callable[..., "Tree"]


class Tree:
    """An aiter install in tmp: package/configs (copied), package/jit with modules and build dirs."""

    def __init__(self, root: Path, configs_from: Path) -> None:
        self.root = root
        self.package = root / "site-packages" / "aiter"
        self.configs = self.package / "configs"
        shutil.copytree(configs_from, self.configs)
        self.jit = self.package / "jit"
        (self.jit / "build").mkdir(parents=True)
        self.state = root / "state"
        self.slots = root / "slots"
        self.slots.mkdir()

    def install(self, module: str, so: Path) -> Path:
        """Put ``so`` in place as ``module`` with a build folder, like a finished aiter build.

        The module appears whole (copied beside it, then renamed): a real build writes it while
        holding aiter's build lock, which the heal respects; a half-copied file with no lock
        would be a state no real build shows, and a watching daemon could catch it mid-copy.
        """
        dst = self.jit / f"{module}.so"
        part = dst.with_name(f".{dst.name}.part")
        shutil.copyfile(so, part)
        part.rename(dst)
        blob = self.jit / "build" / module / "blob"
        blob.mkdir(parents=True, exist_ok=True)
        (blob / "gen.cpp").write_text(f"// generated for {module}\n")
        return dst

    def version(self, version: str) -> None:
        """Say which aiter this is, as setuptools_scm does (``aiter/_version.py``)."""
        (self.package / "_version.py").write_text(f"__version__ = {version!r}\n")

    def settings(
        self, *, target: str = "gfx950:256", env: dict[str, str] | None = None, **options: object
    ) -> Settings:
        tree = AiterTree(package_dir=self.package, target=target, base_env=dict(env or {}))
        return Settings(
            slots_dir=self.slots,
            state_dir=self.state,
            aiter=AiterSettings(trees=(tree,), **options),
        )  # type: ignore[arg-type]


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[..., Tree]:
    def make(configs_from: Path = DATA_CONFIGS) -> Tree:
        return Tree(tmp_path / "tree", configs_from)

    return make


@pytest.fixture
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process scans see nothing (the test host's own compilers must not block heals)."""
    import psutil  # heal imports it when it scans

    monkeypatch.setattr(psutil, "process_iter", lambda *_a, **_k: iter(()))
