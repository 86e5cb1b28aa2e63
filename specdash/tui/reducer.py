"""The dashboard's state, folded from contract events. No Textual import.

`DashState.feed(event)` is the only way the state changes, and it depends on nothing but
the events (and, from the start, what the source declares: its kind and where its
telemetry comes from): the embedded engine, a recording and a remote server all end up
here, and the panels render from the result. So a replay shows exactly what was live,
and a test can drive the panels with a scripted list of events.

What differs between sources is asked of the state as a capability, never as the
source's kind: `supports` (in the settings), `telemetry_from`, `polled`, `alive` (a
source with a playback position still moves after its end), `engine_settings`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from specdash.contract.events import (
    CountersEvent,
    Event,
    HealthEvent,
    NoticeEvent,
    PrefillEvent,
    PromptEvent,
    QueueEvent,
    ReplayEvent,
    ServerEvent,
    SettingsEvent,
    StatusEvent,
    StepEvent,
    Summary,
    TelemetryEvent,
)
from specdash.monitor.health import is_alarm
from specdash.monitor.request_rows import RequestLog
from specdash.tui.live_stats import LiveStats

# Source lifecycle states the status line knows.
STATES = ("loading", "running", "paused", "idle", "error", "down", "ended")


@dataclass
class DashState:
    window: float = 60.0  # seconds of decode time the time charts show
    # What the source is, as shown and saved ("engine" | "remote" | "replay": the settings'
    # `source`, Source.kind before them). Shown, never decided on.
    source: str = ""
    # Where the CPU and memory panels' telemetry comes from (sources.base.Telemetry:
    # "local" | "recorded" | "none"), as the source declared it; "" before a source starts.
    telemetry_from: str = ""
    label: str = ""  # what the source is: a target, a URL, a recording file
    state: str = "loading"
    message: str = ""  # loading progress, the error text, a down server's reason
    fraction: float | None = None
    prompt_title: str = ""
    prompt_text: str = ""
    # The current prompt's text so far, as (piece, provenance): a seek in a replay or a
    # resize redraws the generation panel from here. Provenance: False = the target's own
    # token, True = an accepted draft token, "xvocab" = one from a translated draft (truthy).
    pieces: list[tuple[str, bool | str]] = field(default_factory=list)
    stats: LiveStats = field(init=False)
    telemetry: TelemetryEvent | None = None
    server: ServerEvent | None = None
    notices: deque[NoticeEvent] = field(default_factory=lambda: deque(maxlen=50))
    replay: ReplayEvent | None = None  # where a replay stands
    health: HealthEvent | None = None  # the source's speculation health (specdash/monitor/health.py)
    requests: RequestLog = field(default_factory=RequestLog)  # one row per finished request
    queue: QueueEvent | None = None  # a server's requests, running and waiting (specdash serve)
    _judged: str = "unknown"  # the last verdict that was not "unknown" (chart markers)
    # The request whose text the generation panel shows when several run in one batch (a
    # server's --parallel): the newest; "" when one runs at a time.
    following: str = ""
    prompt_serial: int = 0  # grows with every new prompt and every rewind: the text restarts
    events: int = 0  # events folded so far
    t: float | None = None  # the `t` of the latest event: where a replay stands

    def __post_init__(self) -> None:
        # Enough 0.5 s bins for the window, plus the smoothing span before its left edge.
        self.stats = LiveStats(history_bins=int(self.window / 0.5) + 8)

    @property
    def settings(self) -> SettingsEvent | None:
        return self.stats.settings

    @property
    def alive(self) -> bool:
        """The source takes commands now. One that reports a playback position (a replay)
        still moves after its end: it seeks."""
        return self.state in ("running", "paused", "idle") or (self.replay is not None and self.state == "ended")

    @property
    def engine_settings(self) -> bool:
        """The settings are an engine's, live or recorded: complete, so they can start
        an engine again (`r`) or be written as a config (`w`). Every engine names its
        drafter spec (`draft`); a server's settings leave it, and most else, unknown."""
        return self.settings is not None and self.settings.draft is not None

    @property
    def polled(self) -> bool:
        """The numbers come from a server's polls (its ServerEvent rows and counter deltas),
        not from steps: no per-step detail and no K=0 steps to measure plain decoding by."""
        return self.server is not None

    def feed(self, ev: Event) -> None:
        self.events += 1
        self.t = ev.t if ev.t else self.t
        self.requests.feed(ev)
        match ev:
            case StepEvent():
                self.stats.feed(ev)
                if ev.request != self.following:
                    return  # another request of the batch: the text panel follows one
                kind = ev.drafter if ev.drafter == "xvocab" else True
                self.pieces.extend((p, kind if d else False) for p, d in zip(ev.pieces, ev.from_draft, strict=True))
            case CountersEvent() | PrefillEvent():
                self.stats.feed(ev)
            case Summary():
                self.stats.feed(ev)
            case SettingsEvent():
                self.stats.feed(ev)
                self.source = self.source or ev.source
                if self.state in ("running", "paused"):
                    self.state = "paused" if ev.paused else "running"
            case StatusEvent(state=state, message=message, fraction=fraction):
                self.message, self.fraction = message, fraction
                if state == "ready":
                    self.state = "running"
                elif state == "running":
                    paused = self.settings is not None and self.settings.paused
                    self.state = "paused" if paused else "running"
                else:
                    self.state = state
            case PromptEvent(title=title, text=text):
                self.prompt_title, self.prompt_text = title, text
                self.following = ev.request
                self.pieces = []
                self.prompt_serial += 1
                if self.state != "paused":
                    self.state = "running"
            case NoticeEvent():
                self.notices.append(ev)
            case TelemetryEvent():
                self.telemetry = ev
            case HealthEvent():
                self.health = ev
                if ev.verdict != "unknown":
                    # Where the verdict turned, on the time charts beside the hot-swaps: into
                    # an alarm, or out of one. "unknown" in between (a settings change starts
                    # the rules over) is no turn.
                    before, self._judged = self._judged, ev.verdict
                    if ev.verdict != before and (is_alarm(before) or is_alarm(ev.verdict)):
                        self.stats.markers.append((self.stats.decode_time, f"health: {ev.verdict}"))
            case ServerEvent():
                self.server = ev
            case QueueEvent():
                self.queue = ev
            case ReplayEvent(rewind=True):
                serial, events, source, telemetry_from = self.prompt_serial, self.events, self.source, self.telemetry_from
                self.__init__(window=self.window)  # type: ignore[misc]  # start over: the replay re-sends what led here
                self.source, self.telemetry_from, self.replay = source, telemetry_from, ev
                self.prompt_serial, self.events = serial + 1, events
                self.state = "running" if ev.playing else "paused"
            case ReplayEvent():
                self.replay = ev
                if self.state != "ended" or ev.playing:
                    self.state = "running" if ev.playing else "paused"

    def k_in_force(self) -> int | None:
        """Adaptive K changes every step: the K the last step ran with, not the configured
        starting value. None before the source has reported its settings."""
        st, step = self.settings, self.stats.last_step
        if st is None:
            return None
        return step.k if st.adaptive and step is not None else st.k
