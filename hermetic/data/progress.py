"""A bytes/s progress bar on stderr that appears only for long work.

Short work (a warm verify, a small dataset) prints nothing; work still going
after half a second gets a rich bar with bytes, bytes/s, files and time left.
rich is imported only then.
"""

from __future__ import annotations

import time
from typing import Any

_SHOW_AFTER_S = 0.5


class ByteProgress:
    def __init__(self, label: str | None, total_bytes: int | None, total_files: int):
        self._label = label
        self._total_bytes = total_bytes
        self._total_files = total_files
        self._start = time.monotonic()
        self._progress: Any = None
        self._task: Any = None
        self._files = 0

    def update(self, done_bytes: int, done_files: int | None) -> None:
        if self._label is None:
            return
        if done_files is not None:
            self._files = done_files
        if self._progress is None:
            if time.monotonic() - self._start < _SHOW_AFTER_S:
                return
            self._open()
        self._progress.update(self._task, completed=done_bytes, files=self._files)

    def _open(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TextColumn("{task.fields[files]}/" + str(self._total_files) + " files"), TimeRemainingColumn(),
            console=Console(stderr=True, highlight=False), transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(self._label, total=self._total_bytes, files=self._files)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
