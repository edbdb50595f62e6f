"""Which rules the installed aiter follows: versions, core.py facts, the shipped rule sets."""

from __future__ import annotations

import contextlib
import os

import pytest
from aiter_support import AT_E4048607, OLDER
from hypothesis import given, settings
from hypothesis import strategies as st

from hal0_reconciler.aiter.rules import installed
from hal0_reconciler.aiter.rules import sets as rules

# Excerpts written for these tests in the shape of aiter's jit/core.py (not copies of it).
CORE_E4048607 = """
import os
X = os.getenv("AITER_CONFIG_GEMM_A8W8", "/default.csv")

class AITER_CONFIG:
    def update_config_files(self, file_path, merge_name):
        if duplicated:
            raise RuntimeError(
                f"Found {n} duplicate shape entries during merge of '{merge_name}'. "
                f"Auto-resolved and saved back to source config files. Please re-run.\\n"
            )

    def get_config_file(self, env_name, default_file, tuned_file_name):
        config_env_file = os.getenv(env_name)
        return config_env_file
"""
CORE_V0_1_13 = """
import os

class AITER_CONFIG:
    def update_config_files(self, file_path, merge_name):
        if duplicated:
            raise RuntimeError("Auto-resolved and saved back to source config files. Please re-run.")

    def get_config_file(self, env_name, default_file, tuned_file_name):
        model_config_dir = Path(f"{AITER_ROOT_DIR}/aiter/configs/model_configs/")
        found = [p for p in model_config_dir.glob(f"*{tuned_file_name}*.csv") if "untuned" not in p.name]
        return found
"""
CORE_V0_1_12 = CORE_E4048607.replace(
    "return config_env_file",
    'model_config_dir = Path("configs/model_configs")\n        return [p for p in model_config_dir.glob(f"*{tuned_file_name}*") if "untuned" not in str(p)]',
)
CORE_OLDER = """
import os
def update_config_files(file_path, merge_name):
    path_list = file_path.split(os.pathsep) if file_path else []
    df_list = [pd.read_csv(path_list[0])]
    return merge_df.sort_values("us").drop_duplicates(subset=keys, keep="first")
"""
CORE_UNKNOWN = """
def update_config_files(file_path, merge_name):
    return merge_in_memory([p for p in file_path.split(":") if os.path.exists(p)])
"""
NEWEST = "v0.1.15-e4048607"


@pytest.mark.parametrize(
    ("text", "facts"),
    [
        pytest.param(CORE_E4048607, (True, False, False, False), id="e4048607 excerpt, no glob"),
        pytest.param(CORE_V0_1_13, (True, False, True, True), id="csv glob"),
        pytest.param(CORE_V0_1_12, (True, False, False, True), id="any-file glob"),
        pytest.param(CORE_OLDER, (False, True, False, False), id="older"),
        pytest.param(
            CORE_OLDER + "\ndef broken(:\n", (False, True, False, False), id="text fallback"
        ),
        pytest.param(
            CORE_V0_1_13 + "\ndef broken(:\n", (True, False, True, True), id="text fallback glob"
        ),
    ],
)
def test_code_facts_of_core_py(text, facts):
    """The markers are found with ast (or, when it does not parse, in the text)."""
    found = rules.code_facts(text)
    assert facts == tuple(found[m] for m in rules.MARKERS)


