"""Every path an installed file names exists on an installed host: the built .deb's README,
docs, man pages, settings template, examples, unit, completions and maintainer scripts name
installed paths (``/usr/share/doc/hal0-reconciler/rule.md.gz``), never the source tree's place of
a file the package installs (``docs/rule.md``, ``packaging/prometheus/``).

Built with packaging/build-deb (tests skipped: a few seconds), read with dpkg-deb -c/-x/-e.
Skipped, saying why, without the build tools."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.hosts import REPO

pytestmark = pytest.mark.timeout(600)
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEB_BUILD_OPTIONS": "nocheck"}
# the package's own places: a path under one of these must be in the package
OWN = (
    "/usr/share/doc/hal0-reconciler",
    "/usr/share/hal0-reconciler",
    "/usr/lib/python3/dist-packages/hal0_reconciler",
    "/lib/systemd/system/hal0-reconciler",
    "/usr/lib/systemd/system/hal0-reconciler",
    "/usr/bin/hal0-reconciler",
    "/usr/share/man/man5/hal0-reconciler",
    "/usr/share/man/man8/hal0-reconciler",
    "/usr/share/bash-completion/completions/hal0-reconciler",
    "/usr/share/zsh/vendor-completions/_hal0-reconciler",
)
ABSOLUTE = re.compile(r"(?<![\w.-])/(?:usr|lib)/[\w.@/+-]*[\w/]")
# a path of this project's source tree (hal0's own `src/hal0/...` is another project's)
RELATIVE = re.compile(
    r"(?<![\w/.-])(?:tests|docs|packaging|src/hal0_reconciler|systemd|\.ci)/[\w.@/-]*[\w/]"
)
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")


def _missing() -> str | None:
    for tool, package in (("dpkg-buildpackage", "dpkg-dev"), ("dh", "debhelper")):
        if shutil.which(tool) is None:
            return f"no {tool} (Debian package {package}; tests/run installs it as root)"
    done = subprocess.run(
        ["/usr/bin/python3", "-c", "import hatchling"], capture_output=True, check=False
    )
    if done.returncode != 0:
        return "no Debian python3-hatchling (apt-get build-dep ./packaging)"
    return None


MISSING = _missing()


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """The .deb extracted (control scripts in DEBIAN/) and every path it installs."""
    if MISSING is not None:
        pytest.skip(f"installed paths: {MISSING}")
    out = tmp_path_factory.mktemp("deb")
    done = subprocess.run(
        [str(REPO / "packaging/build-deb"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=CLEAN_ENV,
    )
    assert 0 == done.returncode, done.stderr[-3000:]
    deb = done.stdout.strip().splitlines()[-1]
    root = out / "root"
    for flag, where in (("-x", root), ("-e", root / "DEBIAN")):
        subprocess.run(["dpkg-deb", flag, deb, str(where)], check=True, timeout=60)
    listing = subprocess.run(
        ["dpkg-deb", "-c", deb], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    paths = {line.split()[5].removeprefix(".").rstrip("/") for line in listing.splitlines()}
    return root, paths - {""}


def installed_texts(root: Path) -> dict[str, str]:
    """Every installed file a person or a shell reads, by its installed path, uncompressed."""
    found: dict[str, str] = {}
    patterns = (
        "usr/share/doc/hal0-reconciler/**/*",
        "usr/share/hal0-reconciler/*",
        "usr/share/man/*/hal0-reconciler*",
        "lib/systemd/system/*",
        "usr/share/bash-completion/completions/*",
        "usr/share/zsh/vendor-completions/*",
        "usr/bin/hal0-reconciler",
        "DEBIAN/p*",
    )
    for pattern in patterns:
        for path in root.glob(pattern):
            if not path.is_file() or path.name == "copyright":
                continue
            data = path.read_bytes()
            if path.suffix == ".gz":
                data = gzip.decompress(data)
            found["/" + str(path.relative_to(root))] = data.decode()
    return found


def exists(paths: set[str], path: str) -> bool:
    """On the installed host: ``/lib`` is ``/usr/lib`` (Debian 12's merged /usr)."""
    path = path.rstrip("/")
    candidates = {path, path.removeprefix("/usr")} if path.startswith("/usr/lib/") else {path}
    return bool(candidates & paths)


def test_every_installed_path_an_installed_file_names_is_in_the_package(
    unpacked: tuple[Path, set[str]],
) -> None:
    """Each path under the package's own places (docs, template, code, unit, man pages,
    completions) that an installed file names is one the package installs."""
    root, paths = unpacked
    texts = installed_texts(root)
    assert "/usr/share/doc/hal0-reconciler/README.md.gz" in texts
    missing = []
    for name, text in texts.items():
        named = ABSOLUTE.findall(text.replace("\\-", "-").replace("\\fR", " "))
        missing += [f"{name}: {p}" for p in named if p.startswith(OWN) and not exists(paths, p)]
    assert [] == missing


def test_every_link_in_an_installed_document_is_a_url_an_anchor_or_an_installed_file(
    unpacked: tuple[Path, set[str]],
) -> None:
    """README and docs/*.md as installed: a relative link (``docs/rule.md``) would point
    nowhere on the host; each is an installed path (``.gz`` where dh_compress compressed it)."""
    root, paths = unpacked
    broken = []
    for name, text in installed_texts(root).items():
        if not name.endswith((".md", ".md.gz")):
            continue
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:|#", target):
                continue
            if not (target.startswith("/") and exists(paths, target.partition("#")[0])):
                broken.append(f"{name}: {target}")
    assert [] == broken


def _shipped(paths: set[str], source: str) -> bool:
    """Whether the package installs the source-tree file (or a file of the folder) ``source``."""
    names = {Path(p).name.removesuffix(".gz") for p in paths}
    where = REPO / source
    files = [where] if where.is_file() else [p for p in where.rglob("*") if p.is_file()]
    return any(f.name in names and not f.name.startswith("__") for f in files)


def test_no_installed_file_names_the_source_trees_place_of_an_installed_file(
    unpacked: tuple[Path, set[str]],
) -> None:
    """``(alerting rules: packaging/prometheus/)`` in the template, ``docs/rule.md`` in the
    README: each is rewritten to where the package puts it. What remains names a file only the
    source tree has (``tests/run``), really there, in a document that says such paths are the
    source tree's."""
    root, paths = unpacked
    wrong, dangling, unexplained = [], [], []
    for name, text in installed_texts(root).items():
        for source in set(RELATIVE.findall(text)):
            if _shipped(paths, source):
                wrong.append(f"{name}: {source}")
            elif not (REPO / source).exists():
                dangling.append(f"{name}: {source}")
            elif "source tree" not in text:
                unexplained.append(f"{name}: {source}")
    assert {"wrong": [], "dangling": [], "unexplained": []} == {
        "wrong": wrong,
        "dangling": dangling,
        "unexplained": unexplained,
    }
    template = texts_of(root, "/usr/share/hal0-reconciler/reconciler.toml")
    assert "(alerting rules: /usr/share/doc/hal0-reconciler/examples/)" in template


def texts_of(root: Path, name: str) -> str:
    return installed_texts(root)[name]
