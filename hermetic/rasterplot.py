"""Panels drawn straight into a PNG with Pillow: the figure every run's README shows.

``hermetic run`` draws runs/<id>/metrics.png on every run, before it returns.
matplotlib (hermetic.plotting, for ``runs plot`` and ``diff --plot``) costs
~0.6 s of CPU per process to import and draw, which on two cores was most of
what ``hermetic run`` added to ``docker run`` (docs/benchmarks.md); Pillow
(matplotlib's own image library) draws the same panels in a few hundredths of
a second. Same model (hermetic.plotting's ``Panel``/``Curve``/``Mark``), same
layout and size as plotting.render's PNG, matplotlib's default look (DejaVu
Sans when matplotlib is installed, ticks at 1-2-5 steps, a light grid). Lines
are drawn at twice the size and scaled down, which smooths them. The same
panels give the same bytes.
"""

from __future__ import annotations

import importlib.util
import math
import struct
import textwrap
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from hermetic.errors import NotFound

if TYPE_CHECKING:  # the model and its palette are hermetic.plotting's, imported where drawn (the run's own
    from hermetic.plotting import Panel  # process only asks whether Pillow is there: `available`)

SCALE = 2  # drawn at twice the size, then reduced: smooth lines without an antialiasing renderer
PT = 100 / 72  # pixels per point at hermetic.plotting's DPI (100; tests/test_plots.py holds them together)
GRID = (235, 235, 235)
INK = (0, 0, 0)


def available() -> bool:
    """Whether Pillow is installed (without importing it)."""
    return importlib.util.find_spec("PIL") is not None


def _font_path() -> str | None:
    """matplotlib's DejaVu Sans, found without importing matplotlib; None: Pillow's own font."""
    spec = importlib.util.find_spec("matplotlib")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        if path.is_file():
            return str(path)
    return None


_fonts: dict[float, object] = {}


def _font(size_pt: float):  # -> PIL.ImageFont.FreeTypeFont (or Pillow's bitmap font, before Pillow 10.1)
    from PIL import ImageFont

    if size_pt not in _fonts:
        px = max(1, round(size_pt * PT * SCALE))
        path = _font_path()
        try:
            _fonts[size_pt] = ImageFont.truetype(path, px) if path else ImageFont.load_default(px)
        except TypeError:  # Pillow < 10.1: one size only
            _fonts[size_pt] = ImageFont.load_default()
    return _fonts[size_pt]


def preload() -> None:
    """Import what render_png needs and load its fonts (record.figure's worker does it while the run's
    container runs)."""
    from PIL import Image, ImageDraw, PngImagePlugin  # noqa: F401

    Image.preinit()  # the format plugins Image.save looks through (~15 ms)
    for size in (7, 9, 10):
        _font(size)


