"""hal0's shell-style environment files (``/etc/hal0/api.env``): ``KEY=VALUE`` lines.

Its own small module so that reading hal0's facts does not load the HTTP client. The file is
hal0's, not ours: it is read through :mod:`hal0_reconciler.boundedread` (a regular file only,
never a FIFO or a device, never through a final symlink, at most ``MAX_BYTES``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hal0_reconciler.boundedread import ReadRefused, read_bounded

MAX_BYTES = 1 << 20
"""The cap on an environment file (hal0's is a few hundred bytes)."""


class EnvFileRefused(ReadRefused, OSError):
    """The environment file was not read (not a regular file, a symlink, over the cap, not
    UTF-8...). An ``OSError`` too, so every caller that treats an unreadable file as "no
    values, and say so" does so for a refused one; ``strerror`` is the reason in words."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(path, reason)
        self.strerror = reason
        self.filename = str(path)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def read_env_file(path: Path) -> dict[str, str]:
    """A shell-style ``KEY=VALUE`` file (comments, ``export``, quotes); missing file → empty.

    Raises ``EnvFileRefused`` (an ``OSError``) for a file that is there but not read."""
    text = _text(path)
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        line = line.removeprefix("export ").strip()
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value, comments=True)
        except ValueError:
            parts = [value.strip()]
        values[key.strip()] = parts[0] if parts else ""
    return values


def read_unit_environment(path: Path) -> dict[str, str]:
    """``read_env_file``'s file as systemd's ``EnvironmentFile=`` hands it to hal0-api (what
    hal0-api's environment really holds): see :func:`unit_environment`."""
    return unit_environment(_text(path))


def _text(path: Path) -> str:
    """The file's text through the bounded reader; missing → empty; refused → EnvFileRefused."""
    try:
        data = read_bounded(path, max_bytes=MAX_BYTES, missing_ok=True)
        return "" if data is None else data.decode("utf-8")
    except ReadRefused as exc:
        raise EnvFileRefused(path, exc.reason) from None
    except UnicodeDecodeError as exc:
        raise EnvFileRefused(path, f"not UTF-8 text (byte {exc.start} is not valid)") from None


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BLANK = " \t\r"


def unit_environment(text: str) -> dict[str, str]:
    """systemd's ``EnvironmentFile=`` rules (systemd.exec(5)): lines starting with ``#`` or
    ``;`` are comments; a name that is not a valid variable name (``export NAME=``) is no
    assignment; an unquoted value keeps its interior text (``#`` included) and loses its
    leading and trailing blanks and keeps a quote after its first character, ``\\`` keeps the
    next character and joins a line ending in it; ``'...'`` is verbatim, ``"..."`` knows the
    shell's ``\\"`` ``\\\\`` ``\\$`` ``\\``` escapes; the last line of a name wins."""
    values: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _BLANK + "\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":  # a comment: to its end of line, a trailing backslash joins
            while i < n and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            continue
        end = text.find("\n", i)
        equals = text.find("=", i)
        if equals < 0 or (0 <= end < equals):  # no assignment on this line
            i = n if end < 0 else end + 1
            continue
        key = text[i:equals].rstrip(_BLANK)
        value, i = _value(text, equals + 1)
        if _NAME.fullmatch(key):
            values[key] = value
    return values


def _value(text: str, i: int) -> tuple[str, int]:
    """One value from ``i`` (after ``=``) to its end of line: the value and where reading
    goes on."""
    out: list[str] = []
    n = len(text)
    kept = 0  # len(out) up to the last character that is not a trailing blank
    bare = False  # an unquoted character was read: a quote after it is kept as it is
    while i < n and text[i] in _BLANK:
        i += 1
    while i < n and text[i] != "\n":
        c = text[i]
        if c in "'\"" and not bare:
            close = i + 1
            while close < n and text[close] != c:
                if c == '"' and text[close] == "\\" and close + 1 < n:
                    nxt = text[close + 1]
                    if nxt != "\n":
                        out.append(nxt if nxt in '"\\`$' else "\\" + nxt)
                    close += 2
                    continue
                out.append(text[close])
                close += 1
            i = close + 1
            kept = len(out)
            while i < n and text[i] in _BLANK:
                i += 1
            continue
        bare = True
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                out.append(text[i + 1])
                kept = len(out)
            i += 2
            continue
        out.append(c)
        if c not in _BLANK:
            kept = len(out)
        i += 1
    return "".join(out[:kept]), i + 1
