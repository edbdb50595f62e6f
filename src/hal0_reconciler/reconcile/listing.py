"""Which slot files a pass looks at: their keys (the path made absolute) and names, from the
folder's listing (the same lists again while the folder lists the same names), or as given."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from hal0_reconciler.model import SlotKey
from hal0_reconciler.slots import store

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path


def slot_key(path: Path) -> SlotKey:
    """A slot file's key: its path, made absolute."""
    return SlotKey(str(path if path.is_absolute() else path.absolute()))


def keyed(paths: Iterable[Path]) -> tuple[list[SlotKey], list[Path]]:
    """The given files' keys, and the files, in their order."""
    pairs = [(slot_key(p), p) for p in paths]
    return [k for k, _ in pairs], [p for _, p in pairs]


class FolderListing:
    """The slots folder's slot files, with the last listing kept to answer the same again."""

    def __init__(self) -> None:
        # the folder, its names as listed, and the slot files' keys and names made of them
        self._last: tuple[str, list[str], list[SlotKey], list[str]] | None = None

    def slot_files(self, folder: Path) -> tuple[list[SlotKey], list[str]]:
        """Every slot file's key and name: no Path object each (the same lists as last time
        when the folder lists the same names in the same order)."""
        base = str(folder if folder.is_absolute() else folder.absolute())
        listed = store.list_folder(folder)
        last = self._last
        if last is not None and last[0] == base and last[1] == listed:
            return last[2], last[3]
        prefix = base if base.endswith("/") else base + "/"  # str keys, not 10k Path objects
        names = store.slot_names(listed)
        keys = cast("list[SlotKey]", [prefix + n for n in names])
        self._last = (base, listed, keys, names)
        return keys, names
