"""Drawing runs/<id>/metrics.png from a finished record (hermetic.rasterplot), in whichever process draws it:
the record worker (hermetic.record.worker), or the writer of the record itself (hermetic.record.figure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIGURE_NAME = "metrics.png"


def run_panels(series: dict[str, list[tuple[int, float]]], label: str):  # -> list[hermetic.plotting.Panel]
    """One panel per metric (counters left out, unless that is all there is), one curve each."""
    from hermetic.plotting import Curve, Panel
    from hermetic.record.metrics import is_counter

    names = [n for n in series if not is_counter(n)] or list(series)
    return [Panel(n, [Curve(label, [s for s, _ in series[n]], [v for _, v in series[n]], 0)], legend=False)
            for n in names]


def is_figured(record: dict[str, Any]) -> bool:
    """Whether ``record`` is one that gets a figure: final, with metrics (whether Pillow is there aside)."""
    has_series = record["metrics"].get("series") or record["metrics"]["file"]
    return record["record"]["finished_at"] is not None and bool(has_series)


def write_metrics_figure(run_dir: str | Path, record: dict[str, Any], *,
                         series: list[dict[str, Any]] | None = None) -> str | None:
    """Draw ``run_dir/metrics.png`` for a finished run with metrics; its name, or None when there is none.

    The series is the run's series file (hermetic.record.metrics.load_series: checked against the record),
    wall-clock figures left out; ``series``: that file's entries as the collection wrote them, when the
    caller has them (not read back then). Best effort: the figure illustrates the record, so a failure to
    draw it (an unwritable directory, a series that is not what the record says) leaves no figure rather
    than failing the run.
    """
    if not is_figured(record):
        return None  # before importing anything: every early record of a run comes here
    from hermetic import rasterplot
    from hermetic.errors import HermeticError
    from hermetic.record.metrics import load_series, run_series

    run_dir = Path(run_dir)
    if not rasterplot.available():
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
