"""The dashboard's panels. Each owns its border title and subtitle and renders from the
reducer's DashState alone (`show(state)`): what differs between sources is a capability
the state holds (where telemetry comes from, what the source takes), never its kind."""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Container

from specdash.tui.reducer import DashState
from specdash.tui.widgets.plots import Plot, Series, nice_ceiling
from specdash.tui.widgets.generation import GenerationView
from specdash.tui.widgets.system import CpuView, NumaView, human_bytes

def _speed_axis_top(shown: list[float]) -> float:
    return nice_ceiling(max(shown, default=1.0) * 1.05)


def _k_axis_top(shown: list[float]) -> float:
    # At least 0..8, in steps of 4: K=4 sits mid-height and a change of one shows.
    return float(-(-max(shown + [8.0]) // 4) * 4)


SECONDS = "{:g}s"  # the time charts' x axis: seconds of decode time

# Why the CPU and memory panels stay empty, by where the source's telemetry comes from
# (Source.telemetry, declared from the start: a server down from the start sends no
# event), and whether the CPU panel says it for both (taking the memory panel's place).
# "local": this machine is sampled, and "sampling…" shows until the first sample.
NO_TELEMETRY = {
    # Only servers send none: counters, never their machine's load. Said once, with what
    # the operator can do instead.
    "none": ("No CPU or memory telemetry: a remote server does not send it. For per-core "
             "load and NUMA memory, run specdash on the server's host.", True),
    # A recording may hold the machine's telemetry further on: each panel waits.
    "recorded": ("no telemetry in this recording", False),
}


def no_telemetry(state: DashState) -> tuple[str, bool]:
    """Why the CPU and memory panels have nothing to show (or ""), and whether the CPU
    panel says it alone."""
    return NO_TELEMETRY.get(state.telemetry_from, ("", False)) if state.telemetry is None else ("", False)


class Panel(Container):
    """A bordered panel; titles are set only when they change (no repaint otherwise)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(classes="panel", **kwargs)  # type: ignore[arg-type]
        self._titles: tuple[str, str] | None = None

    def titles(self, title: str, subtitle: str) -> None:
        if self._titles != (title, subtitle):
            self._titles = (title, subtitle)
            self.border_title, self.border_subtitle = title, subtitle

    def show(self, state: DashState) -> None:
        raise NotImplementedError


class GenerationPanel(Panel):
    def compose(self) -> ComposeResult:
        yield GenerationView(id="gen-view")

    def on_mount(self) -> None:
        self.view = self.query_one(GenerationView)
        self._prompt = -1  # the state's prompt_serial last shown
        self._shown = 0  # pieces of the current prompt already in the view
        self._note: tuple[str, str] | None = None

    def show_text(self, state: DashState) -> None:
        """Stream what is new: called on every drain, so text never waits for a redraw."""
        if state.prompt_serial != self._prompt or len(state.pieces) < self._shown:
            self._prompt, self._shown = state.prompt_serial, 0
            self.view.clear()
        if len(state.pieces) > self._shown:
            new = state.pieces[self._shown:]
            self.view.append([p for p, _ in new], [d for _, d in new])
            self._shown = len(state.pieces)
        self._show_note(state)

    def _show_note(self, state: DashState) -> None:
        if state.state == "loading":
            note = (state.message if state.fraction is None else f"{state.message}  {state.fraction:.0%}", "note")
        elif state.state == "error":
            # Only an engine reports an error (live, or in a recording of one): a server
            # goes down, a replay ends.
            note = (f"Engine stopped: {state.message}\nPress r to restart, or n to start with a new prompt.", "error")
        elif state.state == "down":
            note = (f"Server down: {state.message}", "error")
        elif state.state == "idle":
            note = (state.message or "Done. Press n for a new prompt.", "note")
        else:
            note = ("", "note")
        if note != self._note:
            self._note = note
            self.view.show_note(*note)

    def show(self, state: DashState) -> None:
        self.show_text(state)
        step = state.stats.last_step
        legend = "[$draft-token]■[/] draft accepted  [$target-token]■[/] target"
        settings = state.stats.settings
        if settings is not None and settings.drafter == "mtp":  # the target's own head drafts
            legend = "[$draft-token]■[/] MTP head accepted  [$target-token]■[/] target"
        if any(kind == "xvocab" for _, kind in state.pieces[-200:]):  # only once translated drafts show
            legend = "[$draft-token]■[/] draft accepted  [$translated-token]■[/] translated  [$target-token]■[/] target"
        self.titles(
            f"Generation · {escape(state.prompt_title)}" if state.prompt_title else "Generation",
            f"{legend}  ·  content: {step.content}" if step and step.content else legend,
        )


def _points(xs: list[float], ys: list[float | None]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
    return tuple(x for x, _ in pairs), tuple(y for _, y in pairs)


def _ticks(lo: float, hi: float) -> list[float]:
    return [lo, (lo + hi) / 2, hi]


class AcceptancePanel(Panel):
    DEFAULT_CSS = """
    AcceptancePanel { layout: horizontal; }
    AcceptancePanel #pos-plot { width: 14; }
    Screen.-wide.-tall AcceptancePanel #pos-plot { width: 40; }
    """

    def compose(self) -> ComposeResult:
        yield Plot(id="acc-chart", y_format="{:.1f}", x_format=SECONDS)
        yield Plot(id="pos-plot", y_format="{:.1f}")

    def show(self, state: DashState) -> None:
        recent = state.stats.recent_counters()
        line = state.stats.timeline(state.window)
        xs, ys = _points(line.xs, line.acceptance)
        self.query_one("#acc-chart", Plot).show(
            [Series(xs, ys, "chart-line")], x_limits=(line.x_min, line.x_max), y_limits=(0.0, 1.0),
            y_ticks=[0.0, 0.5, 1.0], markers=line.markers)
        rates = recent.per_pos_rate
        positions = tuple(float(i + 1) for i in range(len(rates)))
        self.query_one("#pos-plot", Plot).show(
            [Series(positions, tuple(rates), "chart-line", kind="bars")] if rates else [],
            x_limits=(0.4, max(len(rates), 1) + 0.6), y_limits=(0.0, 1.0), y_ticks=[0.0, 0.5, 1.0],
            x_ticks=[float(p) for p in range(1, len(rates) + 1, max(1, (len(rates) + 5) // 6))])
        acc = recent.acceptance_rate
        earlier = state.stats.run.acceptance_rate
        if acc is not None:
            title = f"Acceptance {acc:.0%} · mean len {recent.mean_accepted_length:.2f}"
        elif earlier is not None:  # adaptive K at 0 for a while: "no drafts yet" would be untrue
            title = f"Acceptance · none lately ({earlier:.0%} this prompt)"
        else:
            title = "Acceptance · no drafts yet"
        self.titles(
            title,
            f"last {len(state.stats.recent)} {'polls' if state.polled else 'steps'} │ per position",
        )


class ThroughputPanel(Panel):
    def compose(self) -> ComposeResult:
        yield Plot(id="tps-chart", y_format="{:.0f}", x_format=SECONDS)

    def show(self, state: DashState) -> None:
        st = state.stats
        line = st.timeline(state.window)
        xs, ys = _points(line.xs, line.tokens_per_s)
        plain = st.plain_tokens_per_s
        top = _speed_axis_top(list(ys) + ([plain] if plain else []))
        # The plain reference first, the run's own line last: drawn on top of it, so the
        # live speed stays visible where it runs at plain speed.
        series = []
        if plain is not None:
            series.append(Series((line.x_min, line.x_max), (plain, plain), "chart-reference"))
        series.append(Series(xs, ys, "chart-line"))
        self.query_one(Plot).show(series, x_limits=(line.x_min, line.x_max), y_limits=(0.0, top),
                                  y_ticks=_ticks(0.0, top), markers=line.markers)
        tps = st.tokens_per_s
        title = f"tok/s {tps:.1f}" if tps is not None else "tok/s –"
        if tps is not None and st.idle:
            title += " (last request)"  # the same number as the status line's: live_stats' rule
        if state.polled:
            pass  # a server's counters have no K=0 steps to measure plain decoding by
        elif plain is None:
            title += " · plain: measuring"
        else:
            title += f" · plain {plain:.1f}"
            if tps is not None:
                title += f" · {tps / plain:.2f}x"
        self.titles(title, "decode only · [$chart-reference]─[/] plain")


class KPanel(Panel):
    def compose(self) -> ComposeResult:
        yield Plot(id="k-chart", y_format="{:.0f}", x_format=SECONDS)

    def show(self, state: DashState) -> None:
        line = state.stats.timeline(state.window)
        top = _k_axis_top(line.k)
        self.query_one(Plot).show([Series(tuple(line.xs), tuple(line.k), "chart-line", kind="step")],
                                  x_limits=(line.x_min, line.x_max), y_limits=(0.0, top),
                                  y_ticks=_ticks(0.0, top), markers=line.markers)
        settings, step = state.settings, state.stats.last_step
        if step is not None and step.decision:
            note = escape(step.decision)
        elif settings is not None and settings.adaptive:
            note = "adaptive"
        else:
            note = f"last step: {escape(step.drafter)}" if step else ""
        k_now = state.k_in_force()
        shown = "?" if k_now is None else str(k_now)
        label = f"K {shown} (adaptive)" if settings is not None and settings.adaptive and step is not None else f"K {shown}"
        if settings is None:
            self.titles("K", note)
            return
        # The joint cut acts only where a draft model drafts (draft_path: one is loaded).
        cut = f" · cut {settings.draft_p_joint:g}" if settings.draft_p_joint and settings.draft_path else ""
        self.titles(f"{label} · {escape(settings.drafter)}{cut}", note)


class CpuPanel(Panel):
    def compose(self) -> ComposeResult:
        yield CpuView(id="cpu-view")

    def on_mount(self) -> None:
        self.view = self.query_one(CpuView)  # kept: no query on a panel being torn down

    def show(self, state: DashState) -> None:
        tel = state.telemetry
        why, alone = no_telemetry(state)
        self.set_class(alone, "-alone")  # NumaPanel hides; app.tcss widens this one
        if tel is None:
            self.titles("CPU · memory" if self.has_class("-alone") else "CPU", "")
            if why:
                self.view.show_empty(why)
            return
        loads = tel.core_loads
        self.view.update_loads(loads)
        mean = sum(loads) / len(loads) if loads else 0.0
        shares = f"proc {tel.process.cpu_percent_of_core:.0f}%" if tel.process else ""
        if tel.dashboard_cpu is not None:
            shares += f" · dash {tel.dashboard_cpu:.1f}%"
        self.titles(f"CPU · {len(loads)} cores · {mean:.0f}%", shares)


class NumaPanel(Panel):
    def compose(self) -> ComposeResult:
        yield NumaView(id="numa-view")

    def on_mount(self) -> None:
        self.view = self.query_one(NumaView)

    def show(self, state: DashState) -> None:
        tel = state.telemetry
        why, alone = no_telemetry(state)
        self.display = not alone  # the CPU panel says it for both
        if tel is None:
            self.titles("Memory", "")
            if why:
                self.view.show_empty(why)
            return
        nodes = tel.numa_nodes
        self.view.update_nodes(nodes)
        if nodes and nodes[0].source.startswith("proc"):
            title = "Memory · no NUMA info"
        else:
            title = f"Memory · {len(nodes)} NUMA node{'s' if len(nodes) != 1 else ''}"
        self.titles(title, f"RSS {human_bytes(tel.process.rss_bytes)}" if tel.process else "")
