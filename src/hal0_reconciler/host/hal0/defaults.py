"""``[slots].default_images`` as each release's ``SlotsConfig`` validator leaves it.  [pure]

- 1.0.0 and 1.4+: every key must be a runner of the installed ``RUNNER_IMAGES`` (no aliases:
  on 1.0.0 a gpu-vulkan slot uses ``default_images.vulkanfpx``, its own runner);
- 1.1.0-1.3.0: alias keys fold into their canonical runner (``vulkanfpx`` -> ``rocmfpx``),
  and a canonical key beats its alias whatever the order.

Values are stripped; an unknown runner, a blank or a non-string value makes hal0 refuse the
whole ``hal0.toml``, which then gives no ``default_images`` at all. (TOML has no null, so
hal0's "null clears one key" never applies to a file.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def validate(
    raw: object, runners: Collection[str], aliases: Mapping[str, str]
) -> tuple[dict[str, str], str | None]:
    """The validated map, or ``{}`` and the one entry that makes hal0 refuse the file.
    ``aliases``: empty for a release that folds none."""
    if not isinstance(raw, Mapping):
        return {}, f"[slots].default_images is {kind(raw)}, not a table"
    cleaned: dict[str, str] = {}
    canonical_origin: set[str] = set()
    for key, ref in raw.items():
        canon = aliases.get(key, key)
        aliased = canon != key
        if canon in cleaned and (aliased or canon in canonical_origin):
            continue  # hal0 skips it before validating it
        if canon not in runners:
            valid = ", ".join(sorted(runners))
            return {}, f"[slots].default_images key {key!r} is not a runner (valid: {valid})"
        if not isinstance(ref, str) or not ref.strip():
            what = "blank" if isinstance(ref, str) else kind(ref)
            return {}, f"[slots].default_images[{key!r}] is {what}, not an image ref"
        cleaned[canon] = ref.strip()
        if not aliased:
            canonical_origin.add(canon)
    return cleaned, None


def kind(value: object) -> str:
    """A TOML value's kind, for a message."""
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        list: "an array",
        dict: "a table",
    }.get(type(value), f"a {type(value).__name__}")
