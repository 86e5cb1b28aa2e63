"""The dashboard's core: the event path from a source to the panels, availability, and the
source's lifecycle. The keys live in app_controls.py and app_tuning.py; app.py puts them
together. It renders what a source reports, sends the operator's commands, decides
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

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingsMap
from textual.containers import Container, Grid
from textual.markup import escape
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError
from specdash.contract.events import Event, NoticeEvent, StatusEvent, StepEvent
from specdash.monitor.health import HealthThresholds
from specdash.contract.vocabulary import COMMANDS
from specdash.sources.base import Outbox, Source
from specdash.sources.embedded import EmbeddedSource, PromptQueue, SessionFactory, WorkItem
from specdash.telemetry import Hint
from specdash.tui.controls import Control, control, controls, footer_state, why_unavailable
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
from specdash.tui.plain_text import PlainNotify
from specdash.tui.reducer import DashState
from specdash.tuning.sweep import Sweep
from specdash.tui.screens.sweep import SweepScreen
from specdash.tui.screens.help import HelpScreen
from specdash.tui.status import StatusLine
from specdash.tui.themes import VARIABLE_DEFAULTS, load_themes
from specdash.tui.widgets.footer import KeyFooter

# A source, given the settings to start from (None for a dashboard that has none: a
# replay or a server brings its own) and the prompts to run.
SourceFactory = Callable[[EngineSettings | None, PromptQueue], Source]


def first_then_new(first: Source, new: Callable[[PromptQueue], Source]) -> SourceFactory:
    """A factory for a command that builds its source before the dashboard starts (attach
    checks the URL there, in one line): `first` on the first call, `new(prompts)` on each
    later one. A later call is a restart (`r` after an error, `n` after the source
    stopped): `_start_source` has closed the source before it, and a closed source cannot
    start again."""
    unused = [first]

    def factory(settings: EngineSettings | None, prompts: PromptQueue) -> Source:
        return unused.pop() if unused else new(prompts)

    return factory


def command_bindings() -> list[Binding]:
    """The command registry's keys as bindings, in its order. Keys with one footer group
    share an entry (K: "+ - K") to leave room for the rest at 80 columns."""
    groups: dict[str, Binding.Group] = {}
    out = []
    for spec in COMMANDS.values():
        for key in spec.keys:
            group = groups.setdefault(key.group, Binding.Group(key.group, compact=True)) if key.group else None
            out.append(Binding(key.keys, key.action, key.label, show=key.footer, key_display=key.display,
                               id=f"{spec.name}.{key.action}", group=group))
    return out


class SourceUpdate(Message):
    """The source left something in the outbox."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SourceUpdate)


@dataclass(slots=True)
class DashboardOptions:
    # The embedded engine's settings as launched; None for a source that brings its own
    # (a replay, a server): nothing is shown for it until its first settings event.
    settings: EngineSettings | None = None
    prompt: str | None = None  # None: cycle the built-in workload
    workload: list[WorkItem] = field(default_factory=list)
    theme: str = "specdash-dark"
    refresh: float = 1.0
    screenshots_dir: str = "~/specdash-screenshots"
    config_path: Path | None = None  # where `w` offers to write
    window: float = 60.0  # seconds of decode time the time charts show
    model_dirs: tuple[str, ...] = ()  # [models] model_dirs: where `d` also finds drafts
    sweep_ks: tuple[int, ...] = (0, 2, 4, 8, 12, 16, 24)
    sweep_rounds: int = 2
    sweep_tokens: int = 96
    # the temperatures to sweep K at (`specdash sweep --temps`, `t` in the sweep view);
    # None = the one in force, left untouched
    sweep_temps: tuple[float, ...] | None = None
    sweep_at_start: bool = False  # `specdash sweep`: open the sweep view on the first prompt
    # `specdash sweep --whatif`: ({K: (tok/s, acceptance)}, source) simulated for `prompt`
    sweep_predicted: tuple[dict[int, tuple[float, float | None]], str] | None = None
    health: HealthThresholds | None = None  # the health rules' thresholds (None: the defaults)


