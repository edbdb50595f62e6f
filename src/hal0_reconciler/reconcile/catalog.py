"""hal0's profile catalog as the pass uses it: read again only when the file changed, and a
file that cannot be read said once (again when the error changes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal0_reconciler import fsio
from hal0_reconciler._log import get_logger
from hal0_reconciler.model import Catalog
from hal0_reconciler.slots import store

if TYPE_CHECKING:
    from pathlib import Path

_log = get_logger("hal0_reconciler.reconcile")
_UNREAD = object()  # the profiles file has not been read yet


class CatalogFile:
    """The catalog read from one profiles file, kept while the file's identity is the same."""

    def __init__(self, path: Path) -> None:
        self._reported: str | None = None
        self.use(path)

    def use(self, path: Path) -> None:
        """Read this file from now on (new settings), at the next ``refresh`` and not before;
        an error already said stays said."""
        self._path = path
        self._identity: tuple[int, int, int, int] | object | None = _UNREAD
        self.catalog: Catalog = Catalog()

    def refresh(self, *, quiet: bool) -> Catalog:
        """The catalog as the file holds it now (``quiet``: not a host this daemon acts on)."""
        path = self._path
        try:
            identity: tuple[int, int, int, int] | None = fsio.identity_of(path.stat())
        except OSError:
            identity = None  # absent: the built-in profiles
        if identity != self._identity:
            self._identity = identity
            self.catalog = store.read_catalog(path)
        error = self.catalog.error
        if error is not None and error != self._reported and not quiet:
            _log.error("profiles.unreadable", path=str(path), error=error)
        self._reported = error
        return self.catalog
