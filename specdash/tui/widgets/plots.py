"""The dashboard's charts, on textual-plot (a maintained plotting widget for Textual).

Why textual-plot: fixed y limits (acceptance lives on 0..1, never rescaled to the data),
braille lines, bars, error bars, vertical lines and a legend, drawn natively (no ANSI
string parsed back, as plotext needs). Its cost is real: a full redraw of a wide chart
takes a few milliseconds of Python, and the engine it watches wants those cores. So a
chart redraws only when what it shows changed (`show()` compares a key), and only on the
dashboard's refresh timer, never per token.

What is added here: colours from the theme's variables, compact margins that fit a
7-row panel, no focus (the dashboard's keys are not zoom keys), and labelled markers:
a vertical line per hot-swap with its short label written at the top of the chart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from textual.color import Color, ColorParseError
from textual_hires_canvas import Canvas, HiResMode
from textual_plot import LegendLocation, PlotWidget
from textual_plot.axis_formatter import NumericAxisFormatter


# Quadrant blocks (2x2 per cell), not braille (2x4): the block elements are in every
# monospace font, so an SVG screenshot renders the same in a browser or rsvg as in the
# terminal. Braille glyphs fall back to other fonts there, with other widths, and drag
# the rest of their line out of place.
HIRES = HiResMode.QUADRANT
FREE = (" ", "│")  # cells a marker label may write over: blank, or another marker's line


@dataclass(frozen=True, slots=True)
class Series:
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    colour: str  # a theme variable ("chart-line") or a colour
    label: str | None = None
    kind: str = "line"  # line | step | bars | points


class Plot(PlotWidget, can_focus=False):
    """A chart that renders what `show()` was given, redrawing only when that changed."""

    DEFAULT_CSS = """
    Plot { height: 1fr; width: 1fr; }
    Plot > .plot--axis { color: $chart-axis; }
    Plot > .plot--tick { color: $chart-axis; text-style: none; }
    Plot > .plot--label { color: $chart-axis; text-style: none; }
    Plot #legend { border: round $chart-axis; background: $surface; }
    """

    def __init__(self, *, y_format: str = "{:g}", x_format: str | None = None, **kwargs: Any):
        super().__init__(allow_pan_and_zoom=False, **kwargs)
        self._key: object = None
        self._markers: list[tuple[float, str]] = []
        self._y_format = y_format
        self.set_y_formatter(_Formatter(y_format))
        if x_format is not None:
            self.set_x_formatter(_Formatter(x_format))

    def on_mount(self) -> None:
        super().on_mount()
        self._fit_margins()

    def on_resize(self) -> None:
        self._fit_margins()

    def _fit_margins(self) -> None:
        # x tick labels only where there is room for data rows as well (a compact 80x24
        # panel has 5 rows: the frame takes 2, the data keeps 3)
        tall = self.size.height >= 8
        # y tick labels where the chart is wide enough to spare 5 columns for them
        margins = (0, 1 if tall else 0, 5 if self.size.width >= 24 else 0)
        if margins != (self.margin_top, self.margin_bottom, self.margin_left):
            self.margin_top, self.margin_bottom, self.margin_left = margins
            # PlotWidget resizes its canvases only on a layout refresh of its own.
            self.refresh(layout=True)

    def colour(self, name: str) -> str:
        """A theme variable's colour (or a colour) as a rich style string."""
        value = self.app.get_css_variables().get(name) or name
        try:
            return str(Color.parse(value).rich_color.name)  # "ansi_bright_blue" -> "color(12)"
        except ColorParseError:
            return value

    def show(self, series: Sequence[Series], *, x_limits: tuple[float, float] | None = None,
             y_limits: tuple[float, float] | None = None, markers: Sequence[tuple[float, str]] = (),
             x_ticks: Sequence[float] | None = None, y_ticks: Sequence[float] | None = None,
             legend: bool = False, legend_at: LegendLocation = LegendLocation.TOPRIGHT,
             bar_width: float = 0.7) -> None:
        # The one door into the charts: whatever a source or a fold let through, no NaN,
        # infinity or absurd magnitude reaches textual-plot (its axis code turns them into
        # `ValueError: cannot convert float NaN to integer` inside a render).
        series = [clean_series(s) for s in series]
        x_limits, y_limits = clean_limits(x_limits), clean_limits(y_limits)
        markers = [(x, label) for x, label in markers if plottable(x)]
        x_ticks = None if x_ticks is None else [x for x in x_ticks if plottable(x)]
        y_ticks = None if y_ticks is None else [y for y in y_ticks if plottable(y)]
        key = (tuple(series), x_limits, y_limits, tuple(markers), tuple(x_ticks or ()), tuple(y_ticks or ()),
               legend, legend_at, bar_width, self.app.theme, self.size)
        if key == self._key:
            return
        self._key = key
        self._markers = list(markers)
        self.clear()
        if x_limits:
            self.set_xlimits(*x_limits)
        if y_limits:
            self.set_ylimits(*y_limits)
        self.set_xticks(list(x_ticks) if x_ticks is not None else None)
        if y_ticks and self.size.height < 6:
            y_ticks = [y_ticks[0], y_ticks[-1]]  # no room for a middle label
        self.set_yticks(list(y_ticks) if y_ticks is not None else None)
        for s in series:
            style = self.colour(s.colour)
            if not s.xs:
                continue
            if s.kind == "bars":
                self.bar(list(s.xs), list(s.ys), width=bar_width, bar_style=style, hires_mode=HIRES,
                         label=s.label)
            elif s.kind == "points":
                self.scatter(list(s.xs), list(s.ys), marker="●", marker_style=style, label=s.label)
            else:
                xs, ys = (_steps(s.xs, s.ys) if s.kind == "step" else (s.xs, s.ys))
                self.plot(list(xs), list(ys), line_style=style, hires_mode=HIRES, label=s.label)
        for x, _ in self._markers:
            self.add_v_line(x, self.colour("chart-reference"))
        self.show_legend(legend_at, is_visible=legend)
        self._fit_margins()

    def _render_plot(self) -> None:
        super()._render_plot()
        if not self._markers:
            return
        canvas = self.query_one("#plot", Canvas)
        if canvas._canvas_size is None or canvas.size.height < 3:
            return
        style = self.colour("chart-reference")
        rows = range(1, canvas.size.height - 1)
        for x, label in self._markers:
            px, _ = self.get_pixel_from_coordinate(x, 0)
            text = label[: max(canvas.size.width - px - 2, 0)]
            if not text:
                continue
            # The row where the label covers the least data (or other labels), top first;
            # where it must cover some, it yields: only blank cells (and the lines of
            # other markers) are written.
            span = range(px + 1, px + 1 + len(text))
            row = min(rows, key=lambda r: sum(canvas._buffer[r][c] not in FREE for c in span))
            for i, c in enumerate(span):
                if canvas._buffer[row][c] in FREE:
                    canvas._buffer[row][c] = text[i]
                    canvas._styles[row][c] = style
        canvas.refresh()


