"""The one shape of every object that owns a thread: ``with x:`` starts it, leaving stops it."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    """Subclasses define ``start`` and ``stop`` (which joins); the context manager calls them."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
