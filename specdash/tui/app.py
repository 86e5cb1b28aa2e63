"""The dashboard: renders what a source reports, sends the operator's commands. It decides
nothing about decoding and never touches engine state.

The source (the embedded engine, a recording, a remote server) runs in its own thread(s)
and hands contract events to an Outbox; the Outbox pings with one replaceable
SourceUpdate message, so pings never pile up. `_ingest` is the one path every event
takes: into the reducer (tui/reducer.py), then out to the panels. Telemetry of this
machine is sampled on a timer re-armed after each poll (polls cannot overlap) and enters
the same path as a TelemetryEvent. Errors from a source arrive as StatusEvent("error")
and are shown by one handler; the app stays alive and `r` starts a new source with the
last good settings.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Container, Grid
from textual.markup import escape
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from specdash import events as E
from specdash.engine.settings import LIMIT, EngineSettings
from specdash.engine.stats import SpecCounters
from specdash.errors import SpecdashError
from specdash.events import Event, NoticeEvent, StatusEvent, StepEvent
from specdash.sources.base import Outbox, Source
from specdash.sources.embedded import EmbeddedSource, PromptQueue, SessionFactory, WorkItem
from specdash.telemetry import Hint
from specdash.tui.controls import BY_ACTION, CONTROLS, footer_state, why_unavailable
from specdash.tui.panels import (
    AcceptancePanel,
    CpuPanel,
    GenerationPanel,
    KPanel,
    NumaPanel,
    Panel,
    ThroughputPanel,
)
from specdash.tui.live_stats import LiveStats
from specdash.tui.reducer import DashState
from specdash.tui.screens.ask import AskScreen
from specdash.sweep import Sweep
from specdash.tui.screens.draft_picker import DraftPicker, draft_choices
from specdash.tui.screens.export import ExportScreen
from specdash.tui.screens.sweep import SweepScreen
from specdash.tui.screens.help import HelpScreen
from specdash.tui.status import StatusLine, short
from specdash.tui.themes import VARIABLE_DEFAULTS, load_themes

TEMPERATURE = LIMIT["temperature"]

# + and - share one footer entry ("+ - K") to leave room for the rest at 80 columns.
_K_KEYS = Binding.Group("K", compact=True)

# A source for the given settings (None: the ones the dashboard started with).
SourceFactory = Callable[[EngineSettings, PromptQueue], Source]


class SourceUpdate(Message):
    """The source left something in the outbox."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SourceUpdate)


@dataclass(slots=True)
class DashboardOptions:
    settings: EngineSettings
    prompt: str | None = None  # None: cycle the built-in workload
    workload: list[WorkItem] = field(default_factory=list)
    theme: str = "specdash-dark"
    refresh: float = 1.0
    screenshots_dir: str = "~/specdash-screenshots"
    config_path: Path | None = None  # where `w` offers to write
    window: float = 60.0  # seconds of decode time the time charts show
    sweep_ks: tuple[int, ...] = (0, 2, 4, 8, 12, 16, 24)
    sweep_rounds: int = 2
    sweep_tokens: int = 96
    sweep_at_start: bool = False  # `specdash sweep`: open the sweep view on the first prompt


