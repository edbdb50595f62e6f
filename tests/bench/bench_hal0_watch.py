"""What watching for a hal0 that is not installed yet costs: a package install beside it, then
hal0's own install. Prints figures; asserts nothing.

With no hal0, its fact files are watched at their nearest existing ancestor (``/usr/lib`` for
``hal0``, ``/etc`` for ``hal0``...) for the one name that leads to them. A package install in
those folders makes inotify events there; the figure to read is how many full passes they ask
for (the naive watch, "any change in the ancestor", would ask one per event), and how soon
hal0's own install asks for one.

Run: ``python tests/bench/bench_hal0_watch.py [--packages 300]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from watchdog.events import FileSystemEventHandler  # noqa: E402
from watchdog.observers import Observer  # noqa: E402

from hal0_reconciler import settings as settings_mod  # noqa: E402
from hal0_reconciler.daemon import watch  # noqa: E402
from hal0_reconciler.daemon.workqueue import Special  # noqa: E402
from hal0_reconciler.host.hal0 import reader as hal0  # noqa: E402
from hal0_reconciler.slots import store  # noqa: E402
from helpers.hal0_tree import Hal0Tree  # noqa: E402


class _Count(FileSystemEventHandler):
    def __init__(self) -> None:
        self.events = 0

    def on_any_event(self, event: object) -> None:
        self.events += 1


def _quiet(keys: list[object], *, settle: float = 0.5, limit: float = 10.0) -> None:
    """Wait until no key arrived for ``settle`` seconds."""
    start = time.monotonic()
    seen = -1
    while time.monotonic() - start < limit:
        if seen == len(keys):
            return
        seen = len(keys)
        time.sleep(settle)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--packages", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "etc/hal0/slots").mkdir(parents=True)
        (root / "usr/lib").mkdir(parents=True)
        tree = Hal0Tree(root)
        current = settings_mod.load(
            None, {**tree.settings(), "slots_dir": str(root / "etc/hal0/slots")}
        )
        keys: list[object] = []
        lock = threading.Lock()

        def enqueue(batch: object) -> None:
            with lock:
                keys.extend(batch)  # type: ignore[call-overload]

        watcher = watch.Watcher(
            slots_dir=current.slots_dir,
            dev_dir=None,
            kfd_name="kfd",
            dri_dir=None,
            is_slot_name=store.is_slot_file_name,
            enqueue=enqueue,
            wake=lambda: None,
        )
        watcher.set_hal0_files(hal0.hal0_paths(current).watched())
        watcher.start()
        naive = _Count()
        counter = Observer()
        counter.schedule(naive, str(root / "usr/lib"), recursive=False)
        counter.start()
        try:
            began = time.perf_counter()
            for i in range(args.packages):  # a package install beside the missing hal0
                folder = root / f"usr/lib/pkg{i}"
                folder.mkdir()
                for j in range(5):
                    (folder / f"f{j}.so").write_bytes(b"x")
                (root / f"usr/lib/lib{i}.so.1").write_bytes(b"y")
            _quiet(keys)
            install_s = time.perf_counter() - began
            passes_install = sum(k is Special.EVERYTHING for k in keys)
            keys.clear()
            began = time.perf_counter()
            tree.install("0826")
            while not any(k is Special.EVERYTHING for k in keys):
                watcher.set_hal0_files(hal0.hal0_paths(current).watched())  # the main loop
                time.sleep(0.001)
            first_s = time.perf_counter() - began
            for _ in range(20):  # the main loop moves the watches down as folders appear
                watcher.set_hal0_files(hal0.hal0_paths(current).watched())
                time.sleep(0.05)
            _quiet(keys)
            passes_hal0 = sum(k is Special.EVERYTHING for k in keys)
        finally:
            watcher.stop()
            counter.stop()
            counter.join(timeout=5)
    print(
        f"package install beside the missing hal0: {args.packages} folders, "
        f"{args.packages * 6} files, {install_s:.2f} s"
    )
    print(
        f"  inotify events in the watched ancestor: {naive.events} "
        f"(a naive ancestor watch: {naive.events} full passes)"
    )
    print(f"  full passes asked for: {passes_install}")
    print(
        f"hal0 installed: first full pass asked for after {first_s * 1000:.1f} ms; "
        f"{passes_hal0} full passes in all while its folders appeared"
    )


if __name__ == "__main__":
    main()
