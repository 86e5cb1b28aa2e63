"""The fleet: one row per attached server, rendered only from ServerEvents.

Feed it with `update_server(ev)` (on the UI thread; changes are drawn together, at most
once a second). Sort with `s` (next column) and `r` (reverse), or by clicking a column
header (again to reverse). Enter on a row posts `FleetScreen.Open(url)`; the app opens
that server's full dashboard.

The table fits the terminal's width (`fit_columns`): a server is shown by its host:port,
its status comes right after it, and as the width shrinks the columns of least use go
first (backend, uptime, prompt tok/s, ...), so a dead server's "down · never seen · why"
stays in view at 80 columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.cache import LRUCache
from textual.coordinate import Coordinate
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Static
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets._data_table import ColumnKey, RowKey, SegmentLines

from specdash.contract.events import ServerEvent
from specdash.monitor.health import SEVERITY, VERDICT_OF, VERDICTS, is_alarm
from specdash.tui.widgets.footer import KeyFooter


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def busy_queued(ev: ServerEvent) -> str:
    if ev.requests_running is None and ev.requests_waiting is None:
        return "–"
    run = "–" if ev.requests_running is None else str(ev.requests_running)
    wait = "–" if ev.requests_waiting is None else str(ev.requests_waiting)
    return f"{run}/{wait}"


def host_port(url: str) -> str:
    """What the server column shows: `host:port` (and a path, if any), not the scheme or
    any user:password@ (the full URL stays the row's key)."""
    parts = urlsplit(url)
    where = parts.netloc.rpartition("@")[2] or url
    path = parts.path.rstrip("/")
    return where + path


def status_text(ev: ServerEvent, wall: float | None = None) -> str:
    """'up', 'starting · why', or 'down · last seen 12s ago · error'. The error is its
    first clause without the leading "URL: " (the row says which server; the advice
    after a ";" is in the server's own panels, Enter)."""
    wall = time.time() if wall is None else wall
    if ev.state == "up":
        return "up" if not ev.resets else f"up · {ev.resets} reset{'s' if ev.resets > 1 else ''}"
    seen = "never seen" if ev.last_seen is None else f"last seen {fmt_duration(max(0.0, wall - ev.last_seen))} ago"
    parts = [ev.state, seen] if ev.state == "down" else [ev.state]
    if ev.error:
        error = ev.error.removeprefix(ev.url.rstrip("/")).removeprefix(": ")  # "/metrics: HTTP 404" stays
        parts.append(error.partition("; ")[0])
    return " · ".join(parts)


class ServerCell(Text):
    """The server column's cell: host:port on screen, the row's URL kept for sorting."""

    def __init__(self, url: str) -> None:
        super().__init__(host_port(url))
        self.url = url


def clip(text: str, width: int) -> str:
    return text if cell_len(text) <= width else text[: max(width - 1, 0)] + "…"


def _same(a: str | Text, b: str | Text) -> bool:
    """Would the two cells look the same (text, style, alignment)?"""
    if isinstance(a, Text) and isinstance(b, Text):
        return (a.plain, str(a.style), a.justify) == (b.plain, str(b.style), b.justify)
    return a == b


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    render: Callable[[ServerEvent], str]
    sort: Callable[[ServerEvent], Any]
    numeric: bool = True
    # A column whose words are known in advance is as wide as the widest from the start:
    # DataTable does not widen a column when a cell changes, it cuts the text.
    width: int = 0


def _n(value: float | int | None) -> tuple[int, float]:
    """Sort key: unknown values last in ascending order."""
    return (1, 0.0) if value is None else (0, float(value))


# Ascending by health: the most serious alarm first, healthy after the alarms.
_HEALTH_RANK = {VERDICT_OF[name]: i for i, name in enumerate(SEVERITY)} | {"healthy": len(SEVERITY)}


def health_sort(ev: ServerEvent) -> tuple[int, float]:
    return _n(_HEALTH_RANK.get(ev.health))


COLUMNS: tuple[Column, ...] = (
    Column("server", "server", lambda e: host_port(e.url), lambda e: (0, e.url), numeric=False),
    Column("status", "status", status_text, lambda e: (0, {"up": 0, "starting": 1}.get(e.state, 2), e.url), numeric=False),
    Column("model", "model", lambda e: e.model or "–", lambda e: (0 if e.model else 1, e.model), numeric=False),
    Column("backend", "backend", lambda e: e.backend or "–", lambda e: (0 if e.backend else 1, e.backend), numeric=False),
    Column("busy", "busy/queued", busy_queued,
           lambda e: _n(None if e.requests_running is None else e.requests_running + (e.requests_waiting or 0) / 1000)),
    Column("gen", "gen tok/s", lambda e: _num(e.generation_tokens_per_s, ".1f"), lambda e: _n(e.generation_tokens_per_s)),
    Column("prompt", "prompt tok/s", lambda e: _num(e.prompt_tokens_per_s, ".1f"), lambda e: _n(e.prompt_tokens_per_s)),
    Column("acceptance", "acceptance", lambda e: _num(e.acceptance_rate, ".0%"), lambda e: _n(e.acceptance_rate)),
    Column("health", "health", lambda e: e.health if e.health and e.health != "unknown" else "–", health_sort,
           numeric=False, width=max(map(len, VERDICTS))),
    Column("mean_len", "mean len", lambda e: _num(e.mean_accepted_length, ".2f"), lambda e: _n(e.mean_accepted_length)),
    Column("per_step", "tok/step", lambda e: _num(e.tokens_per_step, ".2f"), lambda e: _n(e.tokens_per_step)),
    Column("uptime", "uptime", lambda e: fmt_duration(e.uptime_s), lambda e: _n(e.uptime_s)),
    Column("errors", "errors", lambda e: str(e.errors), lambda e: _n(e.errors)),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
_BY_KEY = {c.key: c for c in COLUMNS}

# Which columns stay as the table narrows, most needed first: the server and its status
# always; then what says how it serves; the rest only where there is room.
KEEP_ORDER = ("server", "status", "gen", "acceptance", "health", "busy", "model", "errors", "mean_len", "per_step",
              "prompt", "uptime", "backend")
PADDING = 2  # DataTable's cell padding: one column each side
STATUS_MIN = 24  # the status column is never cut below this ("down · last seen 1m05s…")
# ...nor let grow beyond this: one server's long error must not push every other column
# off the screen (the whole text is in its own panels, Enter, and `attach --once`).
STATUS_MAX = 64


def fit_columns(widths: dict[str, int], width: int) -> tuple[tuple[str, ...], int]:
    """The columns to show in `width` cells (in COLUMNS order) and the widest status
    text to write, given each column's natural width (its widest cell or label).

    The server and the status always show. The status takes its natural width up to
    STATUS_MAX, cut to leave room for gen tok/s and acceptance where it must (never
    below STATUS_MIN);
    then the columns join in KEEP_ORDER while they fit."""
    server = widths["server"] + PADDING
    top_two = sum(widths[k] + PADDING for k in ("gen", "acceptance"))
    status = min(widths["status"], STATUS_MAX, max(STATUS_MIN, width - server - top_two - PADDING))
    used = server + status + PADDING
    shown = {"server", "status"}
    for key in KEEP_ORDER[2:]:
        need = widths[key] + PADDING
        if used + need <= width:
            shown.add(key)
            used += need
    return tuple(k for k in COLUMN_KEYS if k in shown), status


class FleetTable(DataTable[Any]):
    """DataTable whose body rows are drawn from caches keyed by what they show, not by the
    table's update count.

    DataTable keys every row's and cell's drawing by its update count, which any change
    raises: one row's new figures, or a sort, laid out every visible cell again through
    rich's general layout (padding, wrapping, cropping), 48 rows x 13 cells at 200x50. Here:
    - a cell's text, cut to its column, aligned and padded, is cached by its text, style and
      width (`_bodies`);
    - a row's drawing, styled for its stripe, the cursor and the hover, is cached by the
      row's own version (raised when one of its cells changes), not its place (`_lines`);
      where it sits now is added as each draw asks for it (the row and column a click
      reports).
    So a sort reorders drawn rows, and an update draws again only the rows that changed.
    Anything else (the header, row labels, fixed columns, a cursor other than rows, rows
    of several lines) takes DataTable's own path."""

    # Sized for what is drawn again, not for every figure seen: the cells and rows of 100
    # servers on both stripes (48 rows show at 200x50). An uptime changes every second, so
    # a larger cache only holds more of them (benchmarks/fleet_scale.py's memory check).
    BODY_CACHE = 2048  # cells
    LINE_CACHE = 512  # rows

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before DataTable's own: it clears the caches as it starts.
        self._bodies: LRUCache[tuple[Any, ...], list[Segment]] = LRUCache(self.BODY_CACHE)
        self._lines: LRUCache[tuple[Any, ...], tuple[list[list[Segment]], Style]] = LRUCache(self.LINE_CACHE)
        self._versions: dict[RowKey, int] = {}
        self._metas: dict[tuple[int, int], Style] = {}  # what a click on (row, column) reports
        self._styled: LRUCache[tuple[Any, ...], list[Segment]] = LRUCache(self.BODY_CACHE)
        self._row_styles: dict[tuple[Any, ...], Style] = {}
        self._base: Style | None = None  # the widget's style, read once per drawing pass
        super().__init__(*args, **kwargs)

    # --- what invalidates a row's drawing ---
    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: Any, *,
                    update_width: bool = False) -> None:
        key = RowKey(row_key) if isinstance(row_key, str) else row_key
        self._versions[key] = self._versions.get(key, 0) + 1
        super().update_cell(row_key, column_key, value, update_width=update_width)

    def add_row(self, *cells: Any, height: int | None = 1, key: str | None = None, label: Any = None) -> RowKey:
        row_key = super().add_row(*cells, height=height, key=key, label=label)
        # A key removed and added again is another row: never its old drawing.
        self._versions[row_key] = self._versions.get(row_key, 0) + 1
        return row_key

    def _clear_caches(self) -> None:
        super()._clear_caches()
        self._lines.clear()
        self._row_styles.clear()

    def notify_style_update(self) -> None:
        for cache in (self._lines, self._bodies, self._styled, self._row_styles):
            cache.clear()
        super().notify_style_update()

    # --- styles DataTable computes again for every line (each ~0.1 ms: the DOM walked) ---
    def render_lines(self, crop: Region) -> list[Strip]:
        self._base = self.rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._base = None

    def render_line(self, y: int) -> Strip:
        if self._base is None or self.fixed_rows:
            return super().render_line(y)
        scroll_x, scroll_y = self.scroll_offset
        if y >= (self.header_height if self.show_header else 0):
            y += scroll_y
        return self._render_line(y, scroll_x, scroll_x + self.size.width, self._base)

    def _get_row_style(self, row_index: int, base_style: Style) -> Style:
        kind = (-1 if row_index == -1 else -2 if row_index < self.fixed_rows
                else row_index % 2 if self.zebra_stripes else -3)
        key = (kind, base_style, self._pseudo_class_state)
        style = self._row_styles.get(key)
        if style is None:
            style = self._row_styles[key] = super()._get_row_style(row_index, base_style)
        return style

    # --- drawing ---
    def _render_line_in_row(self, row_key: RowKey, line_no: int, base_style: Style, cursor_location: Coordinate,
                            hover_location: Coordinate) -> tuple[SegmentLines, SegmentLines]:
        found = self._row_locations.get(row_key)
        row_index = found if found is not None else -1
        row = self.rows.get(row_key)
        if (row_index < self.fixed_rows or row is None or row.height != 1 or self.cursor_type != "row"
                or self.fixed_columns or (self._labelled_row_exists and self.show_row_labels)):
            return super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        cursor = self.show_cursor and cursor_location.row == row_index
        hover = self.show_cursor and self._show_hover_cursor and hover_location.row == row_index
        widths = tuple(column.get_render_width(self) for column in self.ordered_columns)
        key = (row_key, self._versions.get(row_key, 0), row_index % 2 if self.zebra_stripes else 0, cursor, hover,
               base_style, widths, self.size.width, self._pseudo_class_state)
        drawn = self._lines.get(key)
        if drawn is None:
            drawn = self._lines[key] = self._draw_row(row_index, base_style, widths, cursor, hover)
        cells, extend_style = drawn
        # Where the row sits now: every segment says its row and column (a click, a hover).
        scrollable = [[Segment(text, style + self._meta(row_index, i) if style else self._meta(row_index, i))
                       for text, style, _ in segments] for i, segments in enumerate(cells)]
        scrollable.append([Segment(" " * max(0, self.size.width - sum(widths) - self._row_label_column_width),
                                   extend_style + Style.from_meta({"row": row_index, "column": 0,
                                                                  "out_of_bounds": True}))])
        return [], scrollable

    def _meta(self, row_index: int, column_index: int) -> Style:
        meta = self._metas.get((row_index, column_index))
        if meta is None:
            meta = self._metas[(row_index, column_index)] = Style.from_meta({"row": row_index, "column": column_index})
        return meta

    def _draw_row(self, row_index: int, base_style: Style, widths: tuple[int, ...], cursor: bool,
                  hover: bool) -> tuple[list[list[Segment]], Style]:
        """A row's cells styled for its stripe, cursor and hover (DataTable's rules), and the
        style of the space after the last column; no meta (see _render_line_in_row)."""
        row_style = self._get_row_style(row_index, base_style)
        cells = [self._cell(row_index, column_index, row_style, width, cursor, hover)
                 for column_index, width in enumerate(widths)]
        extend, _ = self._get_styles_to_render_cell(False, False, False, hover, cursor, self.show_cursor,
                                                    self._show_hover_cursor, False, False)
        return cells, row_style + extend

    def _cell(self, row_index: int, column_index: int, row_style: Style, width: int, cursor: bool,
              hover: bool) -> list[Segment]:
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        cell = self._data.get(row_key, {}).get(column_key) if row_key is not None and column_key is not None else None
        component, post = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css")
        if not isinstance(cell, Text) or "\n" in cell.plain:
            # DataTable's own drawing of it (the meta added per draw replaces its own).
            return list(DataTable._render_cell(self, row_index, column_index, row_style, width, cursor, hover)[0])
        body_key = (cell.plain, cell.style, cell.justify, tuple(cell.spans), width, self.cell_padding)
        styled_key = (body_key, row_style, component, post)
        styled = self._styled.get(styled_key)
        if styled is None:
            body = self._bodies.get(body_key)
            if body is None:
                body = self._bodies[body_key] = self._body(cell, width)
            styled = self._styled[styled_key] = list(Segment.simplify(Segment.apply_style(body, row_style + component,
                                                                                          post)))
        return styled

    def _body(self, cell: Text, width: int) -> list[Segment]:
        """The cell's text cut to the column, aligned and padded, as DataTable lays it out."""
        pad = " " * self.cell_padding
        text = cell.copy()
        inner = max(width - 2 * self.cell_padding, 0)
        text.truncate(inner, overflow="ellipsis")
        text.align(cell.justify if cell.justify in ("left", "center", "right") else "left", inner)
        console = self.app.console
        # Text.render leaves out the Text's own style (rich applies it around the spans).
        body = Segment.apply_style(text.render(console), console.get_style(cell.style) if cell.style else None)
        return [Segment(pad), *body, Segment(pad)]


class FleetScreen(Screen[None]):
    DEFAULT_CSS = """
    FleetScreen DataTable { height: 1fr; }
    FleetScreen #fleet-hint { height: 1; color: $text-muted; padding: 0 1; }
    """

    FLUSH_S = 1.0  # row changes are applied together, at most this much later

    BINDINGS = [
        Binding("s", "cycle_sort", "Sort", id="fleet.sort"),
        Binding("r", "reverse_sort", "Reverse", id="fleet.reverse"),
    ]

    class Open(Message):
        """Enter on a row: open this server's full dashboard."""

        def __init__(self, url: str) -> None:
            super().__init__()
            self.url = url

    def __init__(self, *, sort_key: str = "server", reverse: bool = False, name: str | None = None,
                 id: str | None = None) -> None:
        super().__init__(name=name, id=id)
        if sort_key not in _BY_KEY:
            raise ValueError(f"sort_key {sort_key!r}: one of {', '.join(COLUMN_KEYS)}")
        self.sort_key = sort_key
        self.reverse = reverse
        self.servers: dict[str, ServerEvent] = {}
        self._shown: dict[str, list[str | Text]] = {}  # the cells as last put in the table
        self._order: list[str] = []
        self._dirty: set[str] = set()  # rows changed since the last flush
        self._flush_timer: Timer | None = None
        self._columns: tuple[str, ...] = ()  # the columns shown (fit_columns)
        self._status_width = 0  # status texts are cut to this width (a large number: not cut)

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = FleetTable(id="fleet", cursor_type="row", zebra_stripes=True)
        # Kept, not queried: the sources' rows still arrive while the app tears the screen
        # down, and a query then finds nothing.
        self._table = table
        yield table
        self._hint_view = Static(self._hint(), id="fleet-hint")
        yield self._hint_view
        yield KeyFooter()

    def on_mount(self) -> None:
        self._fit(force=True)
        self.table.focus()
        self.set_interval(1.0, self._refresh_ages)

    def on_resize(self) -> None:
        if self._columns:  # on_mount has built the table
            self._fit()

    def on_screen_resume(self) -> None:
        # Back from a server's panels: the terminal may have been resized meanwhile.
        self.on_resize()

    def _fit(self, force: bool = False) -> bool:
        """Choose the columns for the screen's width (fit_columns); when the choice
        changed, build the table again with them (the rows, the order and the cursor
        kept). True when it did."""
        widths = {c.key: max(cell_len(c.label), c.width) for c in COLUMNS}
        for ev in self.servers.values():
            for c in COLUMNS:
                widths[c.key] = max(widths[c.key], cell_len(c.render(ev)))
        # The screen, less room for a vertical scrollbar (when the rows need one).
        columns, status = fit_columns(widths, self.size.width - 2)
        # A status that fits whole is not cut, whatever its width: "last seen 9s" becoming
        # "10s" must not rebuild the table.
        status = status if status < widths["status"] else 10**6
        if not force and (columns, status) == (self._columns, self._status_width):
            return False
        table = self.table
        cursor = self._order[table.cursor_row] if 0 <= table.cursor_row < len(self._order) else None
        self._columns, self._status_width = columns, status
        table.clear(columns=True)
        self._shown.clear()
        for key in columns:
            table.add_column(_BY_KEY[key].label, key=key, width=_BY_KEY[key].width or None)
        for ev in list(self.servers.values()):
            self._put_row(ev)
        self._dirty.clear()
        self._sort()
        if cursor is not None and cursor in self._order:
            table.move_cursor(row=self._order.index(cursor))
        return True

    @property
    def table(self) -> DataTable[Any]:
        return self._table

    def _hint(self) -> str:
        label = _BY_KEY[self.sort_key].label
        return f"sorted by {label}{' (reversed)' if self.reverse else ''} · s: next column · r: reverse · Enter: open"

    # --- data ---

    def update_server(self, ev: ServerEvent) -> None:
        """One server's latest row. Call on the UI thread. A new server's row appears at
        once; changes to known rows are applied together by `flush`, at most FLUSH_S
        later: any change makes the table draw its visible lines again (FleetTable draws
        only the changed rows anew), and 8 servers polled each second at their own moments
        would have it do that 2-8 times a second (benchmarks/attach_overhead.py --mode
        fleet: that was most of its CPU)."""
        self.servers[ev.url] = ev
        self._dirty.add(ev.url)
        if not self.is_mounted:
            return
        if ev.url not in self.table.rows:
            self.flush()
        else:
            self._flush_soon()

    def _flush_soon(self) -> None:
        """`flush` at most FLUSH_S from now (once, however many rows change meanwhile)."""
        if self._flush_timer is None:
            self._flush_timer = self.set_timer(self.FLUSH_S, self.flush)

    def flush(self) -> None:
        """Put every changed row in the table now (only the cells whose text changed),
        and move rows only when the order changed."""
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None
        if self._fit():  # a new width of some cell changed what fits: all rows are new
            return
        dirty, self._dirty = self._dirty, set()
        for url in dirty:
            self._put_row(self.servers[url])
        if dirty:
            self._sort(force=False)

    def _cells(self, ev: ServerEvent) -> list[str | Text]:
        out: list[str | Text] = []
        for col in map(_BY_KEY.__getitem__, self._columns):
            text = col.render(ev)
            style = ""
            if col.key == "server":
                out.append(ServerCell(ev.url))
                continue
            if col.key == "status":
                text = clip(text, self._status_width)
                style = "bold red" if ev.state == "down" else "yellow" if ev.state != "up" else "green"
            elif col.key == "health" and is_alarm(ev.health):
                style = "bold red" if ev.health in ("stalled", "collapse") else "bold yellow"
            elif ev.state == "down":
                style = "dim"
            out.append(Text(text, style=style, justify="right" if col.numeric else "left"))
        return out

    def _put_row(self, ev: ServerEvent) -> None:
        table = self.table
        cells = self._cells(ev)
        shown = self._shown.get(ev.url)
        if ev.url in table.rows and shown is not None:
            for i, (key, value) in enumerate(zip(self._columns, cells)):
                if not _same(value, shown[i]):
                    table.update_cell(ev.url, key, value)
        else:
            table.add_row(*cells, key=ev.url)
        self._shown[ev.url] = cells

    def _refresh_ages(self) -> None:
        """A silent server's "last seen" grows each second: its row joins the next flush, so
        the table redraws once a second, not once for the rows and again for the ages (each
        redraw is one a key pressed then waits for)."""
        if "status" not in self._columns:
            return
        at = self._columns.index("status")
        for url, ev in self.servers.items():
            if ev.state != "up" and url in self.table.rows:
                shown = self._shown.get(url)
                if shown is not None and not _same(self._cells(ev)[at], shown[at]):
                    self._dirty.add(url)
        if self._dirty:
            self._flush_soon()

    # --- sorting ---

    def _sort(self, force: bool = True) -> None:
        """Rows in the chosen order; unknown values ("–") stay last either way."""
        col = _BY_KEY[self.sort_key]
        known: list[tuple[Any, str]] = []
        unknown: list[tuple[Any, str]] = []
        for url, ev in self.servers.items():
            key = col.sort(ev)
            (unknown if isinstance(key, tuple) and key and key[0] == 1 else known).append((key, url))
        known.sort(reverse=self.reverse)
        unknown.sort(key=lambda item: item[1])
        order = [url for _, url in known + unknown]
        if not force and order == self._order:
            return
        self._order = order
        rank = {url: i for i, url in enumerate(order)}
        self.table.sort("server", key=lambda cell: rank.get(getattr(cell, "url", str(cell)), len(rank)))
        self._hint_view.update(self._hint())

    def sort_by(self, key: str, reverse: bool | None = None) -> None:
        if key not in _BY_KEY:
            raise ValueError(f"sort key {key!r}: one of {', '.join(COLUMN_KEYS)}")
        self.sort_key = key
        if reverse is not None:
            self.reverse = reverse
        self._sort()

    def action_cycle_sort(self) -> None:
        """The next column shown (a hidden one is skipped)."""
        shown = self._columns or COLUMN_KEYS
        i = COLUMN_KEYS.index(self.sort_key)
        following = [k for k in COLUMN_KEYS[i + 1:] + COLUMN_KEYS[: i + 1] if k in shown]
        self.sort_by(following[0], reverse=False)

    def action_reverse_sort(self) -> None:
        self.sort_by(self.sort_key, reverse=not self.reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        key = str(event.column_key.value)
        if key == self.sort_key:
            self.sort_by(key, reverse=not self.reverse)
        else:
            self.sort_by(key, reverse=False)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Open(str(event.row_key.value)))

    @property
    def order(self) -> list[str]:
        """URLs in display order (for tests and the app)."""
        table = self.table
        return [str(table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value) for row in range(table.row_count)]