def counters_dict(c: SpecCounters) -> dict[str, Any]:
    return {
        **asdict(c),
        "acceptance_rate": c.acceptance_rate,
        "mean_accepted_length": c.mean_accepted_length,
        "tokens_per_step": c.tokens_per_step,
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
        Binding("space", "toggle_pause", "pause", key_display="␣", id="engine.pause"),
        Binding("n", "new_prompt", "new", id="prompt.new"),
        Binding("a", "toggle_adaptive", "adapt", id="k.adaptive"),
        Binding("e", "set_experts", "experts", id="target.experts"),
        Binding("left_square_bracket", "slower", "slower", key_display="[", id="replay.slower"),
        Binding("right_square_bracket", "faster", "faster", key_display="]", id="replay.faster"),
        Binding("left", "seek_back", "-10s", key_display="←", id="replay.back"),
        Binding("right", "seek_forward", "+10s", key_display="→", id="replay.forward"),
        Binding("home", "seek_start", "start", show=False, id="replay.start"),
        Binding("end", "seek_end", "end", show=False, id="replay.end"),
        Binding("k", "sweep", "sweep", id="k.sweep"),
        Binding("x", "export", "export", show=False, id="config.export"),
        Binding("s", "screenshot", "shot", id="app.screenshot"),
        # In the help screen and the palette; the footer has no room left at 80 columns.
        Binding("w", "write_config", "save", id="config.write", show=False),
        Binding("r", "restart", "restart", id="engine.restart"),
        Binding("question_mark", "help", "help", key_display="?", id="app.help"),
        Binding("q", "quit", "quit", id="app.quit"),
    ]

    def __init__(
        self,
        options: DashboardOptions,
        *,
        session_factory: SessionFactory | None = None,
        source_factory: SourceFactory | None = None,
        sampler: Any = None,
        cpu_meter: Callable[[], float | None] | None = None,
        hints: Callable[[], list[Hint]] | None = None,
        local_telemetry: bool = True,
        flush_interval: float = 0.25,
    ):
        """The source: `source_factory`, or the embedded engine built with
        `session_factory`. sampler (sample() -> TelemetrySnapshot), cpu_meter and hints
        default to the real machine; tests inject fixed ones. local_telemetry=False for
        sources on another machine (attach) or from another time (replay)."""
        super().__init__()
        self.options = options
        if source_factory is None:
            if session_factory is None:
                raise ValueError("SpecdashApp needs a session_factory or a source_factory")
            factory = session_factory

            def embedded(settings: EngineSettings, prompts: PromptQueue) -> Source:
                return EmbeddedSource(factory, settings, prompts)

            source_factory = embedded
        self._source_factory = source_factory
        self._local_telemetry = local_telemetry
        if local_telemetry and sampler is None:
            from specdash.telemetry import TelemetrySampler

            sampler = TelemetrySampler()
        if local_telemetry and cpu_meter is None:
            from specdash.tui.ui_cpu import DashboardCpuMeter

            cpu_meter = DashboardCpuMeter(lambda: self.engine_thread.native_id if self.engine_thread else None).sample
        if hints is None:
            if local_telemetry:
                from specdash.telemetry import collect_hints

                hints = partial(collect_hints, threads=options.settings.threads)
            else:
                hints = list
        self._sampler = sampler
        self._cpu_meter = cpu_meter or (lambda: None)
        self._hints = hints
        self._flush_interval = flush_interval
        self.state = DashState(window=options.window)
        self.source: Source | None = None
        self._outbox: Outbox | None = None
        self._k_request: int | None = None  # K asked for, until a SettingsEvent confirms
        self._speed_request: float | None = None  # replay speed asked for, until a ReplayEvent confirms
        self._typed: WorkItem | None = None  # the operator's last prompt from `n`
        self._quitting = False
        self._bindings_key: tuple[object, ...] | None = None
        self._panels_events = -1
        self._listeners: list[Callable[[Event], None]] = []  # recorders, exporters
        self.sweep: Sweep | None = None  # the K sweep in progress or on screen
        self.on_exit_callbacks: list[Callable[[], None]] = []  # close them when the app ends
        for theme in load_themes().values():
            self.register_theme(theme)

    # --- what tests and the CLI read ------------------------------------------------------
    @property
    def stats(self) -> LiveStats:
        return self.state.stats

    @property
    def engine_state(self) -> str:
        return self.state.state

    @property
    def engine_error(self) -> str:
        return self.state.message if self.state.state == "error" else ""

    @property
    def prompt_title(self) -> str:
        return self.state.prompt_title

    @property
    def engine_events(self) -> int:
        return self.state.events

    @property
    def engine_thread(self) -> threading.Thread | None:
        """The embedded engine's thread, when the source is one."""
        return self.source.thread if isinstance(self.source, EmbeddedSource) else None

    @property
    def panels_current(self) -> bool:
        """Every event received so far is reflected in the numbers and charts."""
        return self._panels_events == self.state.events and not (self._outbox and self._outbox.items)

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        """Also hand every event to `listener` (a recorder, a metrics exporter)."""
        self._listeners.append(listener)

    # --- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Grid(id="panels"):
            yield GenerationPanel(id="generation")
            yield AcceptancePanel(id="acceptance")
            yield ThroughputPanel(id="throughput")
            yield KPanel(id="kpanel")
            yield CpuPanel(id="cpu")
            yield NumaPanel(id="numa")
            # Shown in the wide layout only; at 80x24 the warnings arrive as a notification.
            with Container(id="hints", classes="panel"):
                yield Static(id="hints-view")
        yield StatusLine(id="status")
        # The palette key is in the help screen; at 80 columns the footer needs its room.
        yield Footer(compact=True, show_command_palette=False)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def on_mount(self) -> None:
        # References, not queries, from here on: a query runs on the *active* screen,
        # which is a dialog while one is open.
        self._gen = self.query_one(GenerationPanel)
        self._panels: list[Panel] = list(self.query(Panel))
        self._status = self.query_one(StatusLine)
        self.theme = self.options.theme
        self._start_source(self.options.settings, self._initial_queue())
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
        self.query_one("#hints").border_title = f"System · {len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
        full_layout = self.size.width >= self.WIDE_COLUMNS and self.size.height >= self.TALL_ROWS
        if warnings and not full_layout:
            self.notify("\n".join(warnings), title="System hints", severity="warning", timeout=10)

    # --- the source -----------------------------------------------------------------------
    def _initial_queue(self) -> PromptQueue:
        if self.options.prompt is not None:
            queue = PromptQueue()
            queue.push(WorkItem("your prompt", self.options.prompt))
            return queue
        return PromptQueue(self.options.workload)

    def _start_source(self, settings: EngineSettings, prompts: PromptQueue) -> None:
        if self.source is not None:
            self.source.close()
        def ping() -> None:
            self.post_message(SourceUpdate())

        outbox = self._outbox = Outbox(ping, flush_interval=self._flush_interval)
        self.source = self._source_factory(settings, prompts)
        self.state.state, self.state.message = "loading", ""
        self.source.start(outbox.emit)
        self._refresh_bindings_if_changed()

    def on_source_update(self, _message: SourceUpdate) -> None:
        self._drain()

    def _drain(self) -> None:
        if self._outbox is None or self._quitting:
            return
        self._ingest(self._outbox.drain())

    def _ingest(self, events: Iterable[Event]) -> None:
        """The one path every event takes: reducer, listeners, then the screen. Text
        streams as it comes; numbers and charts redraw on the refresh timer, or at once
        when something other than a step arrived (a command applied, a pause, a new
        prompt), so the operator sees the effect of a key without waiting."""
        urgent = False
        any_event = False
        for ev in events:
            any_event = True
            self.state.feed(ev)
            for listener in self._listeners:
                listener(ev)
            if self.sweep is not None and not self.sweep.finished:
                self._drive_sweep(ev)
            elif self.options.sweep_at_start and isinstance(ev, E.PromptEvent):
                self.options.sweep_at_start = False
                self.call_later(self.action_sweep)
            match ev:
                case StepEvent() | E.CountersEvent() | E.TelemetryEvent():
                    continue
                case E.SettingsEvent():
                    self._k_request = None
                case E.ReplayEvent(speed=speed) if speed == self._speed_request:
                    self._speed_request = None
                case NoticeEvent(level=level, message=message):
                    severity = {"error": "error", "warning": "warning"}.get(level, "information")
                    self.notify(message, severity=severity,  # type: ignore[arg-type]
                                timeout=6 if severity != "information" else 3)
                case StatusEvent(state="error", message=message):
                    self.notify(message, title="Engine stopped", severity="error", timeout=15)
                case StatusEvent(state="down", message=message):
                    self.notify(message, title="Server down", severity="error", timeout=8)
            urgent = True
        if not any_event:
            return
        self._gen.show_text(self.state)
        if urgent:
            self._update_panels()
            self._refresh_bindings_if_changed()

    # --- panels -------------------------------------------------------------------------
    def _update_panels(self) -> None:
        self._panels_events = self.state.events
        for panel in self._panels:
            panel.show(self.state)
        settings = self.options.settings
        self._status.show(self.state, (settings.target, settings.draft))

    # --- telemetry ----------------------------------------------------------------------
    def _poll_telemetry(self) -> None:
        if self._quitting:
            return
        try:
            if self._local_telemetry and self._sampler is not None:
                self._ingest([E.TelemetryEvent.of(self._sampler.sample(), self._cpu_meter())])
            # Also catches a step flushed just before the source went quiet (a slow
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
        st = self.state.settings
        key = (self.state.state, st.adaptive if st else None, tuple(sorted(st.unavailable)) if st else None)
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()

    def _sweeping(self) -> bool:
        return self.sweep is not None and not self.sweep.finished

    def why_unavailable(self, action: str) -> str:
        control = BY_ACTION.get(action)
        if self._sweeping() and control is not None and control.command is not None:
            return "a K sweep drives the engine now: Esc in the sweep view cancels it"
        return why_unavailable(action, self.state)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        control = BY_ACTION.get(action)
        if isinstance(self.screen, SweepScreen) and control is not None and control.command is not None:
            return False  # the sweep view owns the engine; its own keys are in its footer
        return footer_state(action, self.state)

    def on_key(self, event: events.Key) -> None:
        """A key whose control the footer hides (the source cannot do it: K on a recording,
        experts on a dense model) reaches here instead of its action: say why."""
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            if event.key in binding.key.split(","):
                reason = self.why_unavailable(binding.action)
                if reason and self.check_action(binding.action, ()) is False:
                    self.notify(reason, severity="warning", timeout=4)
                    event.stop()
                return

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Screenshot":  # ours also writes the stats beside the SVG
                yield command
        for control in CONTROLS:
            if control.action != "quit" and not self.why_unavailable(control.action):
                title = f"{control.description[0].upper()}{control.description[1:]} ({control.key})"
                yield SystemCommand(title, "", getattr(self, f"action_{control.action}"))

    # --- actions ------------------------------------------------------------------------
    def _send(self, cmd: E.Command) -> None:
        if self.source is not None:
            self.source.send(cmd)
        if self.state.state == "idle":
            # The engine applies commands between steps; between prompts there are none.
            self.notify("noted: it applies when the next prompt starts (n)", timeout=4)

    def _current_k(self) -> int:
        if self._k_request is not None:
            return self._k_request
        st = self.state.settings
        return st.k if st is not None and st.k is not None else self.options.settings.k

    def _refused(self, action: str) -> bool:
        reason = self.why_unavailable(action)
        if reason:
            self.notify(reason, severity="warning", timeout=4)
        return bool(reason)

    def action_k_up(self) -> None:
        if self._refused("k_up"):
            return
        k = self._current_k()
        if k >= LIMIT["k"].hi:  # type: ignore[operator]
            self.notify(f"K is already {k}, the most the engine takes", severity="warning")
            return
        self._k_request = k + 1
        self._send(E.SetK(self._k_request))

    def action_k_down(self) -> None:
        if self._refused("k_down"):
            return
        k = self._current_k()
        if k <= 0:
            self.notify("K is already 0 (plain decoding); it cannot go lower", severity="warning")
            return
        self._k_request = k - 1
        self._send(E.SetK(self._k_request))

    def action_pick_draft(self) -> None:
        if self._refused("pick_draft"):
            return
        st = self.state.settings
        current = st.draft or st.drafter if st else self.options.settings.draft
        try:
            choices = draft_choices()
        except SpecdashError as exc:
            self.notify(str(exc), severity="error")
            return

        def chosen(spec: str | None) -> None:
            if spec:
                self._send(E.SetDrafter(spec))
                self.notify(f"switching draft to {spec}…", timeout=2)

        self.push_screen(DraftPicker(choices, current), chosen)

    def action_set_temperature(self) -> None:
        if self._refused("set_temperature"):
            return
        st = self.state.settings
        current = st.temperature if st and st.temperature is not None else self.options.settings.sampling.temperature

        def check(text: str) -> str | None:
            try:
                value = float(text)
            except ValueError:
                return f"temperature {text!r} is not a number; use 0 (greedy) to {TEMPERATURE.hi:g}"
            try:
                TEMPERATURE.coerce(value)
            except ValueError:
                return f"temperature {value:g} is out of range; use 0 (greedy) to {TEMPERATURE.hi:g}"
            return None

        def chosen(text: str | None) -> None:
            if text is not None:
                self._send(E.SetSampling(temperature=float(text)))

        self.push_screen(
            AskScreen("Temperature", f"{current:g}", f"0 = greedy, up to {TEMPERATURE.hi:g}. Enter applies, Esc cancels.", check),
            chosen,
        )

    def action_toggle_pause(self) -> None:
        if self._refused("toggle_pause"):
            return
        if self.state.replay is not None:
            self._send(E.Pause() if self.state.replay.playing else E.Resume())
            return
        st = self.state.settings
        self._send(E.Resume() if st and st.paused else E.Pause())

    # --- replay ---------------------------------------------------------------------------
    def _replay(self, action: str, cmd: E.Command) -> None:
        if not self._refused(action):
            self._send(cmd)

    def _speed_step(self, direction: int) -> float:
        from specdash.sources.replay import SPEEDS

        # From the speed asked for last, until the replay confirms it: quick presses add up.
        now = self._speed_request or (self.state.replay.speed if self.state.replay else 1.0)
        i = min(range(len(SPEEDS)), key=lambda j: abs(SPEEDS[j] - now))
        self._speed_request = SPEEDS[min(max(i + direction, 0), len(SPEEDS) - 1)]
        return self._speed_request

    def action_slower(self) -> None:
        self._replay("slower", E.SetSpeed(self._speed_step(-1)))

    def action_faster(self) -> None:
        self._replay("faster", E.SetSpeed(self._speed_step(+1)))

    def action_seek_back(self) -> None:
        self._replay("seek_back", E.Seek(by=-10.0))

    def action_seek_forward(self) -> None:
        self._replay("seek_forward", E.Seek(by=10.0))

    def action_seek_start(self) -> None:
        self._replay("seek_start", E.Seek(to=0.0))

    def action_seek_end(self) -> None:
        self._replay("seek_end", E.Seek())

    def action_toggle_adaptive(self) -> None:
        if self._refused("toggle_adaptive"):
            return
        st = self.state.settings
        on = st.adaptive if st else self.options.settings.adaptive
        self._send(E.SetAdaptive(not on))

    def action_set_experts(self) -> None:
        if self._refused("set_experts"):
            return
        st = self.state.settings
        if st is None or not st.expert_count:
            return
        count = st.expert_count

        def check(text: str) -> str | None:
            if not text.strip().isdigit() or not 1 <= int(text) <= count:
                return f"experts {text!r} refused: use a whole number 1..{count}"
            return None

        def chosen(text: str | None) -> None:
            if text is not None:
                self._send(E.SetExperts(int(text)))

        self.push_screen(
            AskScreen("Active experts", str(st.experts_active or count), f"1..{count}; the target reloads and continues where it was.", check),
            chosen,
        )

    def action_new_prompt(self) -> None:
        if self._refused("new_prompt"):
            return

        def check(text: str) -> str | None:
            return None if text.strip() else "the prompt is empty"

        def chosen(text: str | None) -> None:
            if text is None:
                return
            item = self._typed = WorkItem(short(text.strip().splitlines()[0], 50), text)
            if self.state.alive or self.state.state == "loading":
                self._send(E.NewPrompt(item.text, item.title))
            else:  # the source died: a new prompt restarts it
                queue = PromptQueue()
                queue.push(item)
                self._restart_with(queue)

        self.push_screen(
            AskScreen("New prompt", "", "Enter starts it (the current prompt stops). For long prompts use --prompt-file.", check),
            chosen,
        )

    def _last_good_settings(self) -> EngineSettings:
        """What the source last reported, else what the dashboard started with."""
        from specdash.config import settings_from_event

        st = self.state.settings
        if st is None or st.source not in ("engine", "replay"):
            return self.options.settings
        return settings_from_event(st, self.options.settings)

    def _restart_with(self, prompts: PromptQueue) -> None:
        self._start_source(self._last_good_settings(), prompts)

    def action_restart(self) -> None:
        if self.state.state != "error":
            return
        # Start over where the operator was: their last typed prompt, else as launched.
        queue = PromptQueue() if self._typed else self._initial_queue()
        if self._typed:
            queue.push(self._typed)
        self._restart_with(queue)

    # --- K sweep --------------------------------------------------------------------------
    def action_sweep(self) -> None:
        if self._refused("sweep"):
            return
        st = self.state.settings
        assert st is not None
        o = self.options
        sweep = Sweep(self.state.prompt_text, st, ks=o.sweep_ks, rounds=o.sweep_rounds,
                      max_tokens=min(o.sweep_tokens, st.max_tokens or o.sweep_tokens), title=self.state.prompt_title)
        why = sweep.why_not() or ("" if self.state.prompt_text else "no prompt is running yet")
        if why:
            self.notify(why, severity="warning", timeout=6)
            return
        self.sweep = sweep
        self.push_screen(SweepScreen(sweep))
        for cmd in sweep.start():
            self._send(cmd)

    def _drive_sweep(self, ev: Event) -> None:
        assert self.sweep is not None
        cmds = self.sweep.feed(ev)
        for cmd in cmds:
            self._send(cmd)
        if isinstance(ev, E.Summary) or self.sweep.finished:
            screen = self.screen
            if isinstance(screen, SweepScreen):
                screen.refresh_view()
            if self.sweep.finished and self.sweep.best is not None:
                best = self.sweep.best
                self.notify(f"best K={best.k}: {best.tokens_per_s:.1f} tok/s; a applies it, w saves it",
                            title="Sweep done", timeout=8)

    def leave_sweep(self) -> None:
        """Esc in the sweep view: cancel a sweep in progress (settings restored), close."""
        if self.sweep is not None:
            for cmd in self.sweep.cancel():
                self._send(cmd)
        if isinstance(self.screen, SweepScreen):
            self.pop_screen()

    def apply_sweep(self) -> None:
        best = self.sweep.best if self.sweep else None
        if best is None or not self.sweep or not self.sweep.finished:
            self.notify("the sweep has not finished yet", severity="warning")
            return
        if self.sweep.before.adaptive:
            self._send(E.SetAdaptive(False))
        self._send(E.SetK(best.k))
        self.notify(f"K={best.k} sent", timeout=3)

    def save_sweep(self) -> None:
        best = self.sweep.best if self.sweep else None
        if best is None or not self.sweep or not self.sweep.finished:
            self.notify("the sweep has not finished yet", severity="warning")
            return
        from specdash.config import settings_from_event

        engine = settings_from_event(self.sweep.before, self.options.settings).replace(k=best.k, adaptive=False)
        self._ask_and_write(engine)

    # --- export -----------------------------------------------------------------------------
    def action_export(self) -> None:
        if self._refused("export"):
            return
        from specdash.export import command_line, preset_section

        st = self.state.settings
        assert st is not None
        k = self.state.k_in_force() if st.adaptive else None
        try:
            command, preset = command_line(st, k=k), preset_section(st, k=k)
        except SpecdashError as exc:
            self.notify(str(exc), severity="error")
            return
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.push_screen(ExportScreen(command, preset, Path(self.options.screenshots_dir).expanduser(),
                                      f"llama-server-{stamp}"))

    def action_help(self) -> None:
        controls = [(c.key, c.description, self.why_unavailable(c.action)) for c in CONTROLS]
        self.push_screen(HelpScreen(controls))

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """`s`: an SVG of the screen and, beside it, a JSON file of the settings and
        numbers shown (Textual's own screenshot action, extended; its arguments unused)."""
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
        st, state = self.state.stats, self.state
        plain, tps = st.plain_tokens_per_s, st.tokens_per_s
        return {
            "svg": str(svg),
            "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "source": {"kind": state.source, "label": self.source.label if self.source else ""},
            "replay": {"file": state.replay.file, "offset_s": round(state.replay.position, 3),
                       "duration_s": round(state.replay.duration, 3), "speed": state.replay.speed}
            if state.replay else None,
            "engine_state": state.state,
            "prompt": {"title": state.prompt_title, "text": state.prompt_text},
            "settings": E.to_dict(state.settings) if state.settings else None,
            "stats": {
                "tokens_per_s": tps,
                "plain_tokens_per_s": plain,
                "speedup_vs_plain": tps / plain if tps and plain else None,
                "recent_steps": counters_dict(st.recent_counters()),
                "current_prompt": counters_dict(st.run),
                "session": counters_dict(st.total),
                "last_summary": {k: v for k, v in asdict(st.last_summary).items() if k != "text"}
                if st.last_summary else None,
            },
            "telemetry": E.to_dict(state.telemetry) if state.telemetry else None,
            "dashboard_cpu_percent": state.telemetry.dashboard_cpu if state.telemetry else None,
            "ui": {"theme": self.theme, "refresh": self.options.refresh, "size": list(self.size)},
        }

    def action_write_config(self) -> None:
        if self._refused("write_config"):
            return
        self._ask_and_write(self._last_good_settings())

    def _ask_and_write(self, engine: EngineSettings) -> None:
        from specdash.config import Config, UISettings, save_config

        default = self.options.config_path or Path(
            os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
        ) / "specdash" / "config.toml"

        def check(text: str) -> str | None:
            return None if text.strip() else "type a file path"

        def chosen(text: str | None) -> None:
            if text is None:
                return
            ui = UISettings(theme=self.theme, refresh=self.options.refresh, screenshots_dir=self.options.screenshots_dir)
            try:
                path = save_config(Config(engine=engine, ui=ui), text.strip())
            except SpecdashError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"load it with --config {path}", title=f"Settings written to {path}", timeout=6)

        self.push_screen(
            AskScreen("Write settings to", str(default), "Enter writes (an existing file is replaced), Esc cancels.", check),
            chosen,
        )

    async def action_quit(self) -> None:
        self._stop_source()
        self.exit(0)

    def on_unmount(self) -> None:
        # Every way out (q, ctrl+q, the palette, app.exit in tests) passes here. The
        # engine thread must end: Python waits for it before the process can exit.
        self._stop_source()

    def _stop_source(self) -> None:
        self._quitting = True
        if self.source is not None:
            self.source.close()
        callbacks, self.on_exit_callbacks = self.on_exit_callbacks, []
        for callback in callbacks:
            callback()
