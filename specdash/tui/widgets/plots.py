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
from collections.abc import Callable, Sequence
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
FREE = (" ", "│")  # cells that hold no data: blank, or a marker's line


@dataclass(frozen=True, slots=True)
class Series:
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    colour: str  # a theme variable ("chart-line") or a colour
    label: str | None = None
    kind: str = "line"  # line | step | bars | points
    marker: str = "●"  # points: the character drawn (and shown in the legend)


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
                self.scatter(list(s.xs), list(s.ys), marker=s.marker, marker_style=style, label=s.label)
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
        buffer = canvas._buffer
        width = canvas.size.width

        def data_cells(row: int, start: int, end: int) -> int:
            return sum(buffer[row][c] not in FREE for c in range(start, end + 1))

        lines = [(self.get_pixel_from_coordinate(x, 0)[0], label) for x, label in self._markers]
        # Inside the frame: its top and bottom rows, its left and right columns are axes.
        placed, _ = layout_labels(lines, range(1, width - 1), range(1, canvas.size.height - 1), data_cells)
        # Written whole, over the chart's own cells where the row has some: a label with
        # holes in it cannot be read, and layout_labels picked the row covering the least.
        for label in placed:
            for i, ch in enumerate(label.text):
                buffer[label.row][label.col + i] = ch
                canvas._styles[label.row][label.col + i] = style
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
    return Series(tuple(x for x, _ in kept), tuple(y for _, y in kept), s.colour, s.label, s.kind, s.marker)


def clean_limits(limits: tuple[float, float] | None) -> tuple[float, float] | None:
    """Axis limits, or None (fit to the data) when they cannot be drawn."""
    if limits is None or not all(plottable(v) for v in limits):
        return None
    return limits


MIN_SHORT = 3  # a shortened label keeps at least this many characters before its "…"


@dataclass(frozen=True, slots=True)
class PlacedLabel:
    col: int  # its first cell
    row: int
    text: str

    @property
    def end(self) -> int:
        return self.col + len(self.text) - 1


def layout_labels(lines: Sequence[tuple[int, str]], columns: range, rows: Sequence[int],
                  cost: Callable[[int, int, int], int] | None = None) -> tuple[list[PlacedLabel], int]:
    """Where the markers' labels go, so that none runs into another: `lines` are (the
    column of a marker's line, its label) and the cells labels may use (`columns` by
    `rows`: inside the chart's frame); returns the labels placed and how many were
    dropped. Hot-swaps in quick succession put their lines a cell or two apart, and
    labels written side by side read as one ("K=12ixtive on"), so:

    - a label sits just right of its line, or just left of it where the chart ends;
    - on a row of `rows` where it keeps a blank cell from every other label: the row
      covering the least data (`cost(row, first, last)`, cells), top first; so labels
      of nearby lines stack;
    - where no row has room for all of it, it is cut to the room there is, with "…",
      if MIN_SHORT characters are left; where its line runs through an earlier label on
      every row, that label is cut short of the line if it can be; otherwise it is dropped;
    - dropped labels are counted ("+2 swaps", or "+2") at the right end of a row; a
      label gives its place up for the count if it must."""
    rows = list(rows)
    taken: dict[int, list[PlacedLabel]] = {row: [] for row in rows}
    score = cost or (lambda row, first, last: 0)
    placed: list[PlacedLabel] = []
    dropped = 0
    for px, label in sorted(lines, key=lambda line: line[0]):
        if px not in columns or not label:
            continue  # off the chart: nothing to label
        # (rank, the label's place, a label cut to make room for it or None)
        best: tuple[tuple[int, ...], PlacedLabel, tuple[PlacedLabel, PlacedLabel] | None] | None = None
        for index, row in enumerate(rows):
            options: list[tuple[tuple[int, ...], PlacedLabel, tuple[PlacedLabel, PlacedLabel] | None]] = [
                (rank, spot, None) for rank, spot in _options(label, px, row, taken[row], columns)]
            # Our line runs through the label of an earlier line: cut that one short of it.
            # (Lines come left to right, so that label sits right of its own line: it
            # stays next to it.)
            blocking = [other for other in taken[row] if other.col <= px <= other.end]
            if not options and len(blocking) == 1 and px - blocking[0].col >= MIN_SHORT + 1:
                other = blocking[0]
                cut = PlacedLabel(other.col, row, other.text[: px - other.col - 1] + "…")
                rest = [cut if o is other else o for o in taken[row]]
                options = [((2, *rank), spot, (other, cut)) for rank, spot in _options(label, px, row, rest, columns)]
            for rank, spot, swap in options:
                key = (*rank, score(row, spot.col, spot.end), index)
                if best is None or key < best[0]:
                    best = (key, spot, swap)
        if best is None:
            dropped += 1
            continue
        _, spot, swap = best
        if swap is not None:
            old, cut = swap
            placed[placed.index(old)] = cut
            taken[old.row][taken[old.row].index(old)] = cut
        placed.append(spot)
        taken[spot.row].append(spot)
    while dropped and rows:
        for count in (f"+{dropped} swap{'s' if dropped > 1 else ''}", f"+{dropped}"):
            for row in rows:
                spot = PlacedLabel(columns.stop - len(count), row, count)
                if spot.col >= columns.start and all(spot.col > other.end + 1 for other in taken[row]):
                    return placed + [spot], dropped
        if not placed:
            break
        # No row has room at its right end: the label ending furthest right gives way.
        last = max(placed, key=lambda p: (p.end, -rows.index(p.row)))
        placed.remove(last)
        taken[last.row].remove(last)
        dropped += 1
    return placed, dropped


def _options(label: str, px: int, row: int, taken: Sequence[PlacedLabel],
             columns: range) -> list[tuple[tuple[int, ...], PlacedLabel]]:
    """Where the label of the line at `px` can go on a row holding `taken`, ranked: whole
    right of the line, whole left of it, then cut to the most room (with "…")."""
    right, left = _room(taken, px, columns)
    if right >= len(label):
        return [((0, 0), PlacedLabel(px + 1, row, label))]
    if left >= len(label):
        return [((0, 1), PlacedLabel(px - len(label), row, label))]
    room, side = max((right, 0), (left, 1))
    if room < MIN_SHORT + 1:
        return []
    return [((1, -room), PlacedLabel(px + 1 if side == 0 else px - room, row, label[: room - 1] + "…"))]


def _room(taken: Sequence[PlacedLabel], px: int, columns: range) -> tuple[int, int]:
    """Cells free for a label right of column px and left of it, in a row holding the
    labels `taken`, keeping a blank cell from each of them."""
    right_end, left_start = columns.stop - 1, columns.start
    for other in taken:
        if other.col > px:
            right_end = min(right_end, other.col - 2)
        if other.end < px:
            left_start = max(left_start, other.end + 2)
        if other.col <= px <= other.end:
            return 0, 0  # the line runs through a label here
    return max(right_end - px, 0), max(px - left_start, 0)


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
