"""The dashboard: renders what the engine and the machine report, sends the operator's
commands. It decides nothing about decoding.

Threads: the engine (EngineDriver.run) runs under one Textual thread worker, which
reports its errors (see _supervise_engine). It reports through EngineDriver.inbox plus
an EngineUpdate ping (replaceable, so pings never pile up); this app only ever talks
back through EngineDriver.send (the engine's command queue). Telemetry is sampled on
the UI thread on a timer that is re-armed after each poll finishes, so polls cannot
overlap.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Container, Grid, Horizontal
from textual.markup import escape
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerState

from specdash.engine import commands as C
from specdash.engine.settings import EngineSettings
from specdash.engine.stats import NoticeEvent, PrefillEvent, SettingsEvent, SpecCounters, StepEvent, Summary
from specdash.errors import SpecdashError
from specdash.telemetry import Hint, TelemetrySnapshot
from specdash.tui.engine_driver import (
    EngineDriver,
    Idle,
    Loading,
    PromptQueue,
    PromptStarted,
    Ready,
    SessionFactory,
    WorkItem,
)
from specdash.tui.live_stats import LiveStats
from specdash.tui.screens.ask import AskScreen
from specdash.tui.screens.draft_picker import DraftPicker, draft_choices
from specdash.tui.screens.help import HelpScreen
from specdash.tui.themes import VARIABLE_DEFAULTS, load_themes
from specdash.tui.widgets.charts import PositionBars, TimeChart, nice_ceiling
from specdash.tui.widgets.generation import GenerationView
from specdash.tui.widgets.system import CpuView, NumaView, human_bytes

TEMPERATURE_MAX = 5.0  # the engine's own limit (engine.py, SetSampling)
CHART_HISTORY = 400  # columns kept for the time charts: wider than any terminal


# + and - share one footer entry ("+ - K") to leave room for the rest at 80 columns.
_K_KEYS = Binding.Group("K", compact=True)


class EngineUpdate(Message):
    """The engine thread left something in the inbox."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, EngineUpdate)


@dataclass(slots=True)
class DashboardOptions:
    settings: EngineSettings
    prompt: str | None = None  # None: cycle the built-in workload
    workload: list[WorkItem] = field(default_factory=list)
    theme: str = "specdash-dark"
    refresh: float = 1.0
    screenshots_dir: str = "~/specdash-screenshots"
    config_path: Path | None = None  # where `w` offers to write


def _fmt_rate(v: float) -> str:
    return f"{v:.1f}"


def _fmt_int(v: float) -> str:
    return f"{v:.0f}"


def counters_dict(c: SpecCounters) -> dict[str, Any]:
    return {
        **dataclasses.asdict(c),
        "acceptance_rate": c.acceptance_rate,
        "mean_accepted_length": c.mean_accepted_length,
        "per_pos_rate": c.per_pos_rate,
    }


