"""Byte progress for transfers: a rich bar on a TTY, nothing otherwise.

push/pull take a ``Progress``-like object with ``start(description, total)``
returning a callable that advances by n bytes; the CLI passes a RichProgress
when stderr is a terminal and the library default is silent.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol


class TransferProgress(Protocol):
    def start(self, description: str, total: int) -> Callable[[int], None]: ...

    def close(self) -> None: ...


class NoProgress:
    def start(self, description: str, total: int) -> Callable[[int], None]:
        return lambda n: None

    def close(self) -> None:
        pass


class RichProgress:
    """One bar per transfer on stderr; safe to advance from worker threads."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        from hermetic.cli.common import stderr_console

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeRemainingColumn(), console=stderr_console(), transient=True,
        )
        self._progress.start()
        self._lock = threading.Lock()

    def start(self, description: str, total: int) -> Callable[[int], None]:
        task = self._progress.add_task(description, total=total)

        def advance(n: int) -> None:
            with self._lock:
                self._progress.advance(task, n)

        return advance

    def close(self) -> None:
        self._progress.stop()
