"""The parity corpus: installed boxes written by the project, deterministic and large.

A box (``Box``) is what differs per process on hal0's side (hal0 reads its manifest once per
process): the manifests, ``hal0.toml``, ``api.env`` and the restore marker. Every box holds the
same slot set (``slot_files``: ~170 files): pinned and unpinned, flat and nested ``[slot]``,
keys split between the top level and ``[slot]``, both tables ``gpu-vulkan``, retired pins and
runner keys the 1.4+ conversion rewrites, padded pins, legacy ``backend``, non-llama runtimes,
and controls that are not ``gpu-vulkan`` at all. The images are this project's test values in
hal0's spellings (``repo:tag@digest``, ``repo:tag``, ``repo@digest``); the manifests follow
hal0's schema (``runners`` for 1.4+, ``toolbox_images`` before), written here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

G = "ghcr.io/hal0ai"
PIN_REPO = f"{G}/hal0-llama"  # the standard runner's repo in this corpus (not a retired one)
PIN_TAGNAME = "b11552-r1a2b3c4"
PIN_DIGEST_VALUE = "sha256:" + "5e" * 32
PIN_FULL = f"{PIN_REPO}:{PIN_TAGNAME}@{PIN_DIGEST_VALUE}"
PIN_TAG = f"{PIN_REPO}:{PIN_TAGNAME}"
PIN_DIGEST = f"{PIN_REPO}@{PIN_DIGEST_VALUE}"
OTHER_TAG = f"{PIN_REPO}:b11000-r0000000"  # the same repo, a tag no manifest gates
USER_IMG = "docker.io/someone/llama-vulkan:latest"  # an operator's own image
C0826 = f"{G}/hal0-combined:0826"  # retired in 1.4+; the 1.0-1.3 Vulkan-fixed image
STRIX = f"{G}/hal0-strix-vulkan:0831"  # retired in 1.4+; capable in 1.2-1.3
C0824 = f"{G}/hal0-combined:0824"  # a 1.0-1.3 stale former default (looked through)
ADE07BA = f"{G}/hal0-rocmfpx:ade07ba"  # stale in 1.0-1.3, a retired repo in 1.4+
TOOLBOX = f"{G}/hal0-toolbox-vulkan:v1"  # a retired repo prefix in 1.4+
LOCALHOST = "localhost/hal0-rocmfpx:vulkan-minicpm5"
STRIX_DIGEST = "sha256:" + "c3" * 32

IMAGES: tuple[str | None, ...] = (
    None, PIN_FULL, PIN_TAG, PIN_DIGEST, f"  {PIN_TAG} ", OTHER_TAG, USER_IMG, C0826, STRIX,
    C0824, ADE07BA, TOOLBOX, f" {C0826}", LOCALHOST,
)  # fmt: skip
BINARIES: tuple[str, ...] = ("rocmfpx", "vulkanfpx", "strix", "standard", "promptforge", "cpu")
SHAPES: tuple[str, ...] = (
    "flat",  # every key at the top level
    "nested",  # every key under [slot]
    "split_device_top",  # device at the top level, image_pin/binary under [slot]
    "split_device_slot",  # device under [slot], image_pin/binary at the top level
    "both_vulkan",  # device = gpu-vulkan in both tables (the rest under [slot])
    "top_vulkan_slot_rocm",  # top-level gpu-vulkan, [slot] gpu-rocm: launches gpu-rocm
    "top_rocm_slot_vulkan",  # top-level gpu-rocm, [slot] gpu-vulkan: launches gpu-vulkan
)
RUNTIMES: tuple[tuple[str, str], ...] = (
    ("type", "tts"),
    ("type", "transcription"),
    ("provider", "comfyui"),
    ("type", "image"),
)


# Spellings the generated shapes do not reach, each written as a file by hand (hal0's own
# tomli_w output among them): comments and odd whitespace, quoted keys and literal strings,
# image_pin empty / blank / not a string, binary unknown or in another case, a slot's own
# name, digest-only refs and non-llama runtimes in other spellings.
ODD_SLOTS: dict[str, str] = {
    "tomli-w-nested": f'name = "chat"\n\n[slot]\ndevice = "gpu-vulkan"\nimage_pin = "{PIN_TAG}"\n',
    "tomli-w-flat-retired": f'device = "gpu-vulkan"\nimage_pin = "{C0826}"\nbinary = "rocmfpx"\n',
    "comments-ws": f'  device\t=   "gpu-vulkan"   # the lane\n# image_pin = "{PIN_TAG}"\n'
    f'image_pin="{USER_IMG}"#mine\n',
    "quoted-keys": f"\"device\" = \"gpu-vulkan\"\n'image_pin' = '{PIN_TAG}'\n",
    "quoted-keys-slot": '["slot"]\n"device" = \'gpu-vulkan\'\n"binary" = "standard"\n',
    "dotted-slot": f'slot.device = "gpu-vulkan"\nslot.image_pin = "{C0826}"\n',
    "pin-empty": 'device = "gpu-vulkan"\nimage_pin = ""\n',
    "pin-blank": 'device = "gpu-vulkan"\nimage_pin = "   "\n',
    "pin-empty-nested": '[slot]\ndevice = "gpu-vulkan"\nimage_pin = ""\n',
    "pin-int": 'device = "gpu-vulkan"\nimage_pin = 5\n',
    "pin-list": f'device = "gpu-vulkan"\nimage_pin = ["{PIN_TAG}"]\n',
    "pin-bool-nested": '[slot]\ndevice = "gpu-vulkan"\nimage_pin = false\n',
    "pin-padded-tab": f'device = "gpu-vulkan"\nimage_pin = "\\t{PIN_FULL}\\n"\n',
    "pin-upper": f'device = "gpu-vulkan"\nimage_pin = "{PIN_TAG.upper()}"\n',
    "pin-digest-only-strix": f'device = "gpu-vulkan"\nimage_pin = "{G}/hal0-strix-vulkan@{STRIX_DIGEST}"\n',
    "pin-strix-full": f'device = "gpu-vulkan"\nimage_pin = "{STRIX}@{STRIX_DIGEST}"\n',
    "pin-c0826-digest": f'device = "gpu-vulkan"\nimage_pin = "{C0826}@{STRIX_DIGEST}"\n',
    "bin-Standard": 'device = "gpu-vulkan"\nbinary = "Standard"\n',
    "bin-ROCMFPX": 'device = "gpu-vulkan"\nbinary = "ROCMFPX"\n',
    "bin-unknown": 'device = "gpu-vulkan"\nbinary = "llamafile"\n',
    "bin-empty": 'device = "gpu-vulkan"\nbinary = ""\n',
    "bin-int": 'device = "gpu-vulkan"\nbinary = 1\n',
    "bin-padded": 'device = "gpu-vulkan"\nbinary = " vulkanfpx "\n',
    "bin-kokoro": 'device = "gpu-vulkan"\nbinary = "kokoro"\n',
    "bin-cpu-nested": '[slot]\ndevice = "gpu-vulkan"\nbinary = "cpu"\n',
    "device-upper": 'device = "GPU-VULKAN"\n',
    "device-padded": 'device = " gpu-vulkan "\n',
    "device-int": "device = 1\n",
    "id-and-name": f'id = "llm-1"\nname = "llm-1"\ndevice = "gpu-vulkan"\nimage_pin = "{C0826}"\n',
    "type-TTS": 'device = "gpu-vulkan"\ntype = "TTS"\n',
    "type-llm": 'device = "gpu-vulkan"\ntype = "llm"\n',
    "type-empty": 'device = "gpu-vulkan"\ntype = ""\n',
    "type-stt-nested": '[slot]\ndevice = "gpu-vulkan"\ntype = "stt"\n',
    "type-embedding": 'device = "gpu-vulkan"\ntype = "embedding"\n',
    "provider-ComfyUI": 'device = "gpu-vulkan"\nprovider = "ComfyUI"\n',
    "provider-llama": 'device = "gpu-vulkan"\nprovider = "llama.cpp"\n',
    "provider-comfyui-pin": f'[slot]\ndevice = "gpu-vulkan"\nprovider = "comfyui"\nimage_pin = "{PIN_TAG}"\n',
    "runtime-kokoro": 'device = "gpu-vulkan"\nruntime = "kokoro"\n',
    "backend-Vulkan": 'backend = "Vulkan"\n',
    "backend-vulkan-slot-device": '[slot]\nbackend = "vulkan"\ndevice = "gpu-vulkan"\n',
    "backend-top-device-slot": 'backend = "rocm"\n\n[slot]\ndevice = "gpu-vulkan"\n',
    "slot-not-table": 'device = "gpu-vulkan"\nslot = "x"\n',
    "slot-not-table-stale": f'device = "gpu-vulkan"\nimage_pin = "{C0824}"\nslot = "x"\n',
    "slot-list-user": f'device = "gpu-vulkan"\nimage_pin = "{USER_IMG}"\nslot = []\n',
    "slot-not-table-profile": f'device = "gpu-vulkan"\nprofile = "default"\nimage_pin = "{USER_IMG}"\nslot = 1\n',
    "slot-in-slot": f'[slot]\ndevice = "gpu-vulkan"\nimage_pin = "{USER_IMG}"\nslot = "x"\n',
    "slot-empty": 'device = "gpu-vulkan"\n\n[slot]\n',
    "crlf": f'device = "gpu-vulkan"\r\nimage_pin = "{PIN_TAG}"\r\n',
    "bom": '\ufeffdevice = "gpu-vulkan"\n',
    "not-toml": "device = gpu-vulkan\n",
}


def _value(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is JSON's string syntax for these values


def _slot_text(shape: str, keys: dict[str, str], *, model: bool) -> str:
    """A slot file: ``keys`` (device among them) placed by ``shape``."""
    top: dict[str, str] = {}
    slot: dict[str, str] = {}
    device = keys.pop("device", None)
    if shape == "flat":
        top = {"device": device, **keys} if device else dict(keys)
    elif shape == "nested":
        slot = {"device": device, **keys} if device else dict(keys)
    elif shape == "split_device_top":
        top, slot = ({"device": device} if device else {}), dict(keys)
    elif shape == "split_device_slot":
        top, slot = dict(keys), ({"device": device} if device else {})
    elif shape == "both_vulkan":
        top, slot = {"device": "gpu-vulkan"}, {"device": "gpu-vulkan", **keys}
    elif shape == "top_vulkan_slot_rocm":
        top, slot = {"device": "gpu-vulkan"}, {"device": "gpu-rocm", **keys}
    else:  # top_rocm_slot_vulkan
        top, slot = {"device": "gpu-rocm"}, {"device": "gpu-vulkan", **keys}
    lines = [f"{k} = {_value(v)}" for k, v in top.items()]
    if slot:
        lines += ["", "[slot]"] + [f"{k} = {_value(v)}" for k, v in slot.items()]
    if model:
        lines += ["", "[model]", 'id = "qwen3-8b-q4"']
    return "\n".join(lines) + "\n"


def slot_files() -> dict[str, str]:
    """The slot set every box holds, by file name (deterministic)."""
    cases: list[tuple[str, str]] = []  # (label, text)
    for shape in SHAPES:
        for i, image in enumerate(IMAGES):
            keys = {"device": "gpu-vulkan"} | ({"image_pin": image} if image else {})
            cases.append((f"{shape}-img{i:02d}", _slot_text(shape, keys, model=i % 2 == 0)))
    for binary in BINARIES:
        for shape in ("flat", "nested", "split_device_top"):
            for i, image in enumerate((None, PIN_TAG, C0826, USER_IMG)):
                keys = {"device": "gpu-vulkan", "binary": binary}
                keys |= {"image_pin": image} if image else {}
                cases.append((f"{shape}-bin-{binary}-img{i}", _slot_text(shape, keys, model=True)))
    for key, value in RUNTIMES:
        for shape in ("flat", "nested", "split_device_top"):
            keys = {"device": "gpu-vulkan", key: value}
            cases.append((f"{shape}-{key}-{value}", _slot_text(shape, keys, model=False)))
    for shape in ("flat", "nested"):  # legacy backend= (no device key)
        for i, image in enumerate((None, PIN_TAG, C0826)):
            keys = {"backend": "vulkan"} | ({"image_pin": image} if image else {})
            cases.append((f"{shape}-backend-vulkan-img{i}", _slot_text(shape, keys, model=True)))
        cases.append((f"{shape}-backend-rocm", _slot_text(shape, {"backend": "rocm"}, model=True)))
    for shape in ("flat", "nested"):  # controls: not gpu-vulkan
        for device in ("gpu-rocm", "cpu", "npu"):
            keys = {"device": device, "image_pin": C0826}
            cases.append((f"{shape}-control-{device}", _slot_text(shape, keys, model=True)))
        cases.append((f"{shape}-control-nodevice", _slot_text(shape, {}, model=True)))
    cases += [(f"odd-{label}", text) for label, text in ODD_SLOTS.items()]
    return {f"s{n:03d}-{label}.toml": text for n, (label, text) in enumerate(cases)}


def _manifest(
    *, tag: str | None = PIN_TAGNAME, digest: str | None = PIN_DIGEST_VALUE, gated: bool = True
) -> str:
    def row(image: str, lanes: list[str]) -> dict[str, object]:
        return {"image": image, "tag": "v1", "digest": None, "lanes_gated": lanes}

    runners: dict[str, object] = {
        "standard": {
            "image": PIN_REPO,
            "tag": tag,
            "digest": digest,
            "lanes_gated": ["rocm", "vulkan"] if gated else ["rocm"],
        },
        "cpu": row("ghcr.io/hal0ai/hal0-llama-cpu", ["cpu"]),
        "cuda": row("ghcr.io/ggml-org/llama.cpp", ["cuda"]),
        "flm": row("ghcr.io/hal0ai/hal0-flm", []),
        "kokoro": row("ghcr.io/hal0ai/hal0-kokoro", []),
        "moonshine": row("ghcr.io/hal0ai/hal0-moonshine", []),
        "comfyui": row("ghcr.io/hal0ai/hal0-comfy", ["rocm"]),
        "qwen3tts": row("ghcr.io/hal0ai/hal0-qwen3tts", ["rocm"]),
    }
    toolbox = {
        "rocmfpx": {"tag": C0826, "digest": None},
        "strix": {"tag": STRIX, "digest": STRIX_DIGEST},
    }
    doc = {"_schema": "hal0.manifest.v1", "version": "test", "channel": "stable"}
    return json.dumps({**doc, "runners": runners, "toolbox_images": toolbox}, indent=2) + "\n"


GATED = _manifest()
GATED_NULL_DIGEST = _manifest(digest=None)
UNGATED = _manifest(gated=False)
UNPUBLISHED = _manifest(tag=None, digest=None)
DIGEST_NO_TAG = _manifest(tag=None)  # invalid: a digest needs a tag
BROKEN = '{"runners": {"standard": '  # a half-written file
NOT_OBJECT = "[]\n"
EMPTY_RUNNERS = json.dumps({"runners": {}}) + "\n"


def _default_images(**images: str) -> str:
    table = ", ".join(f"{k} = {_value(v)}" for k, v in images.items())
    return f"[slots]\ndefault_images = {{ {table} }}\n"


def _extra_runner_manifest(*, cpu_gated_vulkan: bool = False, extra: bool = False) -> str:
    doc = json.loads(GATED)
    if cpu_gated_vulkan:  # a gated pin for a runner whose supported_backends lack vulkan
        doc["runners"]["cpu"] |= {"tag": "c1", "digest": STRIX_DIGEST, "lanes_gated": ["vulkan"]}
    if extra:  # a runner key no release knows
        doc["runners"]["llamafile"] = {
            "image": "ghcr.io/hal0ai/hal0-llamafile", "tag": "t1", "digest": None,
            "lanes_gated": ["vulkan"],
        }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


# api.env as operators and hal0 write it: systemd's EnvironmentFile= rules decide what hal0-api
# sees (``export`` lines are not assignments, the last line of a name wins, an unquoted value
# keeps its interior text).
ENV_SPELLINGS = (
    f"# hal0-api\n; comment\nHAL0_RUNNER_IMAGE_STANDARD={USER_IMG}\n"
    f'HAL0_RUNNER_IMAGE_STANDARD="{PIN_FULL}"\n'
)  # the last line of a name wins: the gated pin
ENV_EXPORT = f"export HAL0_RUNNER_IMAGE_STANDARD={USER_IMG}\n"  # not an assignment: no override
ENV_SINGLE_QUOTED = f"HAL0_RUNNER_IMAGE_STANDARD = '{USER_IMG}'\n"  # an override
ENV_COMMENT_AFTER = f"HAL0_RUNNER_IMAGE_STANDARD={PIN_TAG} # the pin\n"  # the value keeps "# ..."
ENV_LAST_WINS = f"HAL0_RUNNER_IMAGE_STANDARD={PIN_TAG}\nHAL0_RUNNER_IMAGE_STANDARD={USER_IMG}\n"

# [slots] lines hal0's SlotsConfig refuses, and ones its lax coercion accepts
INVALID_SLOTS = {
    "unknown-key": "max_slot = 4\n",
    "negative-max": "max_slots = -1\n",
    "string-port": 'port_range_start = "eighty"\n',
    "port-80": "port_range_start = 80\n",
    "range-reversed": "port_range_start = 9000\nport_range_end = 8999\n",
    "bool-text": 'preload_evict_enabled = "maybe"\n',
    "publish-host": 'publish_host = "::1"\n',
    "network-mode": 'network_mode = "bridge"\n',
}
VALID_SLOTS = (
    'max_slots = "4"\nport_range_start = 9000.0\nport_range_end = " 9_100 "\n'
    'preload_evict_enabled = "off"\npublish_host = " 0.0.0.0 "\nnetwork_mode = "host"\n'
)

INVALID_TELEMETRY = '\n[telemetry]\nenabled = "maybe"\n'  # valid TOML, not a bool for hal0


@dataclass(frozen=True)
class Box:
    """One installed box's hal0 facts besides the code (``None``: the file is absent)."""

    name: str
    release_manifest: str | None = None
    etc_manifest: str | None = None
    hal0_toml: str | None = None
    api_env: str | None = None
    restore_marker: bool = False  # an active one: ``version=`` the installed release
    manifest_link: bool = False  # the release tree's manifest.json a link to root's own file
    profile_centric_marker: str | None = None  # its ``version=``: None absent, "" the installed
    # hal0.toml's [slots] part when another section of it is invalid for hal0 (decision 5:
    # hal0 then drops every default_images, the reconciler validates only [slots])
    slots_part: str | None = None


