"""Which quarantine manifests and journals this daemon wrote: HMAC-SHA256 digests in root's state.

The key is 32 random bytes in ``<state>/quarantine.key`` (0600, made on first use); the digests
live in ``<state>/quarantine-digests.json`` (0600), keyed by JIT folder, quarantine id and kind
(``manifest`` or ``journal``), each with the quarantine folder's (device, inode). A manifest is
honoured only when its bytes, its JIT folder, its id and its folder's identity all match: a copy
planted under the same id (another folder) or edited bytes read as unverified. The state folder is
root's and never inside a tree; the files are never read through a link.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from hal0_reconciler import boundedread, fsio
from hal0_reconciler.aiter.quarantine import folder as quarantine_fs

KEY_FILE = "quarantine.key"
BOOK_FILE = "quarantine-digests.json"
LOCK_FILE = "quarantine.lock"
LOCK_WAIT = 30.0
_KEY_BYTES = 32
_BOOK_MAX = 4 << 20
_DOMAIN = b"hal0-reconciler quarantine v1"


class DigestUnavailable(quarantine_fs.HealFailed):
    """The key or the digest file cannot be used (unsafe, unreadable): nothing can be verified."""


class Book(Protocol):
    """The seam between the file operations (later a tree owner's child) and root's state."""

    def record(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> None:
        """Remember ``data`` as written by this daemon. Raises OSError / DigestUnavailable."""

    def verify(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> bool:
        """Whether this daemon wrote ``data`` for this quarantine folder."""

    def forget(self, jit: str, qid: str, kind: str | None = None) -> None:
        """Drop one digest (or all of a quarantine's). Raises OSError."""


class DigestBook:
    """The digests in ``state_dir`` (root's, 0700)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._key: bytes | None = None

    @contextlib.contextmanager
    def locked(self, *, wait: float = LOCK_WAIT) -> Iterator[None]:
        """One heal, restore, roll or prune at a time across the daemon and the CLI (a lock in
        root's state, never in a tree another user can write). HealFailed after ``wait``."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.state_dir / LOCK_FILE, flags, 0o600)
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise quarantine_fs.HealFailed(
                            f"another heal or restore held {self.state_dir / LOCK_FILE} for "
                            f"{wait:.0f} s; nothing was done"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def _load_key(self) -> bytes:
        if self._key is not None:
            return self._key
        path = self.state_dir / KEY_FILE
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = secrets.token_bytes(_KEY_BYTES)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            key = self._read_key(path)
        else:
            try:
                os.write(fd, key)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsio.fsync_directory(self.state_dir)
        self._key = key
        return key

    def _read_key(self, path: Path) -> bytes:
        try:
            st = os.lstat(path)
            data = boundedread.read_bounded(path, max_bytes=_KEY_BYTES)
        except (OSError, boundedread.ReadRefused) as exc:
            raise DigestUnavailable(f"quarantine key {path}: {exc}") from None
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise DigestUnavailable(
                f"quarantine key {path} is not private to uid {os.geteuid()} (mode "
                f"{stat.S_IMODE(st.st_mode):o}, owner {st.st_uid}): refused"
            )
        if data is None or len(data) != _KEY_BYTES:
            size = "missing" if data is None else f"{len(data)} bytes"
            raise DigestUnavailable(f"quarantine key {path} is {size}, not {_KEY_BYTES} bytes")
        return data

    def _digest(self, jit: str, qid: str, kind: str, data: bytes) -> str:
        message = b"\0".join([_DOMAIN, os.fsencode(jit), os.fsencode(qid), kind.encode(), data])
        return hmac.new(self._load_key(), message, hashlib.sha256).hexdigest()

    def _load(self) -> dict[str, dict[str, dict[str, dict[str, object]]]]:
        path = self.state_dir / BOOK_FILE
        try:
            data = boundedread.read_bounded(path, max_bytes=_BOOK_MAX, missing_ok=True)
            raw = json.loads(data) if data is not None else {}
        except boundedread.ReadRefused as exc:
            raise DigestUnavailable(str(exc)) from None
        except ValueError as exc:
            raise DigestUnavailable(f"{path} is not JSON ({exc})") from None
        return raw if isinstance(raw, dict) else {}

    def _save(self, book: dict[str, dict[str, dict[str, dict[str, object]]]]) -> None:
        fsio.write_json(self.state_dir / BOOK_FILE, book, mode=0o600, indent=1, sort_keys=True)

    def record(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> None:
        book = self._load()
        entry = {"digest": self._digest(jit, qid, kind, data), "dev": folder[0], "ino": folder[1]}
        book.setdefault(jit, {}).setdefault(qid, {})[kind] = entry
        self._save(book)

    def verify(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> bool:
        try:
            entry = self._load().get(jit, {}).get(qid, {}).get(kind)
            if not isinstance(entry, dict) or (entry.get("dev"), entry.get("ino")) != folder:
                return False
            return hmac.compare_digest(str(entry.get("digest")), self._digest(jit, qid, kind, data))
        except DigestUnavailable:
            return False

    def forget(self, jit: str, qid: str, kind: str | None = None) -> None:
        book = self._load()
        held = book.get(jit, {})
        if kind is None:
            held.pop(qid, None)
        else:
            with contextlib.suppress(KeyError):
                del held[qid][kind]
            if not held.get(qid, True):
                held.pop(qid, None)
        if not held:
            book.pop(jit, None)
        self._save(book)


class _NoBook:
    """For listing only: verifies nothing, records nothing."""

    def record(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> None:  # noqa: ARG002
        raise DigestUnavailable("listing only")

    def verify(self, jit: str, qid: str, kind: str, data: bytes, folder: tuple[int, int]) -> bool:  # noqa: ARG002
        return False

    def forget(self, jit: str, qid: str, kind: str | None = None) -> None:  # noqa: ARG002
        raise DigestUnavailable("listing only")


NO_BOOK = _NoBook()
