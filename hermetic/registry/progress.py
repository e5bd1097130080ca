"""Byte progress for transfers: ``TransferProgress.start(description, total)`` returns a callable that advances by n
bytes; the library default is silent, the CLI passes its bars."""

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
