"""runs/<id>/metrics.png: the run's metrics over steps, which its README.md shows.

Drawn once, when the final record is written (``write_record`` with
``finished_at`` set), and only when matplotlib (``hermetic[plots]``) is
installed and the run logged metrics; otherwise there is no figure and the
README says nothing of one. The figure sits beside run.json, outside
``outputs/``, so it is not part of what a run produced and never enters a diff.
"""

from __future__ import annotations

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


def run_panels(series: dict[str, list[tuple[int, float]]], label: str):  # -> list[hermetic.plotting.Panel]
    """One panel per metric (counters left out, unless that is all there is), one curve each."""
    from hermetic.plotting import Curve, Panel
    from hermetic.record.metrics import is_counter

    names = [n for n in series if not is_counter(n)] or list(series)
    return [Panel(n, [Curve(label, [s for s, _ in series[n]], [v for _, v in series[n]], 0)], legend=False)
            for n in names]


def write_metrics_figure(run_dir: str | Path, record: dict[str, Any]) -> str | None:
    """Draw ``run_dir/metrics.png`` for a finished run with metrics; its name, or None when there is none.

    The series is the run's series file (hermetic.record.metrics.load_series: checked against the record),
    wall-clock figures left out. Best effort: the figure illustrates the record, so a failure to draw it
    (an unwritable directory, a series that is not what the record says) leaves no figure rather
    than failing the run.
    """
    from hermetic import plotting
    from hermetic.errors import HermeticError
    from hermetic.record.metrics import load_series

    run_dir = Path(run_dir)
    has_series = record["metrics"].get("series") or record["metrics"]["file"]
    if record["record"]["finished_at"] is None or not has_series or not plotting.available():
        return None
    try:
        series = load_series(run_dir, record).compared()
        if not series:
            return None
        plotting.save(run_panels(series, record["record"]["run_id"]), run_dir / FIGURE_NAME,
                      title=f"run {record['record']['run_id']} ({record['record']['status']})")
    except (HermeticError, OSError, ValueError):
        return None
    return FIGURE_NAME
