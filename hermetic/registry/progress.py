"""Byte progress for transfers: the interface, and the silent default.

push/pull take a ``TransferProgress`` (``start(description, total)``
returning a callable that advances by n bytes); the library default is
silent, and the CLI passes its rich bars (hermetic/cli/progress.py) when
stderr is a terminal.
"""

from __future__ import annotations

from typing import Callable, Protocol


class TransferProgress(Protocol):
    def start(self, description: str, total: int) -> Callable[[int], None]: ...

    def close(self) -> None: ...


class NoProgress:
    def start(self, description: str, total: int) -> Callable[[int], None]:
        return lambda n: None

    def close(self) -> None:
        pass