@pytest.mark.parametrize(
    ("version", "facts", "chosen", "how"),
    [
        pytest.param("0.1.21.dev46+ge4048607a5", None, AT_E4048607, "version", id="scm e4048607"),
        pytest.param("0.1.99+ge4048607a5", None, AT_E4048607, "version", id="by revision"),
        pytest.param("0.1.12", None, "v0.1.12", "version", id="0.1.12"),
        pytest.param("0.1.12.post2", None, "v0.1.12", "version", id="0.1.12.post2"),
        pytest.param("0.1.13rc1", None, "v0.1.12", "version", id="rc before 0.1.13"),
        pytest.param("0.1.13", None, "v0.1.13-v0.1.14", "version", id="0.1.13"),
        pytest.param("0.1.14.post1", None, "v0.1.13-v0.1.14", "version", id="0.1.14.post1"),
        pytest.param("0.1.15", None, AT_E4048607, "version", id="0.1.15"),
        pytest.param("0.1.16.post6", None, AT_E4048607, "version", id="0.1.16.post6"),
        pytest.param("0.1.12rc1", None, OLDER, "version", id="rc before 0.1.12"),
        pytest.param("0.1.11.post1", None, OLDER, "version", id="0.1.11.post1"),
        pytest.param("0.1.9", None, OLDER, "version", id="0.1.9"),
        pytest.param("0.1.6.post3", None, "v0.1.6", "version", id="0.1.6.post3"),
        pytest.param("0.1.20.post1", CORE_V0_1_13, AT_E4048607, "version", id="agreeing"),
        pytest.param("0.1.20", CORE_OLDER, "v0.1.6", "core.py", id="code wins over version"),
        pytest.param("0.1.22", CORE_V0_1_13, AT_E4048607, "core.py", id="newer, same code"),
        pytest.param("0.1.22", CORE_V0_1_12, "v0.1.12", "core.py", id="newer, old code"),
        pytest.param(None, CORE_OLDER, "v0.1.6", "core.py", id="no version, no overlays"),
        pytest.param(
            None, CORE_OLDER + "\n# model_configs\n", OLDER, "core.py", id="no version, code"
        ),
        pytest.param("0.1.22", None, NEWEST, "newest", id="unknown version"),
        pytest.param("0.1.21.dev47", None, NEWEST, "newest", id="after e4048607"),
        pytest.param("0.1.22", CORE_UNKNOWN, NEWEST, "newest", id="unknown code"),
        pytest.param(None, None, NEWEST, "newest", id="nothing known"),
        pytest.param("banana", None, NEWEST, "newest", id="not a version"),
    ],
)
def test_choose_the_rule_set(book, version, facts, chosen, how):
    """Version (or its revision) first; core.py's markers where that does not decide or
    disagrees; the newest set, said in a note, when nothing decides."""
    choice = rules.choose(
        book, version=version, facts=None if facts is None else rules.code_facts(facts)
    )
    assert (chosen, how) == (choice.rules.name, choice.how.split()[0].rstrip(",").split("/")[-1])
    disagreeing = version == "0.1.20"  # its version says one set, its code another
    assert (choice.note is not None) == (how == "newest" or disagreeing)


def test_shipped_rule_sets_follow_the_per_version_table(book):
    """Overlays, `X=`, a `:`-list's missing first path, duplicates, keys and routing per
    version, as executing each release's core.py showed; no rule set strips a value."""
    got = {
        s.name: (
            str(s.overlays),
            str(s.empty_value),
            str(s.list_missing),
            str(s.dedup_merge),
            s.dedup_keys,
            s.routing,
        )
        for s in book.sets
    }
    assert {
        "v0.1.6": ("none", "fails", "first-fails", "exact-only", (), "v0.1.6-v0.1.14"),
        OLDER: (
            "stem-anywhere",
            "fails",
            "first-fails",
            "in-memory-winner",
            ("cu_num",),
            "v0.1.6-v0.1.14",
        ),
        "v0.1.12": (
            "stem-anywhere",
            "drops-default",
            "skipped",
            "rewrite-and-rerun",
            ("cu_num", "_tag"),
            "v0.1.6-v0.1.14",
        ),
        "v0.1.13-v0.1.14": (
            "stem-csv",
            "drops-default",
            "skipped",
            "rewrite-and-rerun",
            ("cu_num", "gfx", "_tag"),
            "v0.1.6-v0.1.14",
        ),
        AT_E4048607: (
            "stem-csv",
            "drops-default",
            "skipped",
            "rewrite-and-rerun",
            ("cu_num", "gfx", "_tag"),
            "e4048607",
        ),
    } == got
    assert book.newest.name == AT_E4048607


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            (
                "newest = 'x'\n[rulesets.y]\nempty_value='drops-default'\n"
                "overlays='stem-csv'\nlist_missing='skipped'\ndedup_merge='in-memory-winner'\n"
            ),
            "newest",
        ),
        ("newest='a'\n[rulesets.a]\nwhitespace='stripped'\n", "whitespace"),
        (
            "newest='a'\n[rulesets.a]\nempty_value='fails'\noverlays='nope'\n",
            "overlays must be one of",
        ),
        ("newest='a'\n[rulesets.a]\nempty_value='nope'\n", "empty_value must be one of"),
        ("newest='a'\n[rulesets.a]\nversions=['~1']\n", "versions"),
        ("newest='a'\n[rulesets.a]\nmarkers={ other = true }\n", "markers"),
        ("newest='a'\n[rulesets.a]\ncolour='red'\n", "colour"),
        ("newest='a'\n[rulesets.a]\nbuild_cu={ gfx942 = 0 }\n", "build_cu"),
        ("not toml [", "TOML"),
    ],
)
def test_malformed_rule_data_names_the_key(text, key):
    """Broken rule data is refused with the key that is wrong."""
    with pytest.raises(rules.RulesError, match=key):
        rules.parse_rules(text)