# Beyond this a value is not a measurement (a corrupt counter, a rate over a denormal
# interval): the chart leaves the point out rather than squash every other point to zero.
PLOT_MAX = 1e15


def plottable(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= PLOT_MAX


def clean_series(s: Series) -> Series:
    """`s` without the points whose x or y cannot be drawn."""
    if all(plottable(x) and plottable(y) for x, y in zip(s.xs, s.ys)) and len(s.xs) == len(s.ys):
        return s
    kept = [(x, y) for x, y in zip(s.xs, s.ys) if plottable(x) and plottable(y)]
    return Series(tuple(x for x, _ in kept), tuple(y for _, y in kept), s.colour, s.label, s.kind)


def clean_limits(limits: tuple[float, float] | None) -> tuple[float, float] | None:
    """Axis limits, or None (fit to the data) when they cannot be drawn."""
    if limits is None or not all(plottable(v) for v in limits):
        return None
    return limits


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n that is >= value (axis tops that read well)."""
    if not value > 0:  # also NaN
        return 1.0
    value = min(value, PLOT_MAX)
    exp = math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        top = m * 10**exp
        if top >= value * (1 - 1e-9):
            return float(top)
    return float(10 ** (exp + 1))


__all__ = ["HIRES", "LegendLocation", "PLOT_MAX", "Plot", "Series", "clean_limits", "clean_series", "nice_ceiling",
           "plottable"]


def _steps(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """A value held until the next one (K per bin): horizontal runs, vertical jumps."""
    out_x: list[float] = []
    out_y: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        start = xs[i - 1] if i else x
        out_x += [start, x]
        out_y += [y, y]
    return out_x, out_y


class _Formatter(NumericAxisFormatter):
    def __init__(self, fmt: str):
        super().__init__()
        self._fmt = fmt

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        return [self._fmt.format(t) for t in ticks]