BOXES: tuple[Box, ...] = (
    Box("gated", release_manifest=GATED),
    Box("gated-null-digest", GATED_NULL_DIGEST, hal0_toml=_default_images(standard=PIN_TAG)),
    Box("ungated-env-pin", UNGATED, api_env=f"HAL0_RUNNER_IMAGE_STANDARD={PIN_FULL}\n"),
    Box(
        "no-manifest-rocmfpx-default",
        hal0_toml=_default_images(rocmfpx=C0826),
        api_env=f"HAL0_TOOLBOX_IMAGE_ROCMFPX={USER_IMG}\n",
    ),
    Box("broken-manifest", BROKEN),
    Box("invalid-manifest-alias-key", DIGEST_NO_TAG, hal0_toml=_default_images(vulkanfpx=STRIX)),
    Box("etc-manifest-only", etc_manifest=GATED, api_env=f"HAL0_TOOLBOX_IMAGE_VULKANFPX={STRIX}\n"),
    Box(
        "two-manifests-invalid-key",
        GATED,
        etc_manifest=UNGATED,
        hal0_toml=_default_images(nosuch=USER_IMG),
    ),
    Box(
        "restore-marker",
        GATED,
        hal0_toml=_default_images(rocmfpx=USER_IMG),
        restore_marker=True,
    ),
    Box("broken-hal0-toml", GATED, hal0_toml="[slots\ndefault_images = 1\n"),
    Box("unpublished-env-tag", UNPUBLISHED, api_env=f"HAL0_RUNNER_IMAGE_STANDARD= {PIN_TAG} \n"),
    Box("not-object-manifest", NOT_OBJECT, etc_manifest=EMPTY_RUNNERS),
    Box(
        "invalid-other-section",
        GATED,
        hal0_toml=_default_images(rocmfpx=USER_IMG) + INVALID_TELEMETRY,
        slots_part=_default_images(rocmfpx=USER_IMG),
    ),
    Box("linked-manifest", GATED, manifest_link=True),
    Box("profile-centric-marker", UNGATED, profile_centric_marker=""),
    Box("profile-centric-marker-older", UNGATED, profile_centric_marker="1.0.0"),
    Box(
        "both-markers",
        GATED,
        hal0_toml=_default_images(rocmfpx=USER_IMG),
        restore_marker=True,
        profile_centric_marker="",
    ),
    Box("env-spellings", GATED, api_env=ENV_SPELLINGS),
    Box("env-export", GATED, api_env=ENV_EXPORT),
    Box("env-single-quoted", GATED, api_env=ENV_SINGLE_QUOTED),
    Box("env-comment-after", GATED, api_env=ENV_COMMENT_AFTER),
    Box("env-last-wins", GATED, api_env=ENV_LAST_WINS),
    Box(
        "other-runner-defaults",
        GATED,
        hal0_toml=_default_images(cpu=PIN_TAG, kokoro=USER_IMG, comfyui=C0826),
    ),
    Box("cpu-gated-vulkan", _extra_runner_manifest(cpu_gated_vulkan=True)),
    Box("extra-runner", _extra_runner_manifest(extra=True)),
    Box("ungated-default-pin", UNGATED, hal0_toml=_default_images(standard=PIN_DIGEST)),
    # [slots] keys beside default_images that the release's SlotsConfig refuses: hal0 then drops
    # the whole table, default_images with it (decision 5)
    *(
        Box(f"invalid-slots-{name}", GATED, hal0_toml=_default_images(rocmfpx=USER_IMG) + line)
        for name, line in INVALID_SLOTS.items()
    ),
    Box("valid-slots-lax", GATED, hal0_toml=_default_images(rocmfpx=USER_IMG) + VALID_SLOTS),
)
