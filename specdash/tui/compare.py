"""`specdash replay A B`: two recordings on the same charts, with a legend.

Each recording is folded through the same reducer the live dashboard uses, so the
numbers are the ones each showed live. The charts overlay the whole of both runs on
decode time; the table sets their totals side by side with the ratio B/A, and the
settings line names what differed (K=8 vs K=24, lookup vs the draft model, ...). So
"K=8 vs K=24 on this prompt" is one screenshot (`s`).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.widgets import Static

from specdash.contract import events as E
from specdash.engine.stats import SpecCounters
from specdash.records.recording import Recording
from specdash.tui.plain_text import PlainNotify
from specdash.tui.reducer import DashState
from specdash.tui.themes import VARIABLE_DEFAULTS, load_themes
from specdash.tui.widgets.footer import KeyFooter
from specdash.tui.widgets.plots import LegendLocation, Plot, Series, nice_ceiling

COLOURS = ("chart-line", "chart-reference")  # A, B
LABELS = {"k": "K", "temperature": "T", "max_tokens": "max tokens"}
COMPARED = ("target", "drafter", "k", "adaptive", "temperature", "experts", "threads", "ctx", "max_tokens")


def fold(rec: Recording) -> DashState:
    """The reducer's state after every event of `rec`, on a window as long as the run."""
    steps_time = sum(ev.step_ms for ev in rec.events if isinstance(ev, E.StepEvent)) / 1e3
    state = DashState(window=max(steps_time + 10.0, 60.0))
    for ev in rec.events:
        state.feed(ev)
    return state


def differences(a: E.SettingsEvent | None, b: E.SettingsEvent | None) -> list[str]:
    if a is None or b is None:
        return []
    return [f"{LABELS.get(name, name)} {getattr(a, name)} vs {getattr(b, name)}" for name in COMPARED
            if getattr(a, name) != getattr(b, name)]


