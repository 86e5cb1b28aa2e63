"""`k`: the K sweep view. Plots tok/s and acceptance against K as the runs arrive (a
point per K, error bars across rounds, plain decoding as the reference line), marks the
best K, and offers apply (SetK) and save (TOML). Esc cancels cleanly: the app sends the
sweep's restore commands and the engine goes back to the settings it had.

The screen only renders a specdash.sweep.Sweep and posts its keys as messages (Leave,
Apply, Save); the app feeds the sweep events and sends the commands it returns.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import ProgressBar, Static

from specdash.sweep import Sweep
from specdash.tui.widgets.footer import KeyFooter
from specdash.tui.widgets.plots import Plot, Series, nice_ceiling


class SweepScreen(Screen[None]):
    DEFAULT_CSS = """
    SweepScreen { layout: vertical; }
    SweepScreen #sweep-head { height: 1; padding: 0 1; background: $panel; }
    SweepScreen ProgressBar { padding: 0 1; height: 1; }
    SweepScreen #sweep-plots { height: 1fr; }
    SweepScreen .panel { border: round $primary 50%; border-title-color: $text; border-title-style: bold;
                         border-subtitle-color: $text-muted; height: 1fr; width: 1fr; }
    SweepScreen #sweep-table { height: auto; max-height: 12; padding: 0 1; }
    """

    BINDINGS = [
        Binding("escape", "leave", "cancel / close"),
        Binding("a", "apply", "apply best K"),
        Binding("w", "save", "save TOML"),
        Binding("s", "app.screenshot", "shot"),
    ]

    def __init__(self, sweep: Sweep):
        super().__init__()
        self.sweep = sweep

    def compose(self) -> ComposeResult:
        yield Static(id="sweep-head")
        yield ProgressBar(total=self.sweep.total, show_eta=False, id="sweep-progress")
        with Horizontal(id="sweep-plots"):
            with Vertical(classes="panel", id="sweep-tps-panel"):
                yield Plot(id="sweep-tps", y_format="{:.0f}")
            with Vertical(classes="panel", id="sweep-acc-panel"):
                yield Plot(id="sweep-acc", y_format="{:.1f}")
        yield Static(id="sweep-table")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one("#sweep-tps-panel").border_title = "tok/s vs K"
        self.query_one("#sweep-acc-panel").border_title = "acceptance vs K"
        self.refresh_view()

    def refresh_view(self) -> None:
        sw = self.sweep
        points = sw.measured
        state = "cancelled" if sw.cancelled else "done" if sw.finished else f"run {min(sw.done + 1, sw.total)}/{sw.total}"
        self.query_one("#sweep-head", Static).update(Text.from_markup(
            f"[b]K sweep[/b] · {sw.before.drafter} on {sw.before.target} · {len(sw.ks)} Ks × {sw.rounds} rounds, "
            f"{sw.max_tokens} tokens each · [b]{state}[/b]"
            + (f" · ● predicted ({sw.predicted_from})" if sw.predicted else "")))
        self.query_one(ProgressBar).update(progress=sw.done)
        ks = [float(k) for k in sw.ks]
        x_limits = (min(ks) - 1, max(ks) + 1)
        best = sw.best
        markers = [(float(best.k), f"best K={best.k}")] if best and sw.done >= len(sw.ks) else []
        tps = [(float(p.k), p.tokens_per_s, p.spread) for p in points
               if p.tokens_per_s is not None and p.spread is not None]
        predicted = sorted((float(k), v) for k, (v, _) in sw.predicted.items() if k in sw.ks)
        highs = [hi for _, _, (_, hi) in tps] + [v for _, v in predicted]
        top = nice_ceiling(max(highs + [1.0]) * 1.1) if highs else 1.0
        series = []
        if predicted:  # simulated, not measured: points in the reference colour, no line
            series.append(Series(tuple(x for x, _ in predicted), tuple(v for _, v in predicted), "chart-reference",
                                 label="predicted", kind="points"))
        if tps:
            xs = tuple(x for x, _, _ in tps)
            series.append(Series(xs, tuple(v for _, v, _ in tps), "chart-line", label="median tok/s"))
            # the spread across rounds: a bar from min to max at each K
            series += [Series((x, x), (lo, hi), "foreground") for x, _, (lo, hi) in tps]
        if sw.plain is not None:
            series.append(Series(x_limits, (sw.plain, sw.plain), "chart-reference", label="plain (K=0)"))
        self.query_one("#sweep-tps", Plot).show(series, x_limits=x_limits, y_limits=(0.0, top),
                                                y_ticks=[0.0, top / 2, top], x_ticks=ks, markers=markers)
        acc = [(float(p.k), p.acceptance) for p in points if p.acceptance is not None]
        acc_pred = sorted((float(k), a) for k, (_, a) in sw.predicted.items() if a is not None and k in sw.ks)
        acc_series = [Series(tuple(x for x, _ in acc), tuple(a for _, a in acc), "chart-line")] if acc else []
        if acc_pred:
            acc_series.insert(0, Series(tuple(x for x, _ in acc_pred), tuple(a for _, a in acc_pred),
                                        "chart-reference", label="predicted", kind="points"))
        self.query_one("#sweep-acc", Plot).show(
            acc_series,
            x_limits=x_limits, y_limits=(0.0, 1.0), y_ticks=[0.0, 0.5, 1.0], x_ticks=ks, markers=markers)
        self.query_one("#sweep-table", Static).update(self._table())

    def _table(self) -> Table:
        sw = self.sweep
        table = Table(box=None, padding=(0, 2), header_style="bold")
        cols = ["K", "", "tok/s", "min–max", "vs plain", "acceptance", "mean len", "runs"]
        for col in cols + (["predicted"] if sw.predicted else []):
            table.add_column(col, justify="right")
        best = sw.best
        for p in sw.measured:
            tps, spread = p.tokens_per_s or 0.0, p.spread or (0.0, 0.0)
            ratio = f"{tps / sw.plain:.2f}x" if sw.plain else "–"
            acc = f"{p.acceptance:.0%}" if p.acceptance is not None else "–"
            mean = f"{p.mean_accepted_length:.2f}" if p.mean_accepted_length is not None else "–"
            mark = "best" if best is not None and p.k == best.k and sw.finished else ""
            row = [str(p.k), mark, f"{tps:.1f}", f"{spread[0]:.1f}–{spread[1]:.1f}", ratio, acc, mean, str(len(p.runs))]
            if sw.predicted:
                row.append(f"{sw.predicted[p.k][0]:.1f}" if p.k in sw.predicted else "–")
            table.add_row(*row)
        return table

    # The screen decides nothing: its keys become messages the app handles (it owns the
    # sweep and the source), as FleetScreen.Open does.
    class Leave(Message):
        """Esc: cancel a sweep in progress (settings restored) and close the view."""

    class Apply(Message):
        """a: send the best K."""

    class Save(Message):
        """w: write the settings with the best K to a TOML file."""

    def action_leave(self) -> None:
        self.post_message(self.Leave())

    def action_apply(self) -> None:
        self.post_message(self.Apply())

    def action_save(self) -> None:
        self.post_message(self.Save())
