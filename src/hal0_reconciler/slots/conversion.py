"""hal0 1.4+'s runner-system conversion, as its effect on the judgement.  [pure]

At every hal0-api boot and every update, before its relabel pass, hal0 1.4+ converts the
install onto its runner system (under ``slots.lock``): a slot's ``image_pin``/``image``
naming a retired hal0 image is deleted, a retired default ``binary`` (``rocmfpx``,
``vulkanfpx``, ``vulkan``, ``rocm``) becomes ``standard``, a retired optional one (``strix``,
``promptforge``, ``upstream``) or an unknown one is cleared; ``[slots].default_images`` keys
``rocmfpx``/``vulkanfpx`` are renamed ``standard`` (others that name no runner, and retired
images, dropped); ``HAL0_TOOLBOX_IMAGE_<KEY>`` lines in ``api.env`` become
``HAL0_RUNNER_IMAGE_<KEY>``. The reconciler never writes any of that: it judges each file as
the conversion leaves it. A downgrade's restore marker stands the conversion down (then the
raw values are judged).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

RETIRED_DEFAULT_KEYS = frozenset({"rocmfpx", "vulkanfpx", "vulkan", "rocm"})
_OVERRIDE_DEFAULT_KEYS = frozenset({"rocmfpx", "vulkanfpx"})
_RETIRED_REPOS = frozenset(
    {
        "ghcr.io/hal0ai/hal0-combined",
        "ghcr.io/hal0ai/hal0-combined-upstream",
        "ghcr.io/hal0ai/hal0-rocmfpx",
        "localhost/hal0-rocmfpx",
        "ghcr.io/hal0ai/hal0-strix-vulkan",
        "ghcr.io/hal0ai/hal0-promptforge",
        "ghcr.io/hal0ai/hal0-comfyui",
        "ghcr.io/hal0ai/amd-strix-halo-toolboxes",
        "docker.io/kyuz0/amd-strix-halo-toolboxes",
        "docker.io/kyuz0/amd-strix-halo-comfyui",
    }
)
_RETIRED_PREFIX = "ghcr.io/hal0ai/hal0-toolbox-"
_CUDA_REPO = "ghcr.io/ggml-org/llama.cpp"
_CUDA_FLOATING = frozenset({None, "server-cuda", "latest"})
DROPS_PIN = "hal0 drops this retired pin at its next boot or update"


def split_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``repo[:tag][@digest]`` -> (repo, tag, digest)."""
    body, _, digest = ref.strip().partition("@")
    head, sep, tail = body.rpartition(":")
    if sep and "/" not in tail:
        return head, tail, digest or None
    return body, None, digest or None


def normalize_repo(repo: str) -> str:
    """The repo with its registry spelled out, lower-cased (``kyuz0/x`` -> ``docker.io/...``)."""
    parts = [p for p in repo.strip().lower().split("/") if p]
    if not parts:
        return ""
    if len(parts) == 1:
        return f"docker.io/library/{parts[0]}"
    first = parts[0]
    if first in {"index.docker.io", "registry-1.docker.io"}:
        parts[0] = "docker.io"
    elif "." not in first and ":" not in first and first != "localhost":
        parts.insert(0, "docker.io")
    return "/".join(parts)


def image_is_retired(ref: str) -> bool:
    """Does ``ref`` name an image hal0's old runner system shipped (the conversion drops it)?"""
    repo, tag, digest = split_ref(ref)
    norm = normalize_repo(repo)
    if not norm:
        return False
    if norm in _RETIRED_REPOS or norm.startswith(_RETIRED_PREFIX):
        return True
    return norm == _CUDA_REPO and digest is None and tag in _CUDA_FLOATING


def pin_dropped(value: object) -> bool:
    """Whether the conversion deletes this ``image_pin``/``image`` value."""
    return isinstance(value, str) and bool(value.strip()) and image_is_retired(value)


def binary_after(value: object, known: Collection[str]) -> object:
    """The ``binary`` the conversion leaves (None: deleted; the value itself: untouched)."""
    if not (isinstance(value, str) and value.strip()):
        return value
    key = value.strip()
    if key in known:
        return key  # a padded known key is rewritten stripped
    return "standard" if key in RETIRED_DEFAULT_KEYS else None


def _override_key(key: str, known: Collection[str]) -> str | None:
    key = key.strip()
    if key in known:
        return key
    return "standard" if key in _OVERRIDE_DEFAULT_KEYS else None


def _precedence(old: str, new: str) -> int:
    old = old.strip()
    if old == new:
        return 0
    return 1 if old == "rocmfpx" else 2


def default_images_after(raw: object, known: Collection[str]) -> object:
    """``[slots].default_images`` as the conversion leaves it (a non-table or an empty one:
    untouched)."""
    if not isinstance(raw, Mapping) or not raw:
        return raw

    def rank(item: tuple[object, object]) -> int:
        new = _override_key(str(item[0]), known)
        return _precedence(str(item[0]), new) if new else 3

    converted: dict[str, object] = {}
    for key, ref in sorted(raw.items(), key=rank):
        new = _override_key(str(key), known)
        if new is None or not isinstance(ref, str) or not ref.strip() or image_is_retired(ref):
            continue
        if new not in converted:
            converted[new] = ref
    return converted


def environment_after(values: Mapping[str, str], known: Collection[str]) -> dict[str, str]:
    """``HAL0_RUNNER_IMAGE_*`` as hal0-api's environment holds them once the conversion has
    rewritten ``api.env``'s ``HAL0_TOOLBOX_IMAGE_*`` lines (an existing new line wins; among old
    lines the key's own name, then ``ROCMFPX``, then ``VULKANFPX``)."""
    new_prefix, old_prefix = "HAL0_RUNNER_IMAGE_", "HAL0_TOOLBOX_IMAGE_"
    out = {k: v for k, v in values.items() if k.startswith(new_prefix)}
    winners: dict[str, tuple[int, int, str]] = {}
    for index, (name, value) in enumerate(values.items()):
        if not name.startswith(old_prefix):
            continue
        old = name.removeprefix(old_prefix).lower()
        new = _override_key(old, known)
        if new is None or not value.strip() or image_is_retired(value):
            continue
        rank = (_precedence(old, new), index, value)
        if new.upper() not in winners or rank < winners[new.upper()]:
            winners[new.upper()] = rank
    for key, (_, _, value) in winners.items():
        out.setdefault(new_prefix + key, value)
    return out
