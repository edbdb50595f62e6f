"""Every document says what the unit and the code do: one metrics path the sandbox lets the
daemon write, the same folders, options and exit codes in the unit, the man pages, the example,
the README and docs/; the README stays an operator's page (under its size)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hal0_reconciler import cli, settings
from hal0_reconciler.cli import parser as cli_parser
from hal0_reconciler.daemon import runner
from helpers.hosts import REPO

UNIT = REPO / "systemd/hal0-reconciler.service"
MAN8 = REPO / "packaging/man/hal0-reconciler.8"
MAN5 = REPO / "packaging/man/hal0-reconciler.toml.5"
EXAMPLE = REPO / "packaging/reconciler.toml.example"
RULES = REPO / "packaging/prometheus/hal0-reconciler.rules.yml"
README = REPO / "README.md"
DEBIAN = REPO / "packaging/debian"
README_LIMIT = 12 * 1024
DOCUMENTS = [README, MAN8, MAN5, EXAMPLE, RULES, *sorted((REPO / "docs").glob("*.md"))]


def text_of(path: Path) -> str:
    """The document as a reader sees it (roff escapes of '-' undone)."""
    return path.read_text().replace("\\-", "-").replace("\\fI", "").replace("\\fR", "")


def directive(name: str) -> list[str]:
    found = []
    for line in UNIT.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#") and key.strip() == name:
            found += value.split()
    return found


def test_every_document_gives_one_metrics_path_and_the_unit_lets_the_daemon_write_it() -> None:
    """The example, both man pages, the alert rules, the README and docs/ name the same metrics
    textfile, and its folder is in the unit's ReadWritePaths=."""
    named = {
        doc.name: set(re.findall(r"(/[\w./-]+)/hal0_reconciler\.prom", text_of(doc)))
        for doc in (README, MAN8, MAN5, EXAMPLE, RULES)
    }
    for doc in DOCUMENTS[5:]:
        named[doc.name] = set(re.findall(r"(/[\w./-]+)/hal0_reconciler\.prom", text_of(doc)))
    folders = set().union(*named.values())
    assert {"/var/lib/prometheus/node-exporter"} == folders, named
    assert all(named[doc.name] for doc in (README, MAN8, MAN5, EXAMPLE, RULES)), named
    writable = {p.lstrip("-") for p in directive("ReadWritePaths")}
    assert folders <= writable


def test_the_unit_the_man_page_and_the_readme_give_the_same_exit_codes() -> None:
    """78 is the CLI's config status and the unit's RestartPreventExitStatus=, 75 the daemon's
    fresh-view status and RestartForceExitStatus=; the man page and the README say both."""
    assert [str(cli.EXIT_CONFIG)] == directive("RestartPreventExitStatus")
    assert [str(runner.EXIT_FRESH_VIEW)] == directive("RestartForceExitStatus")
    man = " ".join(text_of(MAN8).split())
    assert f"RestartPreventExitStatus={cli.EXIT_CONFIG}" in man
    assert f"RestartForceExitStatus={runner.EXIT_FRESH_VIEW}" in man
    readme = " ".join(README.read_text().split())
    assert f"status {cli.EXIT_CONFIG}" in readme
    assert f"exits {runner.EXIT_FRESH_VIEW}" in readme


def test_the_folders_the_unit_makes_are_the_settings_defaults_and_documented() -> None:
    """StateDirectory=/RuntimeDirectory= are the settings' defaults; the man page names both
    and the settings file; the README names the state folder purge removes."""
    defaults = settings.Settings()
    assert [defaults.state_dir.name] == directive("StateDirectory")
    assert [defaults.runtime_dir.name] == directive("RuntimeDirectory")
    man = text_of(MAN8)
    for path in (defaults.state_dir, defaults.runtime_dir, Path("/etc/hal0/reconciler.toml")):
        assert str(path) in man
    assert str(defaults.state_dir) in README.read_text()
    assert EXAMPLE.read_text().startswith("# /etc/hal0/reconciler.toml:")


def cli_options() -> set[str]:
    """Every long option of every verb (the aiter verbs included)."""
    found: set[str] = set()

    def walk(parser: object) -> None:
        for action in parser._actions:  # type: ignore[attr-defined]
            found.update(o for o in action.option_strings if o.startswith("--"))
            choices = getattr(action, "choices", None)
            for sub in choices.values() if isinstance(choices, dict) else ():
                walk(sub)

    walk(cli.build_parser())
    return found - {"--help", "--no-colour"}


COMMON_OPTIONS = ["--config", "--set", "--user", "--log-format", "--log-level"] + [
    "--" + field.replace("_", "-") for field in cli_parser.PATH_FLAGS
]


@pytest.mark.parametrize("option", COMMON_OPTIONS)
def test_the_man_page_and_the_commands_page_document_every_common_option(option: str) -> None:
    """hal0-reconciler(8) OPTIONS and docs/commands.md list each option every verb takes."""
    man = text_of(MAN8).split(".SH OPTIONS", 1)[1].split(".SH ", 1)[0]
    assert re.search(rf"{re.escape(option)}\b", man), f"hal0-reconciler(8) lacks {option}"
    assert f"`{option}`" in (REPO / "docs/commands.md").read_text()


def test_every_option_the_readme_and_the_man_page_name_exists() -> None:
    """No document names an option the command line does not have (other tools' options, in
    their own commands, excepted)."""
    others = {"--reinstall", "--soak", "--man", "--show-cursor", "--help", "--assume"}  # --assume-*
    known = cli_options() | others
    for doc in (README, MAN8, REPO / "docs/commands.md"):
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])", text_of(doc)))
        assert set() == named - known, doc.name


def test_the_template_the_postinst_installs_is_the_one_the_package_ships() -> None:
    """debian/rules installs the example as the template the postinst copies and the postrm
    compares; the man page names it."""
    template = "usr/share/hal0-reconciler/reconciler.toml"
    assert f"TEMPLATE = {template}" in (DEBIAN / "rules").read_text()
    assert f"template=/{template}" in (DEBIAN / "hal0-reconciler.postinst").read_text()
    assert "@TEMPLATE_SHA256@" in (DEBIAN / "hal0-reconciler.postrm").read_text()
    assert f"/{template}" in text_of(MAN8)


def test_the_readme_is_an_operators_page_under_its_size() -> None:
    """At most 12 KB, no line of a table wider than a terminal, and the developer material in
    docs/ (linked)."""
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT
    assert [] == [line for line in text.splitlines() if line.startswith("|") and len(line) > 100]
    for heading in ("## Install on Debian", "## Configure", "## Operate", "## Troubleshooting"):
        assert heading in text
    for linked in re.findall(r"\]\((docs/[\w.-]+\.md)\)", text):
        assert (REPO / linked).is_file(), linked
    assert "(docs/development.md)" in text
