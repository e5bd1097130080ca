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

FIGURE_NAME = "metrics.png"


class FigureWorker:
    """A child process forked when ``hermetic run`` starts (warm_up), which imports Pillow and loads the
    fonts while the run goes on, then waits to be sent the final record; it then draws ``metrics.png`` and
    exits. The drawing (~0.03 s) then overlaps the record being validated, sealed and written, and the
    run's own process never imports Pillow. A worker that was never sent anything ends when this process
    does (its pipe's end of file)."""

    def __init__(self, pid: int, send_fd: int) -> None:
        self.pid = pid
        self._send_fd = send_fd
        self.parent = os.getpid()  # a process forked from this one inherits the object, not the child

    @classmethod
    def fork(cls) -> "FigureWorker | None":
        try:
            read_fd, send_fd = os.pipe()
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(send_fd)
            return None
        if pid == 0:  # the child: never returns into the run's code, nor runs its exit handlers
            code = 1
            try:
                os.close(send_fd)
                code = _serve_one(read_fd)
            finally:
                os._exit(code)
        os.close(read_fd)
        return cls(pid, send_fd)

    def draw(self, run_dir: str | Path, record: dict[str, Any],
             series: list[dict[str, Any]] | None) -> "FigureDrawing | None":
        """Send the final record (and its series) to be drawn; None when the worker is gone."""
        import pickle

        job = pickle.dumps((str(run_dir), record, series), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with os.fdopen(self._send_fd, "wb") as pipe:
                pipe.write(len(job).to_bytes(8, "big") + job)
        except OSError:  # it died (killed, or its warm-up failed): reaped, and the caller draws
            _reap(self.pid)
            return None
        return FigureDrawing(self.pid)

    def forget(self) -> None:
        """In a process forked from the worker's parent: close the inherited copy of the worker's pipe (its
        end of file must not wait for this process too)."""
        try:
            os.close(self._send_fd)
        except OSError:
            pass


def _serve_one(read_fd: int) -> int:
    """In the worker: import, wait for the job, draw it; the exit code FigureDrawing reads (0: drawn)."""
    import pickle
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):  # not the run's handlers (they stop its container)
        signal.signal(sig, signal.SIG_DFL)
    try:  # the run's own process, the engine starting its container and the script come first: this one runs
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # only on a core none of them wants
    except (OSError, AttributeError):
        try:
            os.nice(5)
        except OSError:
            pass
    from hermetic import rasterplot

    try:
        rasterplot.preload()
    except Exception:  # noqa: BLE001 - best effort: the drawing below says whether it can draw
        pass
    with os.fdopen(read_fd, "rb") as pipe:
        head = pipe.read(8)
        if len(head) < 8:
            return 4  # nothing was sent: no figure wanted
        job = pipe.read(int.from_bytes(head, "big"))
    run_dir, record, series = pickle.loads(job)
    return 0 if write_metrics_figure(run_dir, record, series=series) else 3


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


_worker: FigureWorker | None = None


def _take_worker() -> FigureWorker | None:
    """The waiting worker, taken (the next run gets one of its own); None when none waits, or when the one
    there is the worker of the process this one was forked from."""
    global _worker
    worker, _worker = _worker, None
    if worker is not None and worker.parent != os.getpid():
        worker.forget()
        return None
    return worker


def warm_up() -> None:
    """Have a figure worker ready for a run's final record (called when `hermetic run` starts, and again
    when each run's early record is written): forked now unless one is waiting already (a previous run of
    this process ended without a figure); nothing when Pillow (``hermetic[plots]``) is not installed."""
    global _worker
    from hermetic import rasterplot

    _worker = _take_worker()
    if _worker is None and rasterplot.available():
        _worker = FigureWorker.fork()


class FigureDrawing:
    """``metrics.png`` being drawn by a child process, while the parent validates, seals and writes the
    record. Joined before the README is written, so the figure exists when ``hermetic run`` returns; a
    child that fails leaves no figure (best effort, as when drawn inline)."""

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
    """Start drawing the final record's figure in a child process: the waiting figure worker (warm_up),
    else one forked now; None when there is nothing to draw (no metrics, not final, no matplotlib) or no
    child could be started (the caller draws inline then)."""
    from hermetic import rasterplot

    has_series = record["metrics"].get("series") or record["metrics"]["file"]
    if record["record"]["finished_at"] is None or not has_series or not rasterplot.available():
        return None
    worker = _take_worker()
    drawing = worker.draw(run_dir, record, series) if worker is not None else None
    if drawing is None:  # none waiting (or it died): one forked now
        worker = FigureWorker.fork()
        drawing = worker.draw(run_dir, record, series) if worker is not None else None
    return drawing


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
    from hermetic import rasterplot
    from hermetic.errors import HermeticError
    from hermetic.record.metrics import load_series, run_series

    run_dir = Path(run_dir)
    has_series = record["metrics"].get("series") or record["metrics"]["file"]
    if record["record"]["finished_at"] is None or not has_series or not rasterplot.available():
        return None
    try:
        found = (run_series(series) if series is not None and record["metrics"].get("series")
                 else load_series(run_dir, record)).compared()
        if not found:
            return None
        rasterplot.save_png(run_panels(found, record["record"]["run_id"]), run_dir / FIGURE_NAME,
                      title=f"run {record['record']['run_id']} ({record['record']['status']})")
    except (HermeticError, OSError, ValueError):
        return None
    return FIGURE_NAME