_RELEASE = st.lists(st.integers(0, 30), min_size=1, max_size=4).map(lambda p: ".".join(map(str, p)))
_VERSION = st.builds(
    lambda rel, pre, post, dev, local: rel + pre + post + dev + local,
    _RELEASE,
    st.sampled_from(["", "a1", "b2", "rc1", "rc0", "c3"]),
    st.sampled_from(["", ".post1", ".post2", "-3"]),
    st.sampled_from(["", ".dev0", ".dev46"]),
    st.sampled_from(["", "+ge4048607a5", "+gabcdef1.d20260916"]),
)


@settings(max_examples=400, deadline=None)
@given(_VERSION, _VERSION)
def test_version_order_matches_pep_440(a, b):
    """Versions order as packaging's PEP 440 implementation orders them (local parts aside)."""
    version = pytest.importorskip("packaging.version")
    pa, pb = (version.Version(version.Version(v).public) for v in (a, b))
    ka, kb = rules._padded(rules.version_key(a), rules.version_key(b))
    assert ((pa < pb), (pa == pb)) == ((ka < kb), (ka == kb))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_any_text_is_a_version_or_a_version_error(text):
    """Arbitrary text never raises anything but VersionError."""
    with contextlib.suppress(rules.VersionError):
        rules.version_key(text)


def test_scm_revision_is_read_from_the_local_part():
    """setuptools_scm writes +g<hash>: that is the revision."""
    assert rules.revision_of("0.1.21.dev46+ge4048607a5") == "e4048607a5"
    assert rules.revision_of("0.1.21.dev46+ge4048607a5.d20260901") == "e4048607a5"
    assert rules.revision_of("0.1.20") is None


# --- the installed package -------------------------------------------------------------------


def _site(tmp_path, **files: str):
    pkg = tmp_path / "site-packages" / "aiter"
    (pkg / "jit").mkdir(parents=True)
    for rel, text in files.items():
        path = tmp_path / "site-packages" / rel.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