class DashboardBase(PlainNotify):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses live elsewhere
    TITLE = "specdash"
    # The full layout (app.tcss: Screen.-wide.-tall) from this size up; compact below.
    WIDE_COLUMNS, TALL_ROWS = 120, 36
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_COLUMNS, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL_ROWS, "-tall")]

    last_key_at = 0.0  # time.monotonic() of the last key

    # The dashboard's own keys; the command registry's come first (see __init__).
    BINDINGS = [
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
        self._bind_commands()
        if source_factory is None:
            if session_factory is None or options.settings is None:
                raise ValueError("SpecdashApp needs a session_factory and settings, or a source_factory")
            factory, launched = session_factory, options.settings

            def embedded(settings: EngineSettings | None, prompts: PromptQueue) -> Source:
                return EmbeddedSource(factory, settings or launched, prompts, health=options.health)

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

                hints = partial(collect_hints, threads=options.settings.threads if options.settings else None)
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
    def engine_thread(self) -> threading.Thread | None:
        """The thread doing the source's work in this process, when one does."""
        return self.source.thread if self.source is not None else None

    def _bind_commands(self) -> None:
        """The registry's keys before the class's own: a command added to the registry is
        bound with no change here. A key with `send` gets its action made here too."""
        merged = self._bindings  # the classes' BINDINGS, merged along the MRO
        bindings = BindingsMap(command_bindings())
        for key, found in merged.key_to_bindings.items():
            bindings.key_to_bindings.setdefault(key, []).extend(found)
        self._bindings = bindings
        for spec in COMMANDS.values():
            for k in spec.keys:
                if k.send is not None and not hasattr(self, f"action_{k.action}"):
                    setattr(self, f"action_{k.action}", partial(self._send_key, k.action, k.send))

    def _send_key(self, action: str, make: Callable[[], E.Command]) -> None:
        if not self._refused(action):
            self._send(make())

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
        yield KeyFooter(compact=True, show_command_palette=False)

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

    def _start_source(self, settings: EngineSettings | None, prompts: PromptQueue) -> None:
        if self.source is not None:
            self.source.close()
        def ping() -> None:
            self.post_message(SourceUpdate())

        outbox = self._outbox = Outbox(ping, flush_interval=self._flush_interval)
        self.source = self._source_factory(settings, prompts)
        self.state.state, self.state.message = "loading", ""
        # What the source says it is and where its telemetry comes from, before its first
        # settings event (a server down from the start sends none): the panels say what
        # will never come (panels.NO_TELEMETRY).
        self.state.source = self.state.source or self.source.kind
        self.state.telemetry_from = self.source.telemetry
        self.source.start(outbox.emit)
        self._refresh_bindings_if_changed()

    def on_source_update(self, _message: SourceUpdate) -> None:
        self._drain()

    def _drain(self) -> None:
        # Not while Textual shuts down (is_running turns False before the screens close):
        # a panel whose widgets are already gone would raise NoMatches.
        if self._outbox is None or self._quitting or not self.is_running:
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
                case NoticeEvent(level=level, message=message, refused=refused):
                    if refused.startswith("k="):
                        # No settings will confirm it: the next + or - starts from the K in force.
                        self._k_request = None
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

    # Hooks the tuning actions (app_tuning.py) fill in.
    def _drive_sweep(self, ev: Event) -> None:
        """Feed the sweep in progress; send what it asks for."""

    def action_sweep(self) -> None:
        """Open the K sweep view."""

    # --- panels -------------------------------------------------------------------------
    def _update_panels(self) -> None:
        self._panels_events = self.state.events
        for panel in self._panels:
            panel.show(self.state)
        # Before the source's first settings event: the models being loaded, when the
        # dashboard launched them; nothing for a source that brings its own.
        settings = self.options.settings
        self._status.show(self.state, (settings.target, settings.draft) if settings else ("", ""))

    # --- telemetry ----------------------------------------------------------------------
    def _poll_telemetry(self) -> None:
        if self._quitting or not self.is_running:  # (see _drain)
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
        key = (self.state.state, st.adaptive if st else None, tuple(st.supports) if st else None)
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()

    def _sweeping(self) -> bool:
        return self.sweep is not None and not self.sweep.finished

    def _declared(self) -> frozenset[str]:
        """What the source says it can take at most, until its settings say what it takes now."""
        return self.source.supports if self.source is not None else frozenset()

    def why_unavailable(self, action: str) -> str:
        c = control(action)
        if self._sweeping() and c is not None and c.command is not None:
            return "a K sweep drives the engine now: Esc in the sweep view cancels it"
        return why_unavailable(action, self.state, self._declared())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        c = control(action)
        if isinstance(self.screen, SweepScreen) and c is not None and c.command is not None:
            return False  # the sweep view owns the engine; its own keys are in its footer
        return footer_state(action, self.state, self._declared())

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key):
            self.last_key_at = time.monotonic()  # full collections wait for a quiet moment (tui/gc_pacing)
        await super().on_event(event)

    def on_key(self, event: events.Key) -> None:
        """A key whose control the footer hides (the source cannot do it: K on a recording,
        experts on a dense model) reaches here instead of its action: say why. All the
        app's bindings, the registry's included (not the class's BINDINGS alone)."""
        for binding in self._bindings.key_to_bindings.get(event.key, []):
            reason = self.why_unavailable(binding.action)
            if reason and self.check_action(binding.action, ()) is False:
                self.notify(reason, severity="warning", timeout=4)
                event.stop()
            return

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Screenshot":  # ours also writes the stats beside the SVG
                yield command
        for c in controls():
            if c.action != "quit" and not self.why_unavailable(c.action):
                title = f"{c.description[0].upper()}{c.description[1:]} ({self.key_shown(c)})"
                yield SystemCommand(title, "", getattr(self, f"action_{c.action}"))

    def key_shown(self, c: Control) -> str:
        """The control's keys as the help and the palette show them: the [keys] table's
        where it remaps the control's binding (tui/keymap.py), else the registry's."""
        binding_id = f"{c.command}.{c.action}" if c.command else next(
            (b.id for b in self._bindings_of_app() if b.action == c.action and b.id), None)
        keys = self._keymap.get(binding_id or "")
        if not keys:
            return c.key
        return ", ".join(self.get_key_display(Binding(k.strip(), c.action)) for k in keys.split(","))

    def _bindings_of_app(self) -> list[Binding]:
        return [b for cls in type(self).__mro__ for b in getattr(cls, "BINDINGS", []) if isinstance(b, Binding)]

    # --- actions ------------------------------------------------------------------------
    def _send(self, cmd: E.Command) -> None:
        # Between prompts too: the source applies it at once and reports the settings.
        if self.source is not None:
            self.source.send(cmd)

    def _current_k(self) -> int:
        if self._k_request is not None:
            return self._k_request
        st = self.state.settings
        if st is not None and st.adaptive:
            # The K on screen is the controller's: + and - fix K one step from it (the
            # engine turns adaptive off on an explicit K), not from the starting K.
            k_now = self.state.k_in_force()
            if k_now is not None:
                return k_now
        if st is not None and st.k is not None:
            return st.k
        return self.options.settings.k if self.options.settings else 0

    def _refused(self, action: str) -> bool:
        reason = self.why_unavailable(action)
        if reason:
            self.notify(reason, severity="warning", timeout=4)
        return bool(reason)

    def _last_good_settings(self) -> EngineSettings | None:
        """What the source last reported, else what the dashboard started with (None:
        neither, e.g. a server that never answered)."""
        from specdash.config import settings_from_event

        st = self.state.settings
        if st is None or not self.state.engine_settings:
            return self.options.settings
        return settings_from_event(st, self.options.settings or EngineSettings())

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

    def action_help(self) -> None:
        rows = [(self.key_shown(c), c.description, self.why_unavailable(c.action)) for c in controls()]
        st = self.state.settings
        notes = []
        if st is not None and st.repack_verdict:
            notes.append(("weights", f"repack {st.repack_verdict} (`specdash doctor` says more)"))
        if st is not None and st.rollback:
            notes.append(("rollback", st.rollback))
        if self.state.health is not None:  # what each health rule read (specdash/monitor/health.py)
            for rule in self.state.health.rules:
                notes.append((f"health: {rule.name}", f"{rule.state}" + (f": {rule.message}" if rule.message else "")))
        self.push_screen(HelpScreen(rows, notes))

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
