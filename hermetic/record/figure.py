"""runs/<id>/metrics.png: the run's metrics over steps, which its README.md shows.

Drawn once, when the final record is written (``write_record`` with
``finished_at`` set), and only when matplotlib (``hermetic[plots]``) is
installed and the run logged metrics; otherwise there is no figure and the
README says nothing of one. The figure sits beside run.json, outside
``outputs/``, so it is not part of what a run produced and never enters a diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FIGURE_NAME = "metrics.png"


_warm: list = []


def warm_up() -> None:
    """Import matplotlib in a background thread (once per process), so that the final record's
    figure costs only the drawing: called when a run's early record is written, the import
    (~0.3 s of CPU) overlaps the container, which mostly waits on the engine."""
    from hermetic import plotting

    if _warm or not plotting.available():
        return
    import threading

    t = threading.Thread(target=plotting.preload, name="hermetic-figure-import", daemon=True)
    _warm.append(t)
    t.start()


class FigureDrawing:
    """``metrics.png`` being drawn by a child process (fork), while the parent validates, seals and writes
    the record: on two cores the drawing (~0.3 s of matplotlib) is off the run's critical path but for
    what is left of it at ``join``. Joined before the README is written, so the figure exists when
    ``hermetic run`` returns; a child that fails leaves no figure (best effort, as when drawn inline)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._name: str | None = None
        self._joined = False

    def join(self) -> str | None:
        """The figure's name once the child has drawn it, or None (nothing to draw, or it failed)."""
        if not self._joined:
            self._joined = True
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                return None
            self._name = FIGURE_NAME if os.waitstatus_to_exitcode(status) == 0 else None
        return self._name


def start_metrics_figure(run_dir: str | Path, record: dict[str, Any], *,
                         series: list[dict[str, Any]] | None = None) -> FigureDrawing | None:
    """Start drawing the final record's figure in a child process; None when there is nothing to draw
    (no metrics, not final, no matplotlib) or no child could be started (the caller draws inline then)."""
    from hermetic import plotting

    has_series = record["metrics"].get("series") or record["metrics"]["file"]
    if record["record"]["finished_at"] is None or not has_series or not plotting.available():
        return None
    for t in _warm:  # no import half done in a thread at the fork: the child would inherit its lock held
        t.join()
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: draw, and leave without running the parent's exit handlers or flushing its files
        code = 1
        try:
            import signal

            for sig in (signal.SIGINT, signal.SIGTERM):  # not the run's handlers (they stop its container)
                signal.signal(sig, signal.SIG_DFL)
            code = 0 if write_metrics_figure(run_dir, record, series=series) else 3
        finally:
            os._exit(code)
    return FigureDrawing(pid)


def run_panels(series: dict[str, list[tuple[int, float]]], label: str):  # -> list[hermetic.plotting.Panel]
    """One panel per metric (counters left out, unless that is all there is), one curve each."""
    from hermetic.plotting import Curve, Panel
    from hermetic.record.metrics import is_counter

    names = [n for n in series if not is_counter(n)] or list(series)
    return [Panel(n, [Curve(label, [s for s, _ in series[n]], [v for _, v in series[n]], 0)], legend=False)
            for n in names]


def write_metrics_figure(run_dir: str | Path, record: dict[str, Any], *,
                         series: list[dict[str, Any]] | None = None) -> str | None:
    """Draw ``run_dir/metrics.png`` for a finished run with metrics; its name, or None when there is none.

    The series is the run's series file (hermetic.record.metrics.load_series: checked against the record),
    wall-clock figures left out; ``series``: that file's entries as the collection wrote them, when the
    caller has them (not read back then). Best effort: the figure illustrates the record, so a failure to
    draw it (an unwritable directory, a series that is not what the record says) leaves no figure rather
    than failing the run.
    """
    from hermetic import plotting
    from hermetic.errors import HermeticError
    from hermetic.record.metrics import load_series, run_series

    run_dir = Path(run_dir)
    has_series = record["metrics"].get("series") or record["metrics"]["file"]
    if record["record"]["finished_at"] is None or not has_series or not plotting.available():
        return None
    try:
        found = (run_series(series) if series is not None and record["metrics"].get("series")
                 else load_series(run_dir, record)).compared()
        if not found:
            return None
        plotting.save(run_panels(found, record["record"]["run_id"]), run_dir / FIGURE_NAME,
                      title=f"run {record['record']['run_id']} ({record['record']['status']})")
    except (HermeticError, OSError, ValueError):
        return None
    return FIGURE_NAME