@pytest.mark.parametrize(
    ("files", "version", "source"),
    [
        pytest.param(
            {"aiter___version.py": "__version__ = '0.1.21.dev46+ge4048607a5'\n"},
            "0.1.21.dev46+ge4048607a5",
            "_version.py",
            id="setuptools_scm file",
        ),
        pytest.param(
            {
                "amd_aiter-0.1.20.dist-info__METADATA": "Metadata-Version: 2.1\nName: amd-aiter\n"
                "Version: 0.1.20\n\nVersion: 9\n"
            },
            "0.1.20",
            "METADATA",
            id="dist-info",
        ),
        pytest.param(
            {"amd_aiter.egg-info__PKG-INFO": "Name: amd-aiter\nVersion: 0.1.12.post1\n"},
            "0.1.12.post1",
            "PKG-INFO",
            id="develop egg-info",
        ),
        pytest.param(
            {"aiter-0.1.7.dist-info__METADATA": "Name: aiter\nVersion: 0.1.7\n"},
            "0.1.7",
            "METADATA",
            id="old distribution name",
        ),
        pytest.param(
            {"other-1.0.dist-info__METADATA": "Name: other\nVersion: 1.0\n"},
            None,
            None,
            id="someone else's metadata",
        ),
        pytest.param(
            {
                "amd_aiter-0.1.20.dist-info__METADATA": "Version: 0.1.20\n",
                "amd_aiter-0.1.12.dist-info__METADATA": "Version: 0.1.12\n",
            },
            None,
            None,
            id="two versions do not decide",
        ),
    ],
)
def test_version_is_read_without_importing_aiter(tmp_path, files, version, source):
    """_version.py, then dist-info / egg-info beside the package."""
    found = installed.read_installed(_site(tmp_path, **files))
    assert version == found.version
    assert source == (found.version_from.name if found.version_from else None)


def test_core_py_is_read_as_text_and_a_fifo_is_never_opened(tmp_path):
    """core.py's facts come from its text; a FIFO in its place is noted, not read (no hang)."""
    pkg = _site(tmp_path)
    (pkg / "jit" / "core.py").write_text(CORE_V0_1_13)
    assert {
        "rewrites_duplicates": True,
        "reads_first_path": False,
        "overlay_csv_glob": True,
        "merges_overlays": True,
    } == installed.read_installed(pkg).facts
    (pkg / "jit" / "core.py").unlink()
    os.mkfifo(pkg / "jit" / "core.py")
    found = installed.read_installed(pkg)
    assert found.facts is None
    assert "not a regular file" in found.notes[0]


def test_installed_choice_for_an_e4048607_install(book, tmp_path):
    """A package with e4048607's version file and core.py reads as its rules, with no note."""
    pkg = _site(tmp_path)
    (pkg / "_version.py").write_text("__version__ = '0.1.21.dev46+ge4048607a5'\n")
    (pkg / "jit" / "core.py").write_text(CORE_V0_1_13)
    choice, found = installed.choose(book, pkg)
    assert (AT_E4048607, None) == (choice.rules.name, choice.note)
    assert found.version == "0.1.21.dev46+ge4048607a5"


def test_an_upgraded_aiter_is_read_again_and_an_unchanged_one_is_not(tmp_path, monkeypatch):
    """The rule set follows an upgrade (a new _version.py); an unchanged install costs stats."""
    pkg = _site(tmp_path)
    (pkg / "_version.py").write_text("__version__ = '0.1.11'\n")
    installs = installed.Installs()
    assert installs.choose(pkg)[0].rules.name == OLDER
    reads = []
    real = installed.read_installed
    monkeypatch.setattr(installed, "read_installed", lambda p: reads.append(p) or real(p))
    installs.choose(pkg)
    assert reads == []
    (pkg / "_version.py").write_text("__version__ = '0.1.21.dev46+ge4048607a5'\n")
    assert installs.choose(pkg)[0].rules.name == AT_E4048607
    assert reads == [pkg]


_CORE_PIECES = st.sampled_from(
    [*"()[]{}'\"\\:=.,_ \n\t#", "os.getenv(", " or ", ".strip()", "def update_config_files():"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_CORE_PIECES, max_size=80).map("".join))
def test_any_core_py_text_gives_facts_and_never_raises(text):
    """Whatever core.py holds (broken syntax, deep nesting), the answer is a fact per marker."""
    assert set(rules.MARKERS) == set(rules.code_facts(text))


def test_deeply_nested_core_py_falls_back_to_text():
    """A core.py the parser refuses (nesting too deep) is read as text."""
    text = "x = " + "(" * 5000 + ")" * 5000 + '\nv = glob(f"*{tuned_file_name}*.csv")\n'
    assert rules.code_facts(text)["overlay_csv_glob"] is True