def rehearse() -> bytes:
    """Draw a throwaway figure of the usual size (2x2 panels) twice, in memory (its PNG returned): the figure
    drawn next is drawn in half the time (measured: docs/benchmarks.md).

    A process's first figure pays the kernel's first touch of the ~20 MB it writes (the canvas at twice the
    size, its bytes, the rows deflated): ~40 ms where a later one takes ~20. glibc serves a block the size of
    one freed from its own heap after that first free and keeps it, so after the second draw the pages stay
    mapped for the next. The record worker rehearses while the run's script runs, off its critical path."""
    from hermetic.plotting import Curve, Panel

    steps = list(range(20))
    panels = [Panel(name, [Curve("run", steps, [1 / (1 + s) for s in steps], 0)], legend=False)
              for name in ("loss", "acc", "val.loss", "val.acc")]
    for _ in range(2):
        png = render_png(panels, title="run 00000000-000000-000000 (succeeded)")
    return png


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Tick values at a 1, 2, 2.5 or 5 times a power of ten step, inside [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + step * 1e-9:
        ticks.append(k * step)
        k += 1
    return ticks


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """As few decimals as tell the ticks apart; scientific notation for very large or small values."""
    if len(ticks) < 2:
        return [f"{t:g}" for t in ticks]
    step = abs(ticks[1] - ticks[0])
    biggest = max(abs(t) for t in ticks)
    if biggest >= 1e6 or (0 < biggest < 1e-4) or step < 1e-6 * max(biggest, 1e-300):
        return [f"{t:.3g}" for t in ticks]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    while decimals < 8 and any(abs(float(f"{t:.{decimals}f}") - t) > step * 1e-3 for t in ticks):
        decimals += 1  # a 2.5 step: one more
    labels = [f"{t:.{decimals}f}" for t in ticks]
    return [label[1:] if label.startswith("-") and float(label) == 0 else label for label in labels]


def _span(values: Sequence[float]) -> tuple[float, float]:
    """The axis range: the data's, 5% wider on each side (matplotlib's default margins)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if hi == lo:
        pad = abs(lo) * 0.05 or 0.05
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def render_png(panels: Sequence["Panel"], *, title: str) -> bytes:
    """The figure as PNG bytes: one panel per entry, two columns when there are several (plotting.render's
    layout and size)."""
    from PIL import Image, ImageDraw

    from hermetic.plotting import DPI

    panels = [p for p in panels if p.curves]
    if not panels:
        raise NotFound(f"{title}: no metric values to draw")
    ncols = 1 if len(panels) == 1 else 2
    nrows = math.ceil(len(panels) / ncols)
    width_in, height_in = 5.6 * ncols, 3.2 * nrows + 0.5
    W, H = round(width_in * DPI) * SCALE, round(height_in * DPI) * SCALE
    img = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(img)
    label_font, title_font, small_font = _font(9), _font(10), _font(7)  # noqa: N806
    # plotting.render's fixed margins (inches) and spacing (fractions of an axes' size)
    left, right, top, bottom = 0.75 * DPI * SCALE, 0.15 * DPI * SCALE, 0.65 * DPI * SCALE, 0.5 * DPI * SCALE
    aw = (W - left - right) / (ncols + 0.2 * (ncols - 1))
    ah = (H - top - bottom) / (nrows + 0.32 * (nrows - 1))
    y = 0.12 * DPI * SCALE
    for line in textwrap.wrap(title, 110):
        tw = draw.textlength(line, font=title_font)
        draw.text(((W - tw) / 2, y), line, fill=INK, font=title_font)
        y += title_font.size * 1.2
    for i, panel in enumerate(panels):
        row, col = divmod(i, ncols)
        x0 = left + col * aw * 1.2
        y0 = top + row * ah * 1.32
        _draw_panel(draw, img, panel, (x0, y0, x0 + aw, y0 + ah), label_font, small_font)
    return _png(img.reduce(SCALE))


def _png(img) -> bytes:  # noqa: ANN001 - a PIL.Image.Image, RGB
    """``img`` as a PNG: every row unfiltered, deflated at zlib's fastest level (as plotting.render).

    Pillow's PNG encoder tries all five of PNG's row filters on every row and keeps the best (libpng's
    heuristic), which is half its encoding time for this figure (18.6 ms of 1120x690; 9.6 ms here); a
    figure of flat colours deflates as well unfiltered (78 kB here, 65 kB Pillow's). Written as the PNG
    specification's three chunks: IHDR (8-bit RGB, not interlaced), one IDAT, IEND; the same image gives
    the same bytes."""
    if img.mode != "RGB":
        raise ValueError(f"a {img.mode} image: this PNG writer writes 8-bit RGB only")
    width, height = img.size
    raw = img.tobytes()
    stride = width * 3
    rows = b"".join(b"\0" + raw[i:i + stride] for i in range(0, len(raw), stride))  # filter byte 0: none

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b""))


def _draw_panel(draw, img, panel: "Panel", box: tuple[float, float, float, float], font, small) -> None:  # noqa: ANN001
    from PIL import Image, ImageDraw

    from hermetic.plotting import colour

    x0, y0, x1, y1 = box
    steps = [float(s) for c in panel.curves for s in c.steps] + [float(m.step) for m in panel.marks]
    values = [float(v) for c in panel.curves for v in c.values]
    for c in panel.curves:
        if c.band is not None:
            values += [float(v) for v in c.band[0]] + [float(v) for v in c.band[1]]
    xlo, xhi = _span(steps)
    ylo, yhi = _span(values)

    def px(s: float) -> float:
        return x0 + (s - xlo) / (xhi - xlo) * (x1 - x0)

    def py(v: float) -> float:
        return y1 - (v - ylo) / (yhi - ylo) * (y1 - y0)

    tick = round(3.5 * PT * SCALE)
    gap = round(3.5 * PT * SCALE)
    xt = nice_ticks(xlo, xhi, 9)
    yt = nice_ticks(ylo, yhi, 8)
    for t in xt:
        draw.line([(px(t), y0), (px(t), y1)], fill=GRID, width=SCALE)
    for t in yt:
        draw.line([(x0, py(t)), (x1, py(t))], fill=GRID, width=SCALE)
    for c in panel.curves:
        if c.band is None:
            continue
        upper = [(px(float(s)), py(float(v))) for s, v in zip(c.steps, c.band[1]) if math.isfinite(v)]
        lower = [(px(float(s)), py(float(v))) for s, v in zip(c.steps, c.band[0]) if math.isfinite(v)]
        if len(upper) > 1 and len(lower) > 1:
            shade = Image.new("L", img.size, 0)
            ImageDraw.Draw(shade).polygon(upper + lower[::-1], fill=51)  # alpha 0.2, as plotting.render
            img.paste(colour(c.colour), mask=shade)
    # each curve thinner than the one under it, so where two coincide both stay visible
    for i, c in enumerate(panel.curves):
        width = max(1, round(max(1.0, 2.8 - 0.9 * i) * PT * SCALE))
        pts = [(px(float(s)), py(float(v))) for s, v in zip(c.steps, c.values) if math.isfinite(v)]
        if len(pts) == 1:
            r = 3 * PT * SCALE
            draw.ellipse([pts[0][0] - r, pts[0][1] - r, pts[0][0] + r, pts[0][1] + r], fill=colour(c.colour))
        elif pts:
            draw.line(pts, fill=colour(c.colour), width=width, joint="curve")
    for m in panel.marks:
        x = px(float(m.step))
        dash = 4 * PT * SCALE
        yy = y0
        while yy < y1:
            draw.line([(x, yy), (x, min(yy + dash, y1))], fill=colour(m.colour), width=max(1, round(PT * SCALE)))
            yy += dash * 1.6
    draw.rectangle([x0, y0, x1, y1], outline=INK, width=max(1, round(0.8 * PT * SCALE)))
    for t, label in zip(xt, tick_labels(xt)):
        x = px(t)
        draw.line([(x, y1), (x, y1 + tick)], fill=INK, width=SCALE)
        draw.text((x - draw.textlength(label, font=font) / 2, y1 + tick + gap / 2), label, fill=INK, font=font)
    for t, label in zip(yt, tick_labels(yt)):
        y = py(t)
        draw.line([(x0 - tick, y), (x0, y)], fill=INK, width=SCALE)
        draw.text((x0 - tick - gap - draw.textlength(label, font=font), y - font.size * 0.6), label, fill=INK,
                  font=font)
    xlabel_y = y1 + tick + gap / 2 + font.size * 1.25
    draw.text(((x0 + x1) / 2 - draw.textlength("step", font=font) / 2, xlabel_y), "step", fill=INK, font=font)
    draw.text(((x0 + x1) / 2 - draw.textlength(panel.title, font=font) / 2, y0 - font.size * 1.55), panel.title,
              fill=INK, font=font)
    if panel.legend or len(panel.curves) > 1 or panel.marks:
        _legend(draw, panel, (x0, y0, x1, y1), small)


def _legend(draw, panel: "Panel", box: tuple[float, float, float, float], font) -> None:  # noqa: ANN001
    """The curves' and marks' labels in a box at the panel's top right."""
    from hermetic.plotting import colour

    x0, y0, x1, y1 = box
    entries = [(c.label, colour(c.colour), False) for c in panel.curves] + \
              [(m.label, colour(m.colour), True) for m in panel.marks]
    line_h = font.size * 1.4
    swatch = 2 * font.size
    text_w = max(draw.textlength(label, font=font) for label, _, _ in entries)
    pad = font.size * 0.5
    bw, bh = pad * 3 + swatch + text_w, pad * 2 + line_h * len(entries)
    bx, by = x1 - bw - pad, y0 + pad
    draw.rectangle([bx, by, bx + bw, by + bh], fill="white", outline=(204, 204, 204), width=SCALE)
    for k, (label, fill, dashed) in enumerate(entries):
        ly = by + pad + line_h * k + line_h / 2
        if dashed:
            for d in range(0, int(swatch), int(font.size * 0.8)):
                draw.line([(bx + pad + d, ly), (bx + pad + min(d + font.size * 0.5, swatch), ly)], fill=fill,
                          width=SCALE)
        else:
            draw.line([(bx + pad, ly), (bx + pad + swatch, ly)], fill=fill, width=2 * SCALE)
        draw.text((bx + pad * 2 + swatch, ly - font.size * 0.6), label, fill=INK, font=font)


def save_png(panels: Sequence["Panel"], path: str | Path, *, title: str) -> Path:
    """Render and write atomically."""
    from hermetic.fsutil import atomic_write_bytes

    atomic_write_bytes(path, render_png(panels, title=title), fsync=False)
    return Path(path)