class CompareApp(PlainNotify):
    TITLE = "specdash · compare"
    CSS = """
    #compare-head { height: auto; padding: 0 1; background: $panel; }
    #compare-grid { grid-size: 2 2; height: 1fr; }
    .panel { border: round $primary 50%; border-title-color: $text; border-title-style: bold;
             border-subtitle-color: $text-muted; }
    #compare-table { height: auto; padding: 0 1; }
    """
    BINDINGS = [Binding("s", "screenshot", "shot"), Binding("q,escape", "quit", "quit")]

    def __init__(self, a: Recording, b: Recording, *, theme: str = "specdash-dark",
                 screenshots_dir: str = "~/specdash-screenshots"):
        super().__init__()
        self.recordings = (a, b)
        self.states = (fold(a), fold(b))
        self._theme_name = theme
        self.screenshots_dir = screenshots_dir
        for t in load_themes().values():
            self.register_theme(t)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def label(self, i: int) -> str:
        st = self.states[i].settings
        name = "AB"[i]
        if st is None:
            return f"{name}: {self.recordings[i].path.name}"
        k = "adaptive" if st.adaptive else f"K={st.k}"
        return f"{name}: {st.drafter} {k}"

    def compose(self) -> ComposeResult:
        yield Static(id="compare-head")
        with Grid(id="compare-grid"):
            for pid, title in (("cmp-tps", "tok/s over decode time"), ("cmp-acc", "acceptance over decode time"),
                               ("cmp-k", "K over decode time"), ("cmp-pos", "acceptance per draft position")):
                with Vertical(classes="panel", id=f"{pid}-panel") as panel:
                    panel.border_title = title
                    yield Plot(id=pid, y_format="{:.1f}" if pid in ("cmp-acc", "cmp-pos") else "{:.0f}")
        yield Static(id="compare-table")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.theme = self._theme_name
        a, b = self.recordings
        diff = differences(*(s.settings for s in self.states))
        head = Text.assemble(("A:", "bold"), f" {a.path.name}  vs  ", ("B:", "bold"), f" {b.path.name}")
        head.append("\n" + ("; ".join(diff) if diff else "same settings"), "dim")
        for rec, name in ((a, "A"), (b, "B")):
            if rec.problem:
                head.append(f"\n{name}: {rec.problem}", "bold")
        self.query_one("#compare-head", Static).update(head)
        self.call_after_refresh(self.draw)

    def draw(self) -> None:
        lines = [s.stats.timeline(s.window) for s in self.states]
        x_max = max(max(line.xs, default=1.0) for line in lines)
        x_limits = (0.0, x_max)

        def series(values: str) -> list[Series]:
            out = []
            for i, line in enumerate(lines):
                pairs = [(x, y) for x, y in zip(line.xs, getattr(line, values)) if y is not None]
                out.append(Series(tuple(x for x, _ in pairs), tuple(y for _, y in pairs), COLOURS[i],
                                  label=self.label(i), kind="step" if values == "k" else "line"))
            return out

        tps = series("tokens_per_s")
        top = nice_ceiling(max([max(s.ys, default=0.0) for s in tps] + [1.0]) * 1.05)
        self._plot("cmp-tps", tps, x_limits, (0.0, top), legend=True)
        self._plot("cmp-acc", series("acceptance"), x_limits, (0.0, 1.0))
        ks = series("k")
        self._plot("cmp-k", ks, x_limits, (0.0, max(8.0, *(max(s.ys, default=0.0) for s in ks)) + 1))
        rates = [s.stats.total.per_pos_rate for s in self.states]
        n = max(len(r) for r in rates) if any(rates) else 0
        bars = [Series(tuple(p + 1 + (i - 0.5) * 0.4 for p in range(len(r))), tuple(r), COLOURS[i], kind="bars",
                       label=self.label(i)) for i, r in enumerate(rates) if r]
        self.query_one("#cmp-pos", Plot).show(bars, x_limits=(0.4, max(n, 1) + 0.6), y_limits=(0.0, 1.0),
                                              y_ticks=[0.0, 0.5, 1.0], x_ticks=[float(p) for p in range(1, n + 1)],
                                              legend=True, bar_width=0.38)
        self.query_one("#compare-table", Static).update(self._table())

    def _plot(self, pid: str, series: list[Series], x_limits: tuple[float, float],
              y_limits: tuple[float, float], legend: bool = False) -> None:
        lo, hi = y_limits
        self.query_one(f"#{pid}", Plot).show(series, x_limits=x_limits, y_limits=y_limits,
                                            y_ticks=[lo, (lo + hi) / 2, hi], legend=legend,
                                            legend_at=LegendLocation.BOTTOMRIGHT)

    def _table(self) -> Table:
        table = Table(box=None, padding=(0, 2), header_style="bold")
        table.add_column("")
        for i in range(2):
            table.add_column(self.label(i), justify="right")
        table.add_column("B / A", justify="right")

        def row(name: str, values: list[float | None], fmt: str) -> None:
            a, b = values
            ratio = f"{b / a:.2f}x" if a and b is not None else "–"
            table.add_row(name, *[fmt.format(v) if v is not None else "–" for v in values], ratio)

        totals: list[SpecCounters] = [s.stats.total for s in self.states]
        summaries = [s.stats.last_summary for s in self.states]
        row("tok/s (decode, last prompt)", [s.tokens_per_s if s else None for s in summaries], "{:.1f}")
        row("acceptance", [t.acceptance_rate for t in totals], "{:.1%}")
        row("mean accepted length", [t.mean_accepted_length for t in totals], "{:.2f}")
        row("tokens per step", [t.tokens_per_step for t in totals], "{:.2f}")
        row("verify ms / step", [t.verify_ms / t.steps if t.steps else None for t in totals], "{:.1f}")
        row("draft ms / step", [t.draft_ms / t.steps if t.steps else None for t in totals], "{:.1f}")
        row("steps", [float(t.steps) for t in totals], "{:.0f}")
        return table

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        folder = Path(self.screenshots_dir).expanduser()
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            svg = Path(self.save_screenshot(filename=f"specdash-compare-{stamp}.svg", path=str(folder)))
            svg.with_suffix(".json").write_text(json.dumps({
                "svg": str(svg), "compare": [str(r.path) for r in self.recordings],
                "settings": [E.to_dict(s.settings) if s.settings else None for s in self.states],
            }, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            self.notify(f"cannot write a screenshot to {folder}: {exc.strerror or exc}", severity="error")
            return
        self.notify(str(svg), title="Screenshot saved", timeout=5)