class SpecdashApp(App[int]):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses live elsewhere
    TITLE = "specdash"
    # The full layout (app.tcss: Screen.-wide.-tall) from this size up; compact below.
    WIDE_COLUMNS, TALL_ROWS = 120, 36
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_COLUMNS, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL_ROWS, "-tall")]

    BINDINGS = [
        Binding("plus,equals_sign", "k_up", "K up", key_display="+", id="k.up", group=_K_KEYS),
        Binding("minus", "k_down", "K down", key_display="-", id="k.down", group=_K_KEYS),
        Binding("d", "pick_draft", "draft", id="draft.pick"),
        Binding("t", "set_temperature", "temp", id="sampling.temperature"),
        Binding("space", "toggle_pause", "pause", key_display="spc", id="engine.pause"),
        Binding("n", "new_prompt", "prompt", id="prompt.new"),
        Binding("a", "toggle_adaptive", "adapt", id="k.adaptive"),
        Binding("e", "set_experts", "experts", id="target.experts"),
        Binding("s", "screenshot", "shot", id="app.screenshot"),
        # In the help screen and the palette; the footer has no room left at 80 columns.
        Binding("w", "write_config", "save", id="config.write", show=False),
        Binding("r", "restart", "restart", id="engine.restart"),
        Binding("question_mark", "help", "help", key_display="?", id="app.help"),
        Binding("q", "quit", "quit", id="app.quit"),
    ]

    # Longer descriptions for the help screen and the command palette.
    CONTROLS = {
        "k_up": ("+", "K up: draft one more token per step"),
        "k_down": ("-", "K down (K=0 is plain decoding)"),
        "pick_draft": ("d", "choose the draft source (model, prompt lookup, suffix, chain, none)"),
        "set_temperature": ("t", "set the sampling temperature (0 = greedy)"),
        "toggle_pause": ("space", "pause / resume generation"),
        "new_prompt": ("n", "type a new prompt (replaces the one running)"),
        "toggle_adaptive": ("a", "adaptive K on/off: the engine picks K (and K=0) from measured costs"),
        "set_experts": ("e", "MoE target: number of active experts (reloads the target)"),
        "screenshot": ("s", "save an SVG screenshot and a JSON file of settings and stats"),
        "write_config": ("w", "write the live settings to a TOML config (load it with --config)"),
        "restart": ("r", "restart the engine after an error"),
        "help": ("?", "this help"),
        "quit": ("q", "quit"),
    }
    # Controls that talk to the engine: unavailable while it loads or after it failed.
    ENGINE_CONTROLS = ("k_up", "k_down", "pick_draft", "set_temperature", "toggle_pause",
                       "toggle_adaptive", "set_experts")

    def __init__(
        self,
        options: DashboardOptions,
        *,
        session_factory: SessionFactory,
        sampler=None,
        cpu_meter: Callable[[], float | None] | None = None,
        hints: Callable[[], list[Hint]] | None = None,
        flush_interval: float = 0.25,
    ):
        """sampler (an object with sample() -> TelemetrySnapshot), cpu_meter and hints
        default to the real machine; tests inject fixed ones."""
        super().__init__()
        self.options = options
        self._session_factory = session_factory
        if sampler is None:
            from specdash.telemetry import TelemetrySampler

            sampler = TelemetrySampler()
        if cpu_meter is None:
            from specdash.tui.ui_cpu import DashboardCpuMeter

            cpu_meter = DashboardCpuMeter(lambda: self._engine.thread_id if self._engine else None).sample
        if hints is None:
            from specdash.telemetry import collect_hints

            hints = partial(collect_hints, threads=options.settings.threads)
        self._sampler = sampler
        self._cpu_meter = cpu_meter
        self._hints = hints
        self._flush_interval = flush_interval
        self.stats = LiveStats()
        self.engine_state = "loading"  # loading | running | paused | idle | error
        self.engine_error = ""
        self.prompt_title = ""
        self.prompt_text = ""
        self.snapshot: TelemetrySnapshot | None = None
        self.dashboard_cpu: float | None = None
        self.engine_events = 0  # events drained so far (tests wait on it)
        self._settings = copy.deepcopy(options.settings)
        self._k_request: int | None = None  # K asked for, until a SettingsEvent confirms
        self._typed: WorkItem | None = None  # the operator's last prompt from `n`
        self._quitting = False
        self._bindings_key: tuple | None = None
        self._titles: dict[str, tuple[str, str]] = {}
        self._status_line = ""
        self._panels_events = -1
        self._engine: EngineDriver | None = None
        self.engine_thread: threading.Thread | None = None
        for theme in load_themes().values():
            self.register_theme(theme)

    # --- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Grid(id="panels"):
            with Container(id="generation", classes="panel"):
                yield GenerationView(id="gen-view")
            with Horizontal(id="acceptance", classes="panel"):
                yield TimeChart(_fmt_rate, id="acc-chart")
                yield PositionBars(id="pos-bars")
            with Container(id="throughput", classes="panel"):
                yield TimeChart(_fmt_int, id="tps-chart")
            with Container(id="kpanel", classes="panel"):
                yield TimeChart(_fmt_int, id="k-chart", zero_marker="·")
            with Container(id="cpu", classes="panel"):
                yield CpuView(id="cpu-view")
            with Container(id="numa", classes="panel"):
                yield NumaView(id="numa-view")
            # Shown in the wide layout only; at 80x24 the warnings arrive as a notification.
            with Container(id="hints", classes="panel"):
                yield Static(id="hints-view")
        yield Static(id="status")
        # The palette key is in the help screen; at 80 columns the footer needs its room.
        yield Footer(compact=True, show_command_palette=False)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def on_mount(self) -> None:
        # References, not queries, from here on: a query runs on the *active* screen,
        # which is a dialog while one is open.
        self._gen = self.query_one(GenerationView)
        self._acc_chart = self.query_one("#acc-chart", TimeChart)
        self._tps_chart = self.query_one("#tps-chart", TimeChart)
        self._k_chart = self.query_one("#k-chart", TimeChart)
        self._pos_bars = self.query_one(PositionBars)
        self._cpu = self.query_one(CpuView)
        self._numa = self.query_one(NumaView)
        self._status = self.query_one("#status", Static)
        self._panel = {w.id: w for w in self.query(".panel")}
        self.theme = self.options.theme
        self._start_engine(self._initial_queue())
        self._show_hints()
        self._poll_telemetry()
        self._update_panels()

    def _show_hints(self) -> None:
        """Machine settings that change inference speed (threads, OpenMP, NUMA, huge
        pages), read once: they do not change while the dashboard runs."""
        try:
            hints = self._hints()
        except SpecdashError as exc:
            hints = [Hint("warn", "hints", str(exc), "")]
        marks = {"warn": ("⚠", "$warning"), "info": ("·", "$text-muted"), "ok": ("✓", "$success")}
        lines = [f"[{marks[h.level][1]}]{marks[h.level][0]}[/] {escape(h.message)}" for h in hints]
        self.query_one("#hints-view", Static).update("\n".join(lines))
        warnings = [h.message for h in hints if h.level == "warn"]
        self._panel["hints"].border_title = f"System · {len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
        full_layout = self.size.width >= self.WIDE_COLUMNS and self.size.height >= self.TALL_ROWS
        if warnings and not full_layout:
            self.notify("\n".join(warnings), title="System hints", severity="warning", timeout=10)

    # --- engine lifecycle ---------------------------------------------------------------
    def _initial_queue(self) -> PromptQueue:
        if self.options.prompt is not None:
            queue = PromptQueue()
            queue.push(WorkItem("your prompt", self.options.prompt))
            return queue
        return PromptQueue(self.options.workload)

    def _start_engine(self, prompts: PromptQueue) -> None:
        self.engine_state = "loading"
        self.engine_error = ""
        self._engine = EngineDriver(
            self._session_factory,
            copy.deepcopy(self._settings),
            prompts,
            ping=lambda: self.post_message(EngineUpdate()),
            flush_interval=self._flush_interval,
        )
        self.run_worker(
            partial(self._supervise_engine, self._engine),
            name="engine", group="engine", thread=True, exit_on_error=False,
        )
        self._refresh_bindings_if_changed()

    def _supervise_engine(self, driver: EngineDriver) -> None:
        """The Textual worker: runs the engine in a daemon thread and waits for it,
        re-raising its error so it arrives as a worker error.

        Why not run the engine in the worker itself: Stop is honoured between steps, but
        one step (or a prefill, or a model load) can take seconds on a loaded machine,
        and Python waits for worker threads before the process may exit. A daemon thread
        lets `q` return the terminal at once; dashboard.run() gives the engine a moment
        to finish its step and close its session, and then exits regardless."""
        failure: list[BaseException] = []

        def body() -> None:
            try:
                driver.run()
            except BaseException as exc:  # handed to the worker, which reports it
                failure.append(exc)
            finally:
                driver.finished.set()

        thread = threading.Thread(target=body, name="specdash-engine", daemon=True)
        self.engine_thread = thread
        thread.start()
        driver.finished.wait()  # set when the engine ends, or at once on quit
        if failure:
            raise failure[0]

    def on_engine_update(self, _message: EngineUpdate) -> None:
        self._drain()

    def _drain(self) -> None:
        driver = self._engine
        if driver is None or not driver.inbox or self._quitting:
            return
        gen = self._gen
        only_steps = True
        while driver.inbox:
            item = driver.inbox.popleft()
            self.engine_events += 1
            if not isinstance(item, StepEvent):
                only_steps = False
            match item:
                case StepEvent():
                    self.stats.feed(item)
                    gen.append(item.pieces, item.from_draft)
                case SettingsEvent():
                    self.stats.feed(item)
                    self._k_request = None
                    if self.engine_state in ("running", "paused"):
                        self.engine_state = "paused" if item.paused else "running"
                case NoticeEvent():
                    severity = {"error": "error", "warning": "warning"}.get(item.level, "information")
                    self.notify(item.message, severity=severity, timeout=6 if severity != "information" else 3)
                case PrefillEvent() | Summary():
                    self.stats.feed(item)
                case Loading(message, fraction):
                    note = message if fraction is None else f"{message}  {fraction:.0%}"
                    gen.show_note(note)
                case Ready():
                    self.engine_state = "running"
                    gen.show_note("")
                case PromptStarted(title, text):
                    self.prompt_title, self.prompt_text = title, text
                    gen.clear()
                    if self.engine_state != "paused":
                        self.engine_state = "running"
                case Idle():
                    self.engine_state = "idle"
                    gen.show_note("Done. Press n for a new prompt.")
        # Text streams as it comes. Numbers and charts redraw on the refresh timer, or at
        # once when something other than a step arrived (a command applied, a pause, a new
        # prompt): the operator sees the effect of a key without waiting.
        if not only_steps:
            self._update_panels()
            self._refresh_bindings_if_changed()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "engine" or self._quitting:
            return
        if event.state == WorkerState.ERROR:
            self._drain()
            error = event.worker.error
            message = str(error) if isinstance(error, SpecdashError) else f"{type(error).__name__}: {error}"
            self.engine_state, self.engine_error = "error", message
            self.notify(message, title="Engine stopped", severity="error", timeout=15)
            self._gen.show_note(
                f"Engine stopped: {message}\nPress r to restart, or n to start with a new prompt.", "error"
            )
            self._update_panels()
            self._refresh_bindings_if_changed()

    def _engine_alive(self) -> bool:
        return self.engine_state in ("running", "paused", "idle")

    # --- panels -------------------------------------------------------------------------
    def _title(self, panel: str, title: str, subtitle: str) -> None:
        """Set a panel's border texts; unchanged texts cost no repaint."""
        if self._titles.get(panel) != (title, subtitle):
            self._titles[panel] = (title, subtitle)
            widget = self._panel[panel]
            widget.border_title, widget.border_subtitle = title, subtitle

    @property
    def panels_current(self) -> bool:
        """Every event drained so far is reflected in the numbers and charts."""
        return self._panels_events == self.engine_events and not (self._engine and self._engine.inbox)

    def _update_panels(self) -> None:
        self._panels_events = self.engine_events
        st = self.stats
        settings = st.settings
        recent = st.recent_counters()
        self._update_charts(recent)
        step = st.last_step
        legend = "[$draft-token]■[/] draft accepted  [$target-token]■[/] target"
        self._title(
            "generation",
            f"Generation · {escape(self.prompt_title)}" if self.prompt_title else "Generation",
            f"{legend}  ·  content: {step.content}" if step and step.content else legend,
        )
        acc = recent.acceptance_rate
        self._title(
            "acceptance",
            f"Acceptance {acc:.0%} · mean len {recent.mean_accepted_length:.2f}" if acc is not None
            else "Acceptance · no drafts yet",
            f"last {len(st.recent)} steps │ per position",
        )
        tps, plain = st.tokens_per_s, st.plain_tokens_per_s
        title = f"tok/s {tps:.1f}" if tps is not None else "tok/s –"
        if plain is None:
            title += " · plain: measuring"
        else:
            title += f" · plain {plain:.1f}"
            if tps is not None:
                title += f" · {tps / plain:.2f}x"
        self._title("throughput", title, "decode only · [$chart-reference]╌[/] plain")
        if step is not None and step.decision:
            k_note = escape(step.decision)
        elif settings is not None and settings.adaptive:
            k_note = "adaptive"
        else:
            k_note = f"last step: {escape(step.drafter)}" if step else ""
        k_now = self._k_in_force()
        k_label = f"K {k_now} (adaptive)" if settings is not None and settings.adaptive and step is not None else f"K {k_now}"
        self._title("kpanel", f"{k_label} · {escape(settings.drafter)}" if settings else "K", k_note)
        self._update_status(tps, acc)

    def _update_charts(self, recent: SpecCounters) -> None:
        # Every chart gets the whole history and draws what fits: its width may not be
        # known yet (events can arrive before the first layout) and may change.
        history = self.stats.smoothed(CHART_HISTORY)
        self._acc_chart.set_data([a for a, _ in history], 1.0)
        self._pos_bars.set_rates(recent.per_pos_rate)

        self._tps_chart.set_data(
            [v for _, v in history], _speed_axis_top, self.stats.plain_tokens_per_s
        )
        ks = [float(b.k) for b in self.stats.series(CHART_HISTORY)]
        self._k_chart.set_data(ks, _k_axis_top)

    STATE_LABELS = {
        "running": ("▶ running", "bold $success"),
        "paused": ("⏸ paused", "bold $warning"),
        "loading": ("… loading", "bold $accent"),
        "idle": ("■ done", "bold $text-muted"),
        "error": ("✖ error", "bold $error"),
    }

    def _k_in_force(self) -> int | None:
        """Adaptive K changes every step: the K the last step ran with, not the configured
        starting value. None before the engine has reported its settings."""
        st, step = self.stats.settings, self.stats.last_step
        if st is None:
            return None
        return step.k if st.adaptive and step is not None else st.k

    def _update_status(self, tps: float | None, acc: float | None) -> None:
        st = self.stats.settings
        label, style = self.STATE_LABELS[self.engine_state]
        step = self.stats.last_step
        target, draft = (st.target, st.drafter) if st else (self._settings.target, self._settings.draft)
        k_now = self._k_in_force()
        # Optional parts in the order they give way when the terminal is narrow; the
        # numbers an operator watches (tok/s, acceptance, K) never do.
        optional = {
            "content": step.content if step is not None and step.content else None,
            "temp": f"T {st.temperature:g}" if st is not None else None,
            "experts": f"experts {st.experts or st.expert_count}/{st.expert_count}"
            if st is not None and st.expert_count else None,
        }
        give_way = [k for k in optional if optional[k]]
        # Tries, widest first: shorter model names, then fewer optional parts.
        tries = [((24, 20), 0), ((18, 14), 0), ((12, 10), 0)]
        tries += [((12, 10), n) for n in range(1, len(give_way) + 1)] + [((8, 6), len(give_way))]
        for (target_w, draft_w), n_dropped in tries:
            shown = {k: optional[k] for k in give_way[n_dropped:]}
            parts = [label, f"{_short(target, target_w)} ← {_short(draft, draft_w)}"]
            if k_now is not None:
                parts.append(f"K {k_now} {'adaptive' if st.adaptive else 'fixed'}")
            parts += [shown[k] for k in ("temp", "experts") if k in shown]
            parts.append(f"{tps:.1f} tok/s" if tps is not None else "– tok/s")
            parts.append(f"acc {acc:.0%}" if acc is not None else "acc –")
            if "content" in shown:
                parts.append(shown["content"])
            if len(" │ ".join(parts)) + 2 <= self.size.width:
                break
        parts[0] = f"[{style}]{label}[/]"
        parts[1:] = [escape(p) for p in parts[1:]]
        line = " │ ".join(parts)
        if line != self._status_line:
            self._status_line = line
            self._status.update(line, layout=False)

    # --- telemetry ----------------------------------------------------------------------
    def _poll_telemetry(self) -> None:
        if self._quitting:
            return
        try:
            snapshot = self.snapshot = self._sampler.sample()
            self.dashboard_cpu = self._cpu_meter()
            loads = snapshot.core_loads
            self._cpu.update_loads(loads)
            mean = sum(loads) / len(loads) if loads else 0.0
            shares = f"proc {snapshot.process.cpu_percent_of_core:.0f}%"
            if self.dashboard_cpu is not None:
                shares += f" · dash {self.dashboard_cpu:.1f}%"
            self._title("cpu", f"CPU · {len(loads)} cores · {mean:.0f}%", shares)
            nodes = snapshot.numa_nodes
            self._numa.update_nodes(nodes)
            if nodes and nodes[0].source.startswith("proc"):
                numa_title = "Memory · no NUMA info"
            else:
                numa_title = f"Memory · {len(nodes)} NUMA node{'s' if len(nodes) != 1 else ''}"
            self._title("numa", numa_title, f"RSS {human_bytes(snapshot.process.rss_bytes)}")
            # Also catches a step flushed just before the engine went quiet (a slow
            # drafter swap) that would otherwise wait for the next ping.
            self._drain()
            self._update_panels()
        finally:
            if not self._quitting:
                self.set_timer(self.options.refresh, self._poll_telemetry)

    # --- availability -------------------------------------------------------------------
    def _refresh_bindings_if_changed(self) -> None:
        # The footer rebuilds itself on every refresh_bindings (a full layout): only ask
        # when something availability depends on has changed.
        st = self.stats.settings
        key = (self.engine_state, st.adaptive if st else None, bool(st and st.expert_count))
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()

    def why_unavailable(self, action: str) -> str:
        """"" when `action` can run now, else the reason (help screen, footer dimming)."""
        st = self.stats.settings
        if action in self.ENGINE_CONTROLS and not self._engine_alive():
            return "the engine is not running" if self.engine_state != "loading" else "the engine is loading"
        if action in ("k_up", "k_down") and st is not None and st.adaptive:
            return "adaptive K is on (press a to fix K)"
        if action == "set_experts" and (st is None or not st.expert_count):
            return "the target is a dense model (no experts)"
        if action == "restart" and self.engine_state != "error":
            return "the engine is running"
        return ""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Footer: a control that cannot run now is dimmed; hidden where that leaves room
        for what can (after an error the footer shows restart instead of dead controls)."""
        if action not in self.CONTROLS:
            return True
        if action == "restart":
            return self.engine_state == "error"
        if action in self.ENGINE_CONTROLS and self.engine_state == "error":
            return False
        st = self.stats.settings
        if action == "set_experts" and (st is None or not st.expert_count):
            return False  # dense (or not yet known): the help screen says why
        if action in self.ENGINE_CONTROLS and not self._engine_alive():
            return None  # dimmed while loading
        return True  # other refusals (K under adaptive) are explained when pressed

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Screenshot":  # ours also writes the stats beside the SVG
                yield command
        for action, (key, description) in self.CONTROLS.items():
            if action != "quit" and not self.why_unavailable(action):
                yield SystemCommand(f"{description[0].upper()}{description[1:]} ({key})", "", getattr(self, f"action_{action}"))

    # --- actions ------------------------------------------------------------------------
    def _send(self, cmd: C.Command) -> None:
        if self._engine is not None:
            self._engine.send(cmd)
        if self.engine_state == "idle":
            # The engine applies commands between steps; between prompts there are none.
            self.notify("noted: it applies when the next prompt starts (n)", timeout=4)

    def _current_k(self) -> int:
        if self._k_request is not None:
            return self._k_request
        st = self.stats.settings
        return st.k if st is not None else self._settings.k

    def _refused(self, action: str) -> bool:
        reason = self.why_unavailable(action)
        if reason:
            self.notify(reason, severity="warning", timeout=4)
        return bool(reason)

    def action_k_up(self) -> None:
        if self._refused("k_up"):
            return
        self._k_request = self._current_k() + 1
        self._send(C.SetK(self._k_request))

    def action_k_down(self) -> None:
        if self._refused("k_down"):
            return
        k = self._current_k()
        if k <= 0:
            self.notify("K is already 0 (plain decoding); it cannot go lower", severity="warning")
            return
        self._k_request = k - 1
        self._send(C.SetK(self._k_request))

    def action_pick_draft(self) -> None:
        current = self.stats.settings.drafter if self.stats.settings else self._settings.draft
        try:
            choices = draft_choices()
        except SpecdashError as exc:
            self.notify(str(exc), severity="error")
            return

        def chosen(spec: str | None) -> None:
            if spec:
                self._send(C.SetDrafter(spec))
                self.notify(f"switching draft to {spec}…", timeout=2)

        self.push_screen(DraftPicker(choices, current), chosen)

    def action_set_temperature(self) -> None:
        current = self.stats.settings.temperature if self.stats.settings else self._settings.sampling.temperature

        def check(text: str) -> str | None:
            try:
                value = float(text)
            except ValueError:
                return f"temperature {text!r} is not a number; use 0 (greedy) to {TEMPERATURE_MAX:g}"
            if not 0 <= value <= TEMPERATURE_MAX:
                return f"temperature {value:g} is out of range; use 0 (greedy) to {TEMPERATURE_MAX:g}"
            return None

        def chosen(text: str | None) -> None:
            if text is not None:
                self._send(C.SetSampling(temperature=float(text)))

        self.push_screen(
            AskScreen("Temperature", f"{current:g}", f"0 = greedy, up to {TEMPERATURE_MAX:g}. Enter applies, Esc cancels.", check),
            chosen,
        )

    def action_toggle_pause(self) -> None:
        paused = self.stats.settings.paused if self.stats.settings else False
        self._send(C.Resume() if paused else C.Pause())

    def action_toggle_adaptive(self) -> None:
        on = self.stats.settings.adaptive if self.stats.settings else self._settings.adaptive
        self._send(C.SetAdaptive(not on))

    def action_set_experts(self) -> None:
        st = self.stats.settings
        if st is None or not st.expert_count:
            return
        count = st.expert_count

        def check(text: str) -> str | None:
            if not text.strip().isdigit() or not 1 <= int(text) <= count:
                return f"experts {text!r} refused: use a whole number 1..{count}"
            return None

        def chosen(text: str | None) -> None:
            if text is not None:
                self._send(C.SetExperts(int(text)))

        self.push_screen(
            AskScreen("Active experts", str(st.experts or count), f"1..{count}; the target reloads and continues where it was.", check),
            chosen,
        )

    def action_new_prompt(self) -> None:
        def check(text: str) -> str | None:
            return None if text.strip() else "the prompt is empty"

        def chosen(text: str | None) -> None:
            if text is None:
                return
            item = self._typed = WorkItem(_short(text.strip().splitlines()[0], 50), text)
            if self._engine_alive() or self.engine_state == "loading":
                self._engine.new_prompt(item)
            else:  # the engine died: a new prompt restarts it
                queue = PromptQueue()
                queue.push(item)
                self._start_engine(queue)

        self.push_screen(
            AskScreen("New prompt", "", "Enter starts it (the current prompt stops). For long prompts use --prompt-file.", check),
            chosen,
        )

    def action_restart(self) -> None:
        if self.engine_state != "error":
            return
        # Start over where the operator was: their last typed prompt, else as launched.
        queue = PromptQueue() if self._typed else self._initial_queue()
        if self._typed:
            queue.push(self._typed)
        self._start_engine(queue)

    def action_help(self) -> None:
        controls = [(key, desc, self.why_unavailable(action)) for action, (key, desc) in self.CONTROLS.items()]
        self.push_screen(HelpScreen(controls))

    def action_screenshot(self) -> None:
        folder = Path(self.options.screenshots_dir).expanduser()
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            stem, n = f"specdash-{stamp}", 1
            while (folder / f"{stem}.svg").exists():
                n += 1
                stem = f"specdash-{stamp}-{n}"
            svg = Path(self.save_screenshot(filename=f"{stem}.svg", path=str(folder)))
            state = self.state_for_screenshot(svg)
            svg.with_suffix(".json").write_text(json.dumps(state, indent=2, default=str) + "\n", encoding="utf-8")
        except OSError as exc:
            self.notify(f"cannot write a screenshot to {folder}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"{svg}\n+ {svg.with_suffix('.json').name}", title="Screenshot saved", timeout=5)

    def state_for_screenshot(self, svg: Path) -> dict[str, Any]:
        st = self.stats
        session = self._engine.session if self._engine else None
        live = session.settings if session is not None else self._settings
        plain, tps = st.plain_tokens_per_s, st.tokens_per_s
        return {
            "svg": str(svg),
            "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "engine_state": self.engine_state,
            "prompt": {"title": self.prompt_title, "text": self.prompt_text},
            "settings": dataclasses.asdict(live),
            "engine_reported": dataclasses.asdict(st.settings) if st.settings else None,
            "stats": {
                "tokens_per_s": tps,
                "plain_tokens_per_s": plain,
                "speedup_vs_plain": tps / plain if tps and plain else None,
                "recent_steps": counters_dict(st.recent_counters()),
                "current_prompt": counters_dict(st.run),
                "session": counters_dict(st.total),
                "last_summary": {k: v for k, v in dataclasses.asdict(st.last_summary).items() if k != "text"}
                if st.last_summary else None,
            },
            "telemetry": dataclasses.asdict(self.snapshot) if self.snapshot else None,
            "dashboard_cpu_percent": self.dashboard_cpu,
            "ui": {"theme": self.theme, "refresh": self.options.refresh, "size": list(self.size)},
        }

    def action_write_config(self) -> None:
        from specdash.config import Config, UISettings, save_config

        default = self.options.config_path or Path(
            os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
        ) / "specdash" / "config.toml"

        def check(text: str) -> str | None:
            return None if text.strip() else "type a file path"

        def chosen(text: str | None) -> None:
            if text is None:
                return
            session = self._engine.session if self._engine else None
            live = copy.deepcopy(session.settings if session is not None else self._settings)
            ui = UISettings(theme=self.theme, refresh=self.options.refresh, screenshots_dir=self.options.screenshots_dir)
            try:
                path = save_config(Config(engine=live, ui=ui), text.strip())
            except SpecdashError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"load it with --config {path}", title=f"Settings written to {path}", timeout=6)

        self.push_screen(
            AskScreen("Write settings to", str(default), "Enter writes (an existing file is replaced), Esc cancels.", check),
            chosen,
        )

    async def action_quit(self) -> None:
        self._stop_engine()
        self.exit(0)

    def on_unmount(self) -> None:
        # Every way out (q, ctrl+q, the palette, app.exit in tests) passes here. The
        # engine thread must end: Python waits for it before the process can exit.
        self._stop_engine()

    def _stop_engine(self) -> None:
        self._quitting = True
        if self._engine is not None:
            self._engine.shutdown()


def _speed_axis_top(shown: list[float]) -> float:
    return nice_ceiling(max(shown, default=1.0) * 1.05)


def _k_axis_top(shown: list[float]) -> float:
    # At least 0..8, in steps of 4: K=4 sits mid-height and a change of one shows.
    return float(-(-max(shown + [8.0]) // 4) * 4)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
