"""A bytes/s progress bar on stderr (rich, imported then) for work still going after half a second."""

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
        elapsed = time.monotonic() - self._start
        if self._progress is None and elapsed < _SHOW_AFTER_S:
            return
        from rich.filesize import decimal

        fields = {
            "files": f"{self._files:,}/{self._total_files:,} files",
            "bytes": decimal(done_bytes) + (f"/{decimal(self._total_bytes)}" if self._total_bytes else ""),
            "rate": f"{decimal(int(done_bytes / elapsed))}/s" if elapsed > 0 else "",
        }
        completed = done_bytes if self._total_bytes else self._files
        if self._progress is None:
            self._open(completed, fields)
        else:
            self._progress.update(self._task, completed=completed, **fields)

    def _open(self, completed: int, fields: dict[str, str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[bytes]}"),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[files]}"), TimeRemainingColumn(),
            console=Console(stderr=True, highlight=False), transient=True,
        )
        total = self._total_bytes or self._total_files
        self._task = self._progress.add_task(self._label, total=total, completed=completed, **fields)
        self._progress.start()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
