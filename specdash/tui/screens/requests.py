"""`l`: the requests table. One row per request the source finished (specdash/monitor/request_rows.py:
the engine's prompts, a server's drive-mode prompts), newest last: when (since the source
started), prompt tokens, generated, drafted, accepted, acceptance length, tok/s, drafter.
The highlighted row's acceptance-length histogram is drawn under it: bar j = the request's
drafting steps that accepted exactly j draft tokens (the server's own histogram when it
sends one, vLLM's; else built from the request's steps). Esc or `l` closes it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.screen import Screen
from textual.widgets import DataTable, Static

from specdash.monitor.request_rows import RequestLog, RequestRow
from specdash.tui.widgets.footer import KeyFooter

if TYPE_CHECKING:
    from specdash.tui.reducer import DashState

COLUMNS = (("when", "when"), ("request", "request"), ("prompt", "prompt"), ("generated", "gen"),
           ("drafted", "drafted"), ("accepted", "accept"), ("length", "acc len"), ("tps", "tok/s"),
           ("k", "K"), ("drafter", "drafter"))
TITLE_WIDTH = 12  # all ten columns fit 80 columns
TITLE_WIDEST = 40  # a wider terminal gives the request's name what it has beyond 80 columns, up to this


def title_cell(label: str, width: int) -> str:
    """A request's name in `width` cells. A long one keeps its number ("get_weat… #7"):
    rows of the same tool differ only there."""
    if len(label) <= width:
        return label
    head, sep, number = label.rpartition(" #")
    if sep and number.isdigit() and len(number) + 3 < width:
        return head[: width - len(number) - 3] + "…" + sep + number
    return label[: width - 1] + "…"


def when(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"+{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"+{m}:{s:02d}"


def cells(row: RequestRow, title_width: int = TITLE_WIDTH) -> list[Any]:
    def right(text: str) -> Text:
        return Text(text, justify="right")

    return [right(when(row.since_start)), Text(title_cell(row.label, title_width)), right(str(row.n_prompt)),
            right(str(row.n_generated)), right(str(row.drafted)), right(str(row.accepted)),
            right("–" if row.acceptance_length is None else f"{row.acceptance_length:.2f}"),
            right(f"{row.tokens_per_s:.1f}"), right("–" if row.mean_k is None else f"{row.mean_k:.1f}"),
            Text(row.drafter or "–")]


def histogram_title(row: RequestRow | None) -> str:
    if row is None:
        return "Acceptance length · no request selected"
    called = f" called {escape(', '.join(name + '()' for name in row.calls))}" if row.calls else ""
    if row.grammar_drafted:
        called += f", its grammar drafted {row.grammar_drafted} tokens ({row.grammar_accepted} accepted)"
    if not row.histogram:
        return f"Acceptance length · {escape(row.title)}{called}: nothing drafted"
    steps = sum(row.histogram)
    source = "the server's histogram" if row.histogram_from == "server" else "from its steps"
    batch = f", in batches of {row.mean_batch:.1f} requests" if row.mean_batch and row.mean_batch > 1 else ""
    return (f"Acceptance length · {escape(row.title)}{called}: {steps} drafting steps{batch}, bar j = steps that accepted j "
            f"draft tokens ({source})")


def bar_lines(hist: list[int], width: int) -> str:
    """One line per acceptance length j: `j │ ████ count`, bars scaled to the largest. A
    histogram with more rows than fit keeps its first and its last rows (the box clips)."""
    if not hist:
        return ""
    top = max(hist) or 1
    digits = len(str(len(hist) - 1))
    room = max(width - digits - len(str(top)) - 4, 1)
    lines = []
    for j, n in enumerate(hist):
        cells = n * room / top
        bar = "█" * int(cells) + ("▌" if cells - int(cells) >= 0.5 else "")
        lines.append(f"{j:>{digits}} │ [$chart-line]{bar}[/] {n}")
    return "\n".join(lines)


class RequestsScreen(Screen[None]):
    DEFAULT_CSS = """
    RequestsScreen #requests { height: 1fr; }
    RequestsScreen #requests-note { height: auto; color: $text-muted; padding: 0 1; }
    RequestsScreen #histogram { height: 14; border: round $primary 50%; border-title-color: $text; padding: 0 1; }
    RequestsScreen.-short #histogram { height: 10; }
    """

    BINDINGS = [Binding("escape,l", "close", "close", id="requests.close")]

    def __init__(self, state: DashState) -> None:
        super().__init__()
        self._state = state  # until mounted; then the app's, which a fleet swaps per server
        self._shown = 0  # rows of the log already in the table
        self._log: RequestLog | None = None

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="requests", cursor_type="row", zebra_stripes=True)
        self.table = table
        yield table
        self.note = Static(id="requests-note", markup=False)  # client titles: text
        yield self.note
        with Container(id="histogram"):
            self.bars = Static(id="histogram-bars")
            yield self.bars
        yield KeyFooter()

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.table.add_column(label, key=key)
        self.set_class(self.app.size.height < 30, "-short")
        self.refresh_rows()
        self.set_interval(0.5, self.refresh_rows)
        self.table.focus()

    @property
    def state(self) -> DashState:
        return getattr(self.app, "state", self._state) if self.is_attached else self._state

    def refresh_rows(self) -> None:
        log = self.state.requests
        if log is not self._log:  # a new state (a rewind, another server): start over
            self._log, self._shown = log, 0
            self.table.clear()
        rows = list(log.rows)
        if len(rows) < self._shown:  # the oldest rows left the log
            self.table.clear()
            self._shown = 0
        at_end = self.table.cursor_row >= self._shown - 1
        width = min(TITLE_WIDTH + max(self.app.size.width - 80, 0), TITLE_WIDEST)
        for i, row in enumerate(rows[self._shown:], self._shown):
            self.table.add_row(*cells(row, width), key=str(i))
        added = len(rows) > self._shown
        self._shown = len(rows)
        if added and at_end:
            self.table.move_cursor(row=self._shown - 1)  # follow the newest, unless one was picked
        note = (f"{len(rows)} request{'s' if len(rows) != 1 else ''} · ↑↓ select · Esc close"
                if rows else "No request has finished yet: each prompt the source completes is a row "
                             "(in drive mode, n sends one).")
        queue = self.state.queue
        if queue is not None:  # a server's: what runs and what waits, in order
            waiting = ", ".join(queue.waiting) if queue.waiting else "none"
            note = f"running: {', '.join(queue.running) or 'none'} · waiting: {waiting}\n{note}"
        self.note.update(note)
        self.show_histogram()

    @property
    def selected(self) -> RequestRow | None:
        rows = list(self.state.requests.rows)
        i = self.table.cursor_row
        return rows[i] if rows and 0 <= i < len(rows) else None

    def show_histogram(self) -> None:
        row = self.selected
        box = self.query_one("#histogram")
        box.border_title = histogram_title(row)
        width = max(self.size.width - 16, 10)
        text = bar_lines(row.histogram if row is not None else [], width)
        self.bar_text = text  # what is drawn, as markup (tests read it)
        self.bars.update(text)

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.show_histogram()

    def action_close(self) -> None:
        self.dismiss()
