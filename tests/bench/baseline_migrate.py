"""The baseline every slot pass is compared with: a one-shot migration script.

    python tests/bench/baseline_migrate.py SLOTS_DIR

Parses each ``*.toml`` with tomllib; when ``device = "gpu-vulkan"``, sets ``gpu-rocm`` and
rewrites the whole file with tomli-w (comments lost), durably: temp file, fsync, rename; the
folder is fsynced once at the end. No lock, no verification, no host facts, no logging: the
floor a careful script reaches.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import tomli_w


def migrate(folder: Path) -> int:
    changed = 0
    for path in sorted(folder.glob("*.toml")):
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
        if data.get("device") != "gpu-vulkan":
            continue
        data["device"] = "gpu-rocm"
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, tomli_w.dumps(data).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        changed += 1
    if changed:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return changed


if __name__ == "__main__":
    migrate(Path(sys.argv[1]))
