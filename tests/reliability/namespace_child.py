"""Runs inside ``unshare -m`` (a private mount namespace, see test_disk_faults.py): mounts a
fault over the slots folder, runs the scenario, prints what it found as one JSON line. The
mounts vanish with the namespace, whatever happens here."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.name.endswith(".toml")
    }


def _fill(folder: Path) -> None:
    """Fill the file system until ENOSPC (a hidden file, never a slot)."""
    fd = os.open(folder / ".fill", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def _status(runtime_dir: Path) -> dict[str, object]:
    try:
        return json.loads((runtime_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def main() -> None:
    fault, slots, seed_dir, runtime_dir = (
        sys.argv[1],
        Path(sys.argv[2]),
        Path(sys.argv[3]),
        Path(sys.argv[4]),
    )
    once_argv, run_argv = json.loads(sys.argv[5]), json.loads(sys.argv[6])
    report: dict[str, object] = {}
    if fault == "enospc":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(slots)], check=True)
        for path in seed_dir.iterdir():
            (slots / path.name).write_bytes(path.read_bytes())
        _fill(slots)
    else:
        for path in seed_dir.iterdir():
            (slots / path.name).write_bytes(path.read_bytes())
        subprocess.run(["mount", "--bind", str(slots), str(slots)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(slots)], check=True)
    before = _digests(slots)
    done = subprocess.run(once_argv, capture_output=True, text=True, timeout=60, check=False)
    report["once"] = {"code": done.returncode, "stderr": done.stderr[-4000:]}
    report["once_intact"] = before == _digests(slots)
    report["once_temps"] = [n for n in os.listdir(slots) if ".hal0-reconciler." in n]
    daemon = subprocess.Popen(
        run_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = _status(runtime_dir)
            if status.get("ready") and not status.get("healthy", True):
                break
            time.sleep(0.1)
        report["daemon_unhealthy"] = _status(runtime_dir).get("problems")
        report["daemon_intact"] = before == _digests(slots)
        if fault == "enospc":  # the fault ends: space again, a change, the daemon recovers
            (slots / ".fill").unlink()
            for path in sorted(slots.iterdir()):
                os.utime(path)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not _status(runtime_dir).get("healthy"):
                time.sleep(0.1)
            report["daemon_healthy_again"] = bool(_status(runtime_dir).get("healthy"))
            report["relabelled_after"] = sum(
                b'"gpu-rocm"' in p.read_bytes() for p in slots.iterdir() if p.name.endswith(".toml")
            )
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    report["daemon_temps"] = [n for n in os.listdir(slots) if ".hal0-reconciler." in n]
    report["daemon_code"] = daemon.returncode
    print(json.dumps(report))


if __name__ == "__main__":
    main()
