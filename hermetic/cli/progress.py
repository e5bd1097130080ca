"""Progress bars for the commands (rich, on stderr, only when it is a terminal).

Library modules report through small callbacks and never draw; rich is imported only when a bar is shown.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from hermetic.cli.common import progress_enabled, stderr_console


class TransferBars:
    """One bar per transfer (push, pull); safe to advance from worker threads.

    Implements hermetic.registry.progress.TransferProgress.
    """

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
        )

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


def transfer_progress() -> Any:
    """Bars on a terminal, else the registry's silent default."""
    if progress_enabled():
        return TransferBars()
    from hermetic.registry.progress import NoProgress

    return NoProgress()


def download_bars(enabled: bool) -> tuple[Callable[[str, int, int | None], None] | None, Callable[[], None]]:
    """(callback(filename, bytes delta, total), stop) for parallel wheel downloads; (None, no-op) when off."""
    if not enabled:
        return None, lambda: None
    bars = TransferBars()
    advances: dict[str, Callable[[int], None]] = {}

    def cb(filename: str, delta: int, total: int | None) -> None:
        with bars._lock:
            if filename not in advances:
                advances[filename] = bars.start(filename[:48], total)
        advances[filename](delta)

    return cb, bars.close


def with_byte_bar(label: str, total: int, fn: Callable[[Callable[[int], None] | None], Any]) -> Any:
    """Run ``fn(advance)`` under a byte bar of ``total`` (a spinner when the total is unknown)."""
    if not progress_enabled():
        return fn(None)
    if not total:
        with stderr_console().status(label + " ..."):
            return fn(None)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  console=stderr_console(), transient=True) as progress:
        task = progress.add_task(label, total=total)
        return fn(lambda n: progress.advance(task, n))
