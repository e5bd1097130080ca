"""Figures of runs and seed groups: ``hermetic runs plot`` (a run's own figure too), ``hermetic diff --plot``.

One panel per metric, one curve per run (its metric series, hermetic.record.metrics); a group is the mean of
its members with the 95% interval of the mean as a band. Identical curves are drawn once, labelled with every
run; the first step where a run parts from the first run is marked.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hermetic.core.errors import NotFound, UsageError
from hermetic.record.outputs import nan_key

Series = dict[str, list[tuple[int, float]]]


@dataclass
class Entry:
    """A run or a group, ready to draw: ``series`` for a run, ``members`` (one series each) for a group."""

    id: str
    kind: str  # "run" | "group"
    series: Series = field(default_factory=dict)
    members: list[Series] = field(default_factory=list)
    wall_clock: set[str] = field(default_factory=set)  # wall-clock figures: drawn only when asked for

    def metric_names(self) -> set[str]:
        return set(self.series) if self.kind == "run" else {n for m in self.members for n in m}


@dataclass
class PlotResult:
    path: Path
    format: str
    entries: list[Entry]
    metrics: list[str]
    shared: dict[str, list[list[str]]]  # metric -> groups of entry IDs drawn as one curve
    first_difference: dict[str, dict[str, int]]  # metric -> {entry ID: first step differing from the first entry}

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "format": self.format, "metrics": self.metrics,
                "entries": [{"id": e.id, "kind": e.kind} for e in self.entries],
                "curves": {m: len(groups) for m, groups in self.shared.items()},
                "shared": self.shared, "first_difference": self.first_difference}


def load_entry(path: str | os.PathLike[str]) -> Entry:
    """A run directory (its seal and its series file checked) or a group directory (group.json and its
    succeeded members)."""
    from hermetic.record.group import load_group
    from hermetic.record.index import is_group_dir
    from hermetic.record.metrics import load_series
    from hermetic.record.rundir import load_record

    p = Path(path)
    if is_group_dir(p):
        group = load_group(p)
        members, clock = [], set()
        for m in group["members"]:
            if m["status"] != "succeeded":
                continue  # as in group.json's statistics
            found = load_series(p.parent / m["run_id"], load_record(p.parent / m["run_id"]))
            members.append(found.series)
            clock |= found.wall_clock
        return Entry(group["group"]["group_id"], "group", members=members, wall_clock=clock)
    rec = load_record(p)
    found = load_series(p, rec)
    return Entry(rec["record"]["run_id"], "run", series=found.series, wall_clock=found.wall_clock)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def first_difference(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> int | None:
    """The first step at which the two curves differ (a value, or a step only one has); None if equal."""
    da, db = dict(a), dict(b)  # the last value logged for a step wins, as in metrics.final
    for step in sorted(da.keys() | db.keys()):
        if step not in da or step not in db or not _same(da[step], db[step]):
            return step
    return None


def group_curve(members: list[Series], name: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps, mean, and the 95% interval of the mean (low, high) over the members that logged ``name``."""
    from hermetic.core.stats import summarize  # the group summary's own statistics, per step

    per_step: dict[int, list[float]] = {}
    for m in members:
        for step, value in dict(m.get(name, [])).items():
            if math.isfinite(value):
                per_step.setdefault(step, []).append(value)
    steps = sorted(per_step)
    stats = [summarize(per_step[step]) for step in steps]
    bands = [st["ci95"] or (st["mean"], st["mean"]) for st in stats]  # one member: no band
    return steps, [st["mean"] for st in stats], [low for low, _ in bands], [high for _, high in bands]


def build_panels(entries: Sequence[Entry], metrics: Sequence[str] | None = None):
    """(panels, metric names, shared curves, first differences) for ``entries`` (see the module doc)."""
    from hermetic.figures.render import Curve, Mark, Panel
    from hermetic.record.metrics import is_counter

    available = sorted(set().union(*(e.metric_names() for e in entries)))
    clock = set().union(*(e.wall_clock for e in entries))
    if metrics:
        unknown = [m for m in metrics if m not in available]
        if unknown:
            raise UsageError(f"--metric {unknown[0]}: no such metric in these runs (they have: "
                                f"{', '.join(available) or 'none'})")
        names = list(metrics)
    else:
        measured = [n for n in available if n not in clock]
        names = [n for n in measured if not is_counter(n)] or measured or available
    if not names:
        raise NotFound(f"{', '.join(e.id for e in entries)}: no metrics to plot (no numbers in metrics.jsonl, "
                       "TensorBoard event files, metrics.csv or the Trainer's files)")
    panels, shared, firsts = [], {}, {}
    for name in names:
        curves: list[tuple[tuple, list[str], list[str], int, Any]] = []  # (identity, IDs, labels, colour, data)
        for i, e in enumerate(entries):
            if e.kind == "run":
                pts = e.series.get(name)
                if not pts:
                    continue
                data = ([s for s, _ in pts], [v for _, v in pts], None)
            else:
                steps, mean, lo, hi = group_curve(e.members, name)
                if not steps:
                    continue
                data = (steps, mean, (lo, hi))
            ident = (tuple(data[0]), tuple(map(nan_key, data[1])), None if data[2] is None else
                     (tuple(data[2][0]), tuple(data[2][1])))
            same = next((c for c in curves if c[0] == ident), None)
            label = e.id if e.kind == "run" else f"{e.id}: mean of {len(e.members)} seeds, 95% CI"
            if same is not None:
                same[1].append(e.id)
                same[2].append(label)
            else:
                curves.append((ident, [e.id], [label], i, data))
        marks = []
        first = entries[0]
        if first.kind == "run" and first.series.get(name):
            for i, e in enumerate(entries[1:], 1):
                if e.kind == "run" and e.series.get(name):
                    step = first_difference(first.series[name], e.series[name])
                    if step is not None:
                        firsts.setdefault(name, {})[e.id] = step
                        marks.append(Mark(step, f"{e.id} differs from step {step}", i))
        panel_curves = [Curve(" = ".join(labels) + (" (identical)" if len(labels) > 1 else ""), d[0], d[1], colour,
                              band=d[2]) for _, _, labels, colour, d in curves]
        shared[name] = [ids for _, ids, _, _, _ in curves]
        panels.append(Panel(name, panel_curves, marks))
    return panels, names, shared, firsts


def plot(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
         metrics: Sequence[str] | None = None, title: str | None = None) -> PlotResult:
    """Draw the runs/groups at ``paths`` into ``out`` (.png or .svg)."""
    from hermetic.figures import render

    fmt = render.figure_format(out)
    render.require("plotting runs")
    entries = [load_entry(p) for p in paths]
    panels, names, shared, firsts = build_panels(entries, metrics)
    if title is None:
        ids = [e.id for e in entries]
        title = " vs ".join(ids) if len(ids) <= 3 else f"{', '.join(ids[:3])} and {len(ids) - 3} more"
    path = render.save(panels, out, title=title)
    return PlotResult(path, fmt, entries, names, shared, firsts)
