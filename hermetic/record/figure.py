"""runs/<id>/metrics.png: the run's metrics over steps, which its README.md shows.

Drawn once, when the final record is written (``write_record`` with
``finished_at`` set), by Pillow (hermetic.rasterplot: a few hundredths of a
second, where matplotlib took ~0.6 s of CPU on every run), and only when Pillow
(``hermetic[plots]``) is installed and the run logged metrics; otherwise there
is no figure and the README says nothing of one. The figure sits beside run.json, outside
``outputs/``, so it is not part of what a run produced and never enters a diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermetic.record.drawing import FIGURE_NAME, is_figured, run_panels, write_metrics_figure  # noqa: F401 - its API


class FigureDrawing:
    """``metrics.png`` being drawn by a child process (the record worker's last job), while the parent seals
    and writes the record. Joined before the README is written, so the figure exists when ``hermetic run`` returns; a
    child that fails leaves no figure (best effort, as when drawn inline)."""

    def __init__(self, pid: int, worker: Any = None) -> None:
        self.pid = pid
        self._worker = worker  # the record worker that says when it has drawn (RecordWorker.drawn), if any
        self._name: str | None = None
        self._joined = False
        self._reaped = False  # waited for by join: not again (its pid may be another child's by then)

    def join(self) -> str | None:
        """The figure's name once the child has drawn it, or None (nothing to draw, or it failed). A worker that
        says when it has drawn is not waited for beyond that: ``reap`` it."""
        if not self._joined:
            self._joined = True
            said = self._worker.drawn() if self._worker is not None else None
            if said is not None:
                self._name = FIGURE_NAME if said else None
                return self._name
            self._reaped = True
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                return None
            self._name = FIGURE_NAME if os.waitstatus_to_exitcode(status) == 0 else None
        return self._name

    def reap(self) -> None:
        """After ``join``: the child reaped (``join`` waited for it, or it said it had drawn: then once it has
        exited, hermetic.record.worker.reap_later), so that none is left a zombie."""
        self.join()
        if not self._reaped:
            from hermetic.record.worker import reap_later

            self._reaped = True
            reap_later(self.pid)


def figure_wanted(record: dict[str, Any]) -> bool:
    """Whether ``record`` gets a figure: final, with metrics, and Pillow installed (not imported here)."""
    try:
        if not is_figured(record):
            return False
    except (KeyError, TypeError, AttributeError):
        return False  # not a record: its validation says why
    from hermetic import rasterplot

    return rasterplot.available()


def start_metrics_figure(run_dir: str | Path, record: dict[str, Any], *,
                         series: list[dict[str, Any]] | None = None, fork: bool = True) -> FigureDrawing | None:
    """Start drawing the final record's figure in a child process: the waiting record worker
    (hermetic.record.worker), else (``fork``) one forked now; None when there is nothing to draw (no
    metrics, not final, no Pillow) or no child could be started (the caller draws inline then)."""
    if not figure_wanted(record):
        return None
    from hermetic.record import worker as workers

    for worker in (workers.take(), None):
        worker = worker or (workers.RecordWorker.fork() if fork else None)  # none waiting, or it died
        if worker is None:
            return None
        try:
            return FigureDrawing(worker.draw(run_dir, record, series))
        except workers.WorkerGone:
            _reap(worker.pid)
    return None


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
