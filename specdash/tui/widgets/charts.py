"""Fixed-axis charts drawn with Unicode block characters.

Why not textual-plotext: drawing four small plots took ~38 ms of CPU per frame here
(plotext builds an ANSI string that is parsed back), which a 2-core machine takes
straight from the engine it is watching; these widgets cost well under a millisecond.
Why not Sparkline: it rescales to the data's own min..max, so an acceptance rate
wobbling around 0.7 looks like wild swings. Here the y axis is fixed (0..y_max) and the
caller decides y_max.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

_EIGHTHS = " ▁▂▃▄▅▆▇█"


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n that is >= value (axis tops that read well)."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        top = m * 10**exp
        if top >= value * (1 - 1e-9):
            return top
    return 10 ** (exp + 1)


def _column_cells(value: float | None, y_max: float, height: int) -> list[str]:
    """Cells of one column, top row first, for `value` on a 0..y_max axis."""
    if value is None or height <= 0:
        return [" "] * height
    eighths = round(max(0.0, min(value / y_max, 1.0)) * height * 8)
    full, part = divmod(eighths, 8)
    cells = []
    for row_from_bottom in range(height - 1, -1, -1):
        if row_from_bottom < full:
            cells.append("█")
        elif row_from_bottom == full and part:
            cells.append(_EIGHTHS[part])
        else:
            cells.append(" ")
    return cells


class TimeChart(Widget):
    """Newest value at the right, one column per value, on a fixed 0..y_max axis, with an
    optional horizontal reference line (e.g. plain-decoding speed)."""

    COMPONENT_CLASSES = {"timechart--bar", "timechart--reference", "timechart--axis"}

    DEFAULT_CSS = """
    TimeChart { height: 1fr; width: 1fr; }
    TimeChart > .timechart--bar { color: $chart-line; }
    TimeChart > .timechart--reference { color: $chart-reference; }
    TimeChart > .timechart--axis { color: $chart-axis; }
    """

    def __init__(
        self, fmt: Callable[[float], str], zero_marker: str | None = None, **kwargs
    ):
        """zero_marker: drawn on the bottom row for a value of exactly 0, where 0 means
        something (K=0 is plain decoding) and must not look like missing data."""
        super().__init__(**kwargs)
        self._fmt = fmt
        self._zero_marker = zero_marker
        self.values: list[float | None] = []
        self._top: float | Callable[[list[float]], float] = 1.0
        self.y_max = 1.0  # the axis top of the last render
        self.reference: float | None = None

    def set_data(
        self,
        values: Sequence[float | None],
        y_max: float | Callable[[list[float]], float],
        reference: float | None = None,
    ) -> None:
        """y_max: the axis top, or a function of the values that are visible (and the
        reference) giving it — axes that follow the data but always start at 0."""
        values = list(values)
        if values == self.values and reference == self.reference and self._top == y_max:
            return  # nothing new: no repaint
        self.values = values
        self._top = y_max
        self.reference = reference
        self.refresh()

    def _axis_top(self, visible: list[float | None]) -> float:
        if callable(self._top):
            present = [v for v in visible if v is not None]
            if self.reference is not None:
                present.append(self.reference)
            top = self._top(present)
        else:
            top = self._top
        return top if top > 0 else 1.0

    def _gutter(self) -> int:
        return max(len(self._fmt(self.y_max)), len(self._fmt(0.0))) + 1

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        # The axis top decides the gutter width, which decides what is visible: take the
        # top over a generous slice first, then settle on the exact one.
        self.y_max = self._axis_top(self.values[-width:])
        gutter = self._gutter()
        self.y_max = self._axis_top(self.values[-max(width - gutter, 1):])
        gutter = self._gutter()
        plot_w = width - gutter
        if height <= 0 or plot_w <= 0:
            return Text()
        bar = self.get_component_rich_style("timechart--bar")
        ref_style = self.get_component_rich_style("timechart--reference")
        axis = self.get_component_rich_style("timechart--axis")

        shown = self.values[-plot_w:]
        values: list[float | None] = [None] * (plot_w - len(shown))
        values += shown
        columns = [_column_cells(v, self.y_max, height) for v in values]
        if self._zero_marker:
            for v, col in zip(values, columns, strict=True):
                if v == 0:
                    col[-1] = self._zero_marker
        ref_row = None
        if self.reference is not None and 0 <= self.reference <= self.y_max:
            ref_row = height - 1 - min(int(self.reference / self.y_max * height), height - 1)

        labels = {0: self._fmt(self.y_max), height - 1: self._fmt(0.0)}
        if height >= 5:
            labels.setdefault(height // 2, self._fmt(self.y_max * (height - height // 2 - 0.5) / height))

        text = Text(no_wrap=True, overflow="crop")
        for row in range(height):
            if row:
                text.append("\n")
            text.append(labels.get(row, "").rjust(gutter - 1) + "│", axis)
            line = "".join(col[row] for col in columns)
            if row == ref_row:
                self._append_with_reference(text, line, bar, ref_style)
            else:
                text.append(line, bar)
        return text

    @staticmethod
    def _append_with_reference(text: Text, line: str, bar: Style, ref_style: Style) -> None:
        # The reference shows through wherever no bar covers its row.
        run, run_is_ref = "", False
        for ch in line:
            is_ref = ch == " "
            if is_ref != run_is_ref and run:
                text.append(run, ref_style if run_is_ref else bar)
                run = ""
            run_is_ref = is_ref
            run += "╌" if is_ref else ch
        if run:
            text.append(run, ref_style if run_is_ref else bar)


class PositionBars(Widget):
    """Per-position acceptance (position 1..K) as vertical bars on a fixed 0..1 axis,
    position numbers on the bottom row."""

    COMPONENT_CLASSES = {"positionbars--bar", "positionbars--axis"}

    DEFAULT_CSS = """
    PositionBars { height: 1fr; width: 17; }
    PositionBars > .positionbars--bar { color: $chart-line; }
    PositionBars > .positionbars--axis { color: $chart-axis; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rates: list[float] = []

    def set_rates(self, rates: Sequence[float]) -> None:
        rates = list(rates)
        if rates != self.rates:
            self.rates = rates
            self.refresh()

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        text = Text(no_wrap=True, overflow="crop")
        if height < 2 or width < 2:
            return text
        bar_style = self.get_component_rich_style("positionbars--bar")
        axis = self.get_component_rich_style("positionbars--axis")
        if not self.rates:
            text.append("no drafts yet", axis)
            return text
        bar_w = 2 if len(self.rates) * 3 <= width else 1
        shown = self.rates[: max(width // (bar_w + 1), 1)]
        columns = [_column_cells(r, 1.0, height - 1) for r in shown]
        for row in range(height - 1):
            line = " ".join(col[row] * bar_w for col in columns)
            text.append(line, bar_style)
            text.append("\n")
        labels = " ".join(
            str(i + 1).rjust(bar_w)[-bar_w:] for i in range(len(shown))
        )
        text.append(labels, axis)
        return text
