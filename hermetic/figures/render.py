"""Figures of metric curves: panels of lines over steps, optional bands and marks, to PNG or SVG.

Knows nothing of runs (hermetic.figures.runs makes the ``Panel``s). matplotlib (``hermetic[plots]``) on first
use, through ``Figure`` and Agg (never pyplot) with its default style; the same panels give the same bytes.
"""

from __future__ import annotations

import io
import math
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hermetic.core.errors import MissingExtra, NotFound, UsageError

# matplotlib's tab10, reordered so that the first two (the usual A and B) are blue and red.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
FORMATS = {".png": "png", ".svg": "svg"}
DPI = 100


@dataclass(frozen=True)
class Curve:
    """One line: ``values`` over ``steps``; ``band`` = (low, high) per step, drawn shaded."""

    label: str
    steps: Sequence[float]
    values: Sequence[float]
    colour: int  # index into PALETTE (wraps around)
    band: tuple[Sequence[float], Sequence[float]] | None = None


@dataclass(frozen=True)
class Mark:
    """A dashed vertical line at ``step`` with a short label (e.g. where two runs part)."""

    step: float
    label: str
    colour: int


@dataclass(frozen=True)
class Panel:
    title: str
    curves: Sequence[Curve]
    marks: Sequence[Mark] = ()
    legend: bool = True  # False: a lone curve whose label the figure's title already says


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def available() -> bool:
    """Whether matplotlib is installed (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def require(feature: str) -> None:
    """Raise MissingExtra naming ``hermetic[plots]`` when matplotlib is not installed."""
    if not available():
        raise MissingExtra(feature, "plots", "matplotlib")


def figure_format(path: str | os.PathLike[str]) -> str:
    """``png`` or ``svg`` from the file name; a usage error (exit 64) for anything else."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise UsageError(f"{path}: write the figure as .png or .svg (the suffix picks the format)")
    return fmt


def render(panels: Sequence[Panel], *, title: str, fmt: str = "png") -> bytes:
    """The figure as PNG or SVG bytes: one panel per entry, two columns when there are several."""
    require("drawing a figure")
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [p for p in panels if p.curves]
    if not panels:
        raise NotFound(f"{title}: no metric values to draw")
    ncols = 1 if len(panels) == 1 else 2
    nrows = math.ceil(len(panels) / ncols)
    with matplotlib.style.context("default"), matplotlib.rc_context({"svg.hashsalt": "hermetic", "font.size": 9}):
        width, height = 5.6 * ncols, 3.2 * nrows + 0.5
        fig = Figure(figsize=(width, height), dpi=DPI)
        FigureCanvasAgg(fig)
        # Fixed margins (inches): constrained layout is a large share of the drawing time.
        fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, top=1 - 0.65 / height,
                            bottom=0.5 / height, wspace=0.2, hspace=0.32)
        fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=10)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, panel in zip(axes, panels):
            _draw_panel(ax, panel)
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        buf = io.BytesIO()
        metadata = {"Date": None} if fmt == "svg" else {"Software": None}
        # PNG: zlib's fastest level (much faster to encode, slightly larger files; the same panels still
        # give the same bytes)
        extra = {"pil_kwargs": {"compress_level": 1}} if fmt == "png" else {}
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=metadata, **extra)
    return buf.getvalue()


def _draw_panel(ax, panel: Panel) -> None:  # noqa: ANN001 - a matplotlib Axes
    for i, c in enumerate(panel.curves):
        if c.band is not None:
            ax.fill_between(c.steps, c.band[0], c.band[1], color=colour(c.colour), alpha=0.2, linewidth=0)
        # each curve thinner than the one under it, so where two coincide both stay visible
        ax.plot(c.steps, c.values, color=colour(c.colour), linewidth=max(1.0, 2.8 - 0.9 * i), label=c.label,
                marker="o" if len(c.steps) == 1 else None)
    for m in panel.marks:
        ax.axvline(m.step, color=colour(m.colour), linestyle="--", linewidth=1.0, label=m.label)
    # y given: matplotlib then skips placing the title clear of top-side tick labels (there are none),
    # which would measure every axis's tight box
    ax.set_title(panel.title, fontsize=9, y=1.0)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    if panel.legend or len(panel.curves) > 1 or panel.marks:
        ax.legend(fontsize=7, loc="best")


def save(panels: Sequence[Panel], path: str | os.PathLike[str], *, title: str) -> Path:
    """Render and write atomically (the format from the suffix); returns the path."""
    from hermetic.hostfs.fsutil import atomic_write_bytes

    data = render(panels, title=title, fmt=figure_format(path))
    atomic_write_bytes(path, data, fsync=False)
    return Path(path)
