"""What a packager gets: licence, versions, the sdist, the man pages, the one test command."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
from pathlib import Path

import pytest

from hal0_reconciler import __version__, cli
from hal0_reconciler import settings as settings_mod
from hal0_reconciler.cli import exits
from helpers.hosts import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
MAN8 = REPO / "packaging/man/hal0-reconciler.8"
MAN5 = REPO / "packaging/man/hal0-reconciler.toml.5"
DEBIAN_PYTHON = Path("/usr/bin/python3")


def test_the_licence_is_mit_in_spdx_form_with_its_text() -> None:
    assert "MIT" == PYPROJECT["project"]["license"]
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License")
    assert "Permission is hereby granted, free of charge" in text
    assert "License: MIT" in (REPO / "packaging/debian/copyright").read_text()


def test_the_debian_changelog_is_at_the_package_version() -> None:
    first = (REPO / "packaging/debian/changelog").read_text().splitlines()[0]
    assert f"hal0-reconciler ({__version__})" in first


def test_the_debian_dependencies_are_the_runtime_dependencies() -> None:
    """Every runtime dependency maps to Debian's python3-<name>, and nothing else is required."""
    control = (REPO / "packaging/debian/control").read_text()
    binary = control[control.index("Package: hal0-reconciler") :]
    depends = re.search(r"^Depends:(.*?)^\S", binary, re.MULTILINE | re.DOTALL)
    assert depends is not None
    names = {n.strip().rstrip(",") for n in depends[1].split() if n.startswith("python3-")}
    wanted = {
        "python3-" + re.split(r"[<>=!~ ]", d)[0].lower()
        for d in PYPROJECT["project"]["dependencies"]
    }
    assert wanted == names
    assert re.search(r"^Recommends: python3-systemd,?$", binary, re.MULTILINE)


def _build(python: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.run(
        [python, "-W", "error", "-m", "hatchling", "build", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


def _check_sdist(out: Path) -> None:
    (sdist,) = out.glob("hal0_reconciler-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "systemd/hal0-reconciler.service",
        "packaging/debian/control",
        "packaging/debian/rules",
        "packaging/build-deb",
        "packaging/man/hal0-reconciler.8",
        "packaging/debian/hal0-reconciler.postinst",
        "packaging/debian/hal0-reconciler.postrm",
        "docs/rule.md",
        "packaging/reconciler.toml.example",
        "tests/run",
        "tests/system/test_in_systemd.py",
        "tests/data/slots/agent.toml",
        "src/hal0_reconciler/aiter/rules/routing.toml",
    ):
        assert needed in names, f"the sdist lacks {needed}"
    assert not [n for n in names if "__pycache__" in n or n.startswith(".venv")]
    (wheel,) = out.glob("hal0_reconciler-*.whl")
    assert wheel.name.startswith(f"hal0_reconciler-{__version__}-")


@pytest.mark.timeout(300)
def test_debian12_hatchling_builds_without_a_warning(tmp_path: Path) -> None:
    """Debian 12's own hatchling (python3-hatchling 1.12) builds sdist and wheel, warnings as
    errors: the SPDX licence string is understood there (setuptools 66 would reject it)."""
    probe = subprocess.run(
        [str(DEBIAN_PYTHON), "-c", "import hatchling"], capture_output=True, check=False
    )
    if not DEBIAN_PYTHON.exists() or probe.returncode != 0:
        pytest.skip("no Debian python3-hatchling here (tests/run installs it on Debian)")
    done = _build(str(DEBIAN_PYTHON), tmp_path)
    assert 0 == done.returncode, done.stderr
    _check_sdist(tmp_path)


@pytest.mark.timeout(300)
def test_the_newest_hatchling_builds_without_a_warning(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin/python")
    got = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--upgrade", "hatchling"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if got.returncode != 0:
        pytest.skip(f"cannot install hatchling from the package index: {got.stderr[-300:]}")
    done = _build(python, tmp_path / "out")
    assert 0 == done.returncode, done.stderr
    _check_sdist(tmp_path / "out")


def _verbs() -> list[str]:
    parser = cli.build_parser()
    verbs = next(a for a in parser._actions if a.dest == "verb")
    found = []
    for name, sub in verbs.choices.items():  # type: ignore[union-attr]
        nested = [a for a in sub._actions if a.dest == "aiter_verb"]
        if nested:
            found += [f"{name} {n}" for n in nested[0].choices]  # type: ignore[union-attr]
        else:
            found.append(name)
    return found


def test_the_man_page_documents_every_verb_and_its_exit_codes() -> None:
    text = MAN8.read_text()
    sections = re.split(r"^\.SH ", text, flags=re.MULTILINE)
    verbs_part = next(s for s in sections if s.startswith("VERBS"))
    exits_part = next(s for s in sections if s.startswith("EXIT STATUS"))
    for verb in _verbs():
        pattern = rf"^\.(?:B|BI) \"?{re.escape(verb)}\b"
        assert re.search(pattern, verbs_part, re.MULTILINE), f"VERBS lacks {verb}"
        assert re.search(pattern, exits_part, re.MULTILINE), f"EXIT STATUS lacks {verb}"


def test_the_man_page_gives_each_verb_exactly_its_exit_codes() -> None:
    """EXIT STATUS names, per verb, the codes the CLI's own --help table (exits.EXITS) has."""
    exits_part = MAN8.read_text().split(".SH EXIT STATUS", 1)[1].split(".SH ", 1)[0]
    documented = {}
    for block in exits_part.split(".TP\n")[1:]:
        head, _, text = block.partition("\n")
        flat = " ".join(text.split(".PP")[0].split())
        codes = re.findall(r"(?:^|; )(\d+) ", flat)
        documented[head.removeprefix(".B ").strip()] = {int(c) for c in codes}
    expected = {verb: {code for code, _ in codes} for verb, codes in exits.EXITS.items()}
    assert expected == documented


def test_the_settings_man_page_documents_every_setting() -> None:
    text = MAN5.read_text()
    documented = set(re.findall(r"^\\fB(\w+)\\fR = ", text, re.MULTILINE))
    for cls in (settings_mod.Settings, settings_mod.AiterSettings, settings_mod.AiterTree):
        names = {f.name for f in dataclasses.fields(cls)} - {"aiter", "trees"}
        assert names <= documented, f"{cls.__name__}: {sorted(names - documented)}"


@pytest.mark.skipif(sys.platform != "linux", reason="man(1) checks run on Linux")
def test_the_man_pages_render_without_warnings() -> None:
    if not Path("/usr/bin/man").exists():
        pytest.skip("no man(1) here")
    for page in (MAN8, MAN5):
        done = subprocess.run(
            ["man", "--warnings", "-l", str(page)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat"},
        )
        assert (0, "") == (done.returncode, done.stderr.strip()), page.name


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split("this is exactly what `.ci/run` does):", 1)[1]
    command = re.search(r"```sh\n(.*?)\n```", block, re.DOTALL)
    assert command is not None
    ci = (REPO / ".ci/run").read_text().strip().splitlines()[-1]
    assert command[1].strip() == ci
