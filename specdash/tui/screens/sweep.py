"""`k`: the K sweep view. Plots tok/s and acceptance against K as the runs arrive (a
point per K, error bars across rounds, plain decoding as the reference line), marks the
best K, and offers apply (SetK) and save (TOML). Esc cancels cleanly: the app sends the
sweep's restore commands and the engine goes back to the settings it had. `t` asks for
temperatures to sweep at: then each temperature is its own series (colour, marker and a
legend entry), and whatif's predicted points, greedy by nature, sit by the T=0 one.

The screen only renders a specdash.tuning.sweep.Sweep and posts its keys as messages (Leave,
Apply, Save); the app feeds the sweep events and sends the commands it returns.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table
from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import ProgressBar, Static

from specdash.tuning.sweep import Point, Sweep
from specdash.tui.widgets.footer import KeyFooter
from specdash.tui.widgets.plots import LegendLocation, Plot, Series, nice_ceiling

# One (colour, marker) per temperature, in the order swept: told apart by shape as well,
# so a monochrome terminal or a colour-blind reader still can. No block characters: the
# lines are drawn in quadrant blocks, and a ■ among them is lost. Beyond six, they repeat.
STYLES = (("chart-line", "●"), ("success", "◆"), ("warning", "▲"), ("accent", "✚"), ("error", "○"),
          ("secondary", "×"))


def style_of(sweep: Sweep, temperature: float) -> tuple[str, str]:
    return STYLES[sweep.temps.index(temperature) % len(STYLES)]


class SweepScreen(Screen[None]):
    DEFAULT_CSS = """
    SweepScreen { layout: vertical; }
    SweepScreen #sweep-head { height: auto; padding: 0 1; background: $panel; }
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
        Binding("t", "temperatures", "temps"),
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
        multi = len(sw.temps) > 1
        state = "cancelled" if sw.cancelled else "done" if sw.finished else f"run {min(sw.done + 1, sw.total)}/{sw.total}"
        at = f"T={', '.join(f'{t:g}' for t in sw.temps)}"
        pred = sw.predicted_t0
        head = Text.from_markup(
            f"[b]K sweep[/b] · {escape(sw.before.drafter)} on {escape(sw.before.target)} · {len(sw.ks)} Ks × {at} × {sw.rounds} "
            f"rounds, {sw.max_tokens} tokens each · [b]{state}[/b]"
            + (f" · ● predicted{' at T=0' if multi else ''} ({sw.predicted_from})" if pred else ""))
        if sw.sampled:  # its own line: the head grows to two
            head.append("\n" + sw.sampled_note(), "dim")
        if sw.problems:  # a run the engine ran at other settings than planned: its row is the engine's
            head.append(f"\n{sw.problems[-1]}" + (f" (and {len(sw.problems) - 1} more)" if len(sw.problems) > 1 else ""),
                        "bold")
        self.query_one("#sweep-head", Static).update(head)
        self.query_one(ProgressBar).update(progress=sw.done)
        ks = [float(k) for k in sw.ks]
        x_limits = (min(ks) - 1, max(ks) + 1)
        best = sw.best
        home = f" at T={sw.home_temperature:g}" if multi else ""
        markers = [(float(best.k), f"best K={best.k}{home}")] if best and sw.done >= len(sw.ks) * len(sw.temps) else []
        predicted = sorted((float(k), v) for k, (v, _) in pred.items())
        highs = [p.spread[1] for p in sw.measured if p.spread is not None] + [v for _, v in predicted]
        top = nice_ceiling(max(highs + [1.0]) * 1.1) if highs else 1.0
        # Drawn in order, each over the last: lines and bars, the plain reference, then the
        # points on top (a line drawn later would hide another temperature's markers).
        series, tps_points = self._per_temperature(self._tps_series, multi)
        if sw.plain is not None:
            series.append(Series(x_limits, (sw.plain, sw.plain), "chart-reference", label=f"plain (K=0{home})"))
        if predicted:  # simulated, not measured: points in the reference colour, no line
            series.append(Series(tuple(x for x, _ in predicted), tuple(v for _, v in predicted), "chart-reference",
                                 label="predicted (T=0)" if multi else "predicted", kind="points"))
        series += tps_points
        acc_series, acc_points = self._per_temperature(self._acc_series, multi)
        acc_pred = sorted((float(k), a) for k, (_, a) in pred.items() if a is not None)
        if acc_pred:
            acc_series.append(Series(tuple(x for x, _ in acc_pred), tuple(a for _, a in acc_pred),
                                     "chart-reference", label="predicted", kind="points"))
        acc_series += acc_points
        # A legend where there is more than one temperature to tell apart, on the tok/s
        # chart only (the acceptance chart uses the same colours and markers), at the
        # bottom right: speeds sit in the upper part (the y axis is fitted to the fastest).
        self.query_one("#sweep-tps", Plot).show(series, x_limits=x_limits, y_limits=(0.0, top),
                                                y_ticks=[0.0, top / 2, top], x_ticks=ks, markers=markers,
                                                legend=multi, legend_at=LegendLocation.BOTTOMRIGHT)
        self.query_one("#sweep-acc", Plot).show(
            acc_series,
            x_limits=x_limits, y_limits=(0.0, 1.0), y_ticks=[0.0, 0.5, 1.0], x_ticks=ks, markers=markers)
        self.query_one("#sweep-table", Static).update(self._table())

    def _tps_series(self, t: float, points: list[Point], multi: bool) -> tuple[list[Series], list[Series]]:
        """One temperature's tok/s: (the median line and a bar from min to max across
        rounds at each K, its points marked: in the legend as T=...)."""
        tps = [(float(p.k), p.tokens_per_s, p.spread) for p in points
               if p.tokens_per_s is not None and p.spread is not None]
        if not tps:
            return [], []
        xs, ys = tuple(x for x, _, _ in tps), tuple(v for _, v, _ in tps)
        if not multi:
            return ([Series(xs, ys, "chart-line", label="median tok/s")]
                    + [Series((x, x), (lo, hi), "foreground") for x, _, (lo, hi) in tps]), []
        colour, marker = style_of(self.sweep, t)
        return ([Series(xs, ys, colour)] + [Series((x, x), (lo, hi), colour) for x, _, (lo, hi) in tps],
                [Series(xs, ys, colour, label=f"T={t:g}", kind="points", marker=marker)])

    def _per_temperature(self, make: Callable[[float, list[Point], bool], tuple[list[Series], list[Series]]],
                         multi: bool) -> tuple[list[Series], list[Series]]:
        """(lines, points) of every temperature's series, lines first so that no line
        drawn later hides another temperature's markers."""
        lines: list[Series] = []
        points: list[Series] = []
        for t in self.sweep.temps:
            more_lines, more_points = make(t, self.sweep.at(t), multi)
            lines += more_lines
            points += more_points
        return lines, points

    def _acc_series(self, t: float, points: list[Point], multi: bool) -> tuple[list[Series], list[Series]]:
        acc = [(float(p.k), p.acceptance) for p in points if p.acceptance is not None]
        if not acc:
            return [], []
        xs, ys = tuple(x for x, _ in acc), tuple(a for _, a in acc)
        if not multi:
            return [Series(xs, ys, "chart-line")], []
        colour, marker = style_of(self.sweep, t)
        return [Series(xs, ys, colour)], [Series(xs, ys, colour, label=f"T={t:g}", kind="points", marker=marker)]

    def _table(self) -> Table:
        sw = self.sweep
        multi = len(sw.temps) > 1
        pred = sw.predicted_t0
        table = Table(box=None, padding=(0, 2), header_style="bold")
        cols = ["K"] + (["T"] if multi else []) + ["", "tok/s", "min–max", "vs plain", "acceptance", "mean len", "runs"]
        for col in cols + (["predicted"] if pred else []):
            table.add_column(col, justify="right")
        plot = self.query_one("#sweep-tps", Plot)  # resolves the theme's colour names
        for t in sw.temps:
            best, plain = sw.best_at(t), sw.plain_at(t)  # per temperature: K=0 at the same T
            for p in sw.at(t):
                tps, spread = p.tokens_per_s or 0.0, p.spread or (0.0, 0.0)
                ratio = f"{tps / plain:.2f}x" if plain else "–"
                acc = f"{p.acceptance:.0%}" if p.acceptance is not None else "–"
                mean = f"{p.mean_accepted_length:.2f}" if p.mean_accepted_length is not None else "–"
                mark = "best" if best is not None and p.k == best.k and sw.finished else ""
                seen = p.engine_temperature  # the engine's word for it, "?" if its runs disagree
                colour, marker = style_of(sw, t)
                temp = [Text(f"{'?' if seen is None else format(seen, 'g')} ").append(marker, plot.colour(colour))
                        ] if multi else []
                row: list[str | Text] = [str(p.k), *temp, mark, f"{tps:.1f}", f"{spread[0]:.1f}–{spread[1]:.1f}",
                                         ratio, acc, mean, str(len(p.runs))]
                if pred:
                    row.append(f"{pred[p.k][0]:.1f}" if p.k in pred and t == 0 else "–")
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

    class Temperatures(Message):
        """t: choose the temperatures to sweep at (the sweep restarts at them)."""

    def action_leave(self) -> None:
        self.post_message(self.Leave())

    def action_apply(self) -> None:
        self.post_message(self.Apply())

    def action_save(self) -> None:
        self.post_message(self.Save())

    def action_temperatures(self) -> None:
        self.post_message(self.Temperatures())
