"""The editor's last guards: line endings kept at an unterminated end, and a full rewrite that
is written only when it re-parses to the intended document."""

from __future__ import annotations

import pytest

from hal0_reconciler import errors
from hal0_reconciler.slots import edit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('device = "gpu-vulkan"\nbackend = "vulkan"', 'device = "gpu-rocm"', id="lf"),
        pytest.param(
            'device = "gpu-vulkan"\r\nbackend = "vulkan"', 'device = "gpu-rocm"', id="crlf"
        ),
        pytest.param(
            'device = "gpu-vulkan"  # lf\nbackend = "vulkan"',
            'device = "gpu-rocm"  # lf',
            id="lf-comment-kept",
        ),
        pytest.param(
            'device = "gpu-vulkan"  # crlf\r\nbackend = "vulkan"',
            'device = "gpu-rocm"  # crlf',
            id="crlf-comment-kept",
        ),
        pytest.param(
            'name = "a"\r\ndevice = "gpu-vulkan"\r\nbackend = "vulkan"\r\n',
            'name = "a"\r\ndevice = "gpu-rocm"\r\n',
            id="crlf-terminated",
        ),
        pytest.param(
            'name = "a"\ndevice = "gpu-vulkan"\nbackend = "vulkan"\n',
            'name = "a"\ndevice = "gpu-rocm"\n',
            id="lf-terminated",
        ),
    ],
)
def test_dropping_a_last_backend_line_keeps_the_files_ending(text: str, expected: str) -> None:
    """An unterminated last `backend` line goes with the line ending before it: the file still
    ends unterminated (no final newline is added), LF or CRLF; a terminated one stays so."""
    result = edit.set_device(text, table=(), new="gpu-rocm")
    assert (expected, True) == (result.text, result.byte_minimal), (
        f"the byte-minimal edit changed the file's ending: {result.text!r}"
    )


def test_a_full_rewrite_that_does_not_re_parse_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """When tomli_w's output would read back as another document, nothing is written: the
    edit is refused (a wrong rewrite must never reach the slot file)."""
    monkeypatch.setattr(edit.tomli_w, "dumps", lambda _data: 'device = "gpu-vulkan"\n')
    with pytest.raises(errors.EditRefused, match="does not re-parse identically"):
        edit.set_device('slot.device.lane = "vulkan"\n', table=("slot",), new="cpu")
