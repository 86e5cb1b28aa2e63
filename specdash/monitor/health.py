"""Speculation health: named rules over contract events, one verdict per source. No Textual.

Every source's stream goes through a `HealthMonitor` (`monitored(emit, ...)` wraps an
emit function): the embedded engine, a server (one monitor per server, so each fleet row
has its own), `run --json`. It folds the events into *readings*, `reading_seconds` of
decode time each (a request's end closes one early), and after each reading asks four
rules, each against its own running history:

    acceptance_collapse     the recent acceptance length (1 + accepted / drafts, over the
                            last `recent` readings that drafted) below `collapse_ratio` of
                            its running median over earlier readings, or below
                            `collapse_floor` (set it: 0 is off)
    acceptance_repetition   acceptance rate >= `repeat_acceptance` for `repeat_seconds`
                            of decode time on end: the text may be repeating itself
    decode_stall            decode rate over the last `recent` readings below
                            `stall_ratio` of its running median, while requests run
    speculation_not_paying  tokens/s while drafting below `not_paying_ratio` of plain
                            decoding, where the source knows a plain rate: the embedded
                            engine, whose K=0 steps are plain decoding

Readings taken while a rule is in alarm stay out of its median, so a lasting drop does not
become the norm at once: only once the history holds little else (`history` readings, two
minutes at the defaults) does the median follow it. An alarm clears once its figure is 10%
past the threshold (no flapping around it).

A rule is `unknown` until it has the history it needs, `ok`, or `alarm` with a message
that says what it read ("acceptance length 1.3, median 2.9 over 40 readings"). The
verdict is one word: `unknown`, `healthy`, or the most serious alarm (`stalled`,
`collapse`, `losing`, `repetitive`). When any rule changes state the monitor emits a
HealthEvent (recorded, printed by `run --json`, shown by the dashboard) and, for a new
alarm, a warning notice. A settings change (K, drafter, target, temperature) starts the
acceptance and rate histories over: a median of other settings says nothing about these.

A stream that already carries HealthEvents (a replayed recording) is taken as it is: the
monitor stops judging at the first one it sees, so replay shows what was judged live.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from specdash.contract.events import (CountersEvent, Event, HealthEvent, HealthRule, NoticeEvent, PrefillEvent,
                             PromptEvent, ReplayEvent, ServerEvent, SettingsEvent, StatusEvent, StepEvent, Summary)
from specdash.monitor.plain_rate import PLAIN_KEEP, PlainRate

RULES = ("acceptance_collapse", "acceptance_repetition", "decode_stall", "speculation_not_paying")
# The verdict a firing rule gives, most serious first: that order decides the one word.
VERDICT_OF = {"decode_stall": "stalled", "acceptance_collapse": "collapse",
              "speculation_not_paying": "losing", "acceptance_repetition": "repetitive"}
SEVERITY = tuple(VERDICT_OF)
VERDICTS = ("unknown", "healthy", *VERDICT_OF.values())
ALARMS = frozenset(VERDICT_OF.values())
TITLES = {"acceptance_collapse": "acceptance collapse", "acceptance_repetition": "possible repetition",
          "decode_stall": "decode stall", "speculation_not_paying": "speculation not paying"}

MIN_DRAFTS = 2  # drafts a reading needs for its acceptance length to count
# A rule in alarm clears only once its figure is 10% past the threshold: a figure that
# wobbles around it would otherwise flip the verdict (and mark the charts) every reading.
HYSTERESIS = 1.1


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """The rules' thresholds: [health] in the config (config.HEALTH_LIMITS has each one's
    range and help; config.example.toml documents the defaults)."""

    reading_seconds: float = 2.0
    history: int = 60
    min_history: int = 10
    recent: int = 3
    collapse_ratio: float = 0.5
    collapse_floor: float = 0.0
    repeat_acceptance: float = 0.98
    repeat_seconds: float = 30.0
    stall_ratio: float = 0.25
    not_paying_ratio: float = 0.9
    plain_steps: int = 8


@dataclass(slots=True)
class Reading:
    """`reading_seconds` of decoding, summed."""

    t: float = 0.0  # the event time it closed at
    start: float = 0.0  # decode time (the monitor's clock) when it began
    seconds: float = 0.0
    tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    spec_seconds: float = 0.0  # of `seconds`, steps that drafted (K > 0)
    spec_tokens: int = 0
    running: bool = False  # requests ran during it (a server's rows say; steps always do)
    # Taken while that rule was in alarm: left out of its median (see _earlier).
    collapse_alarm: bool = False
    stall_alarm: bool = False

    @property
    def empty(self) -> bool:
        return self.seconds <= 0 and self.drafts == 0

    @property
    def acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts >= MIN_DRAFTS else None

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


def _sum(readings: Iterable[Reading]) -> Reading:
    out = Reading()
    for r in readings:
        out.seconds += r.seconds
        out.tokens += r.tokens
        out.drafts += r.drafts
        out.draft_tokens += r.draft_tokens
        out.accepted += r.accepted
        out.spec_seconds += r.spec_seconds
        out.spec_tokens += r.spec_tokens
    return out


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _g(value: float) -> str:
    """A figure as the messages print it: 3 significant digits."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


class HealthMonitor:
    """Folds one source's events into readings and judges them. Not thread-safe by itself
    (`monitored` locks around it)."""

    def __init__(self, thresholds: HealthThresholds | None = None, *, label: str = ""):
        self.th = thresholds or HealthThresholds()
        self.label = label  # prefixes the notices: a server's URL
        self.external = False  # the stream brings its own HealthEvents (a replay)
        self._settings: SettingsEvent | None = None
        self._plain = PlainRate(PLAIN_KEEP)  # the one estimator the dashboard's reference reads too
        self._told: set[str] = set()  # rules in alarm when a settings change started them over
        self._reset()
        self.current = self._event(t=0.0)
        self._announced = False  # the first verdict was emitted

    def _reset(self) -> None:
        """Forget the readings (a settings change): the medians start over."""
        keep = self.th.history + self.th.recent
        self.readings: deque[Reading] = deque(maxlen=keep)  # with drafts: acceptance rules
        self.rated: deque[Reading] = deque(maxlen=keep)  # while running: the stall rule
        self.spec: deque[Reading] = deque(maxlen=self.th.recent)  # that drafted: not paying
        self._open = Reading()
        self._decode_time = 0.0  # seconds of decoding judged so far: the repetition clock
        self._repeat_start: float | None = None
        self._repeat_drafted = self._repeat_accepted = 0
        self._prev_t: float | None = None
        self._running = False
        self._rules: dict[str, HealthRule] = {name: HealthRule(name, "unknown") for name in RULES}

    # --- feeding ---

    def feed(self, ev: Event) -> list[Event]:
        """Fold one event; what to emit after it (a HealthEvent when a rule changed state,
        a warning notice for each new alarm, and the first verdict with the first decoding
        event: not with the settings, after which a recording has its own)."""
        out = self._feed(ev)
        if not self._announced and not self.external and isinstance(ev, (PrefillEvent, StepEvent, CountersEvent)):
            self._announced = True
            if not any(isinstance(e, HealthEvent) for e in out):
                out.insert(0, self.current)
        return out

    def _feed(self, ev: Event) -> list[Event]:
        if isinstance(ev, HealthEvent):
            self.external, self.current = True, ev
            return []
        if isinstance(ev, ReplayEvent) and ev.rewind:
            self.__init__(self.th, label=self.label)  # type: ignore[misc]  # the replay starts over
            return []
        if self.external:
            return []
        self._plain.feed(ev)
        match ev:
            case SettingsEvent():
                before, self._settings = self._settings, ev
                if before is not None and _what_is_judged(before) != _what_is_judged(ev):
                    # An alarm that comes back under the new settings is the same news: its
                    # notice is not said again (the HealthEvents still show it).
                    self._told = {name for name, rule in self._rules.items() if rule.state == "alarm"}
                    before_states = {name: rule.state for name, rule in self._rules.items()}
                    self._reset()
                    # Said only if a rule knew something it no longer does.
                    return self._judged(ev.t, force=any(state != "unknown" for state in before_states.values()))
                self._prev_t = None
            case PromptEvent() | PrefillEvent():
                self._prev_t = None
            case StepEvent():
                return self._step(ev)
            case Summary():
                self._prev_t = None
                if not self._open.empty:
                    return self._close(ev.t)
            case CountersEvent():
                return self._counters(ev)
            case ServerEvent():
                self._running = (ev.requests_running or 0) > 0
            case StatusEvent(state=state) if state in ("down", "error", "ended", "idle"):
                self._prev_t = None
        return []

    def _step(self, ev: StepEvent) -> list[Event]:
        first = self._prev_t is None
        dt = ev.step_ms / 1e3 if first else max(ev.t - (self._prev_t or ev.t), 0.0)
        self._prev_t = ev.t
        n = len(ev.pieces)
        r = self._open
        r.seconds += dt
        r.tokens += n
        r.running = True
        if ev.drafted > 0:
            r.drafts += 1
            r.draft_tokens += ev.drafted
            r.accepted += ev.accepted
        if ev.k > 0:
            r.spec_seconds += dt
            r.spec_tokens += n
        return self._close(ev.t) if r.seconds >= self.th.reading_seconds else []

    def _counters(self, ev: CountersEvent) -> list[Event]:
        running = self._running or ev.tokens > 0
        r = self._open
        if running:
            r.seconds += ev.seconds
            r.tokens += ev.tokens
            r.running = True
        # llama-server moves its draft counters when a request ends, maybe in an idle poll.
        r.drafts += ev.num_drafts
        r.draft_tokens += ev.num_draft_tokens
        r.accepted += ev.num_accepted_tokens
        if r.seconds >= self.th.reading_seconds:
            return self._close(ev.t)
        return []

    def _knows_plain(self) -> bool:
        """Only the embedded engine's K=0 steps are plain decoding: a server's drive-mode
        steps without drafts are not (it may speculate where we cannot see)."""
        return self._settings is not None and self._settings.source == "engine"

    # --- judging ---

    def _close(self, t: float) -> list[Event]:
        r, self._open = self._open, Reading()
        r.t, r.start = t, self._decode_time
        r.collapse_alarm = self._rules["acceptance_collapse"].state == "alarm"
        r.stall_alarm = self._rules["decode_stall"].state == "alarm"
        self._decode_time += r.seconds
        if r.acceptance_length is not None:
            self.readings.append(r)
        if r.running and r.seconds >= self.th.reading_seconds / 4:
            self.rated.append(r)
        if r.spec_seconds >= self.th.reading_seconds / 4:
            self.spec.append(r)
        self._repetition_clock(r)
        return self._judged(t)

    def _repetition_clock(self, r: Reading) -> None:
        if r.draft_tokens <= 0:
            return  # a stretch at K=0 neither breaks nor extends it
        if r.accepted / r.draft_tokens >= self.th.repeat_acceptance:
            if self._repeat_start is None:
                self._repeat_start, self._repeat_drafted, self._repeat_accepted = r.start, 0, 0
            self._repeat_drafted += r.draft_tokens
            self._repeat_accepted += r.accepted
        else:
            self._repeat_start = None

    def _judged(self, t: float, force: bool = False) -> list[Event]:
        before = {name: rule.state for name, rule in self._rules.items()}
        self._rules = {
            "acceptance_collapse": self._collapse(),
            "acceptance_repetition": self._repetition(),
            "decode_stall": self._stall(),
            "speculation_not_paying": self._not_paying(),
        }
        changed = [name for name, rule in self._rules.items() if rule.state != before[name]]
        self.current = self._event(t, changed)
        out: list[Event] = []
        if changed or force:
            out.append(self.current)
        for name in changed:
            rule = self._rules[name]
            if rule.state != "unknown" and name in self._told:
                self._told.discard(name)
                if rule.state == "alarm":
                    continue
            if rule.state == "alarm":
                where = f"{self.label}: " if self.label else ""
                out.append(NoticeEvent("warning", f"{where}health: {TITLES[name]}: {rule.message}", t=t))
        return out

    def _event(self, t: float, changed: list[str] | None = None) -> HealthEvent:
        rules = [self._rules[name] for name in RULES]
        return HealthEvent(verdict=verdict(rules), rules=rules, changed=list(changed or []), t=t)

    def _sticky(self, name: str) -> float:
        return HYSTERESIS if self._rules[name].state == "alarm" else 1.0

    def _collapse(self) -> HealthRule:
        th, readings = self.th, list(self.readings)
        if len(readings) < th.recent:
            return HealthRule("acceptance_collapse", "unknown", "no drafts yet" if not readings else
                              f"{len(readings)} of {th.recent} readings with drafts")
        recent = _sum(readings[-th.recent:]).acceptance_length
        assert recent is not None  # each has MIN_DRAFTS
        earlier = [r.acceptance_length for r in _earlier(readings[:-th.recent], "collapse_alarm", th.min_history)
                   if r.acceptance_length is not None]
        if th.collapse_floor > 0 and recent < th.collapse_floor:
            return HealthRule("acceptance_collapse", "alarm", f"acceptance length {recent:.2f}, below the floor "
                              f"{th.collapse_floor:g}", recent, th.collapse_floor)
        if len(earlier) < th.min_history:
            return HealthRule("acceptance_collapse", "unknown", f"acceptance length {recent:.2f}; median after "
                              f"{th.min_history} readings ({len(earlier)} so far)", recent, None)
        median = _median(earlier)
        state = "alarm" if recent < th.collapse_ratio * median * self._sticky("acceptance_collapse") else "ok"
        return HealthRule("acceptance_collapse", state, f"acceptance length {recent:.2f}, median {median:.2f} "
                          f"over {len(earlier)} readings", recent, median)

    def _repetition(self) -> HealthRule:
        th = self.th
        if not self.readings and self._repeat_start is None:
            return HealthRule("acceptance_repetition", "unknown", "no drafts yet")
        if self._repeat_start is None:
            last = self.readings[-1] if self.readings else None
            rate = last.accepted / last.draft_tokens if last and last.draft_tokens else None
            text = f"acceptance {rate:.0%} lately" if rate is not None else "no drafts lately"
            return HealthRule("acceptance_repetition", "ok", text, rate, th.repeat_acceptance)
        seconds = self._decode_time - self._repeat_start
        rate = self._repeat_accepted / self._repeat_drafted if self._repeat_drafted else 1.0
        state = "alarm" if seconds >= th.repeat_seconds else "ok"
        return HealthRule("acceptance_repetition", state, f"acceptance {rate:.1%} for {seconds:.0f} s "
                          f"({self._repeat_accepted} of {self._repeat_drafted} draft tokens)", rate,
                          th.repeat_acceptance)

    def _stall(self) -> HealthRule:
        th, rated = self.th, list(self.rated)
        if len(rated) < th.recent + th.min_history:
            return HealthRule("decode_stall", "unknown", f"median after {th.recent + th.min_history} readings while "
                              f"running ({len(rated)} so far)")
        recent = _sum(rated[-th.recent:])
        rate = recent.rate or 0.0
        earlier = [r.rate for r in _earlier(rated[:-th.recent], "stall_alarm", th.min_history) if r.rate is not None]
        median = _median(earlier)
        state = "alarm" if rate < th.stall_ratio * median * self._sticky("decode_stall") else "ok"
        return HealthRule("decode_stall", state, f"decode {_g(rate)} tok/s over {recent.seconds:.0f} s, median "
                          f"{_g(median)} over {len(earlier)} readings", rate, median)

    def plain_tokens_per_s(self) -> float | None:
        """Plain decoding here (specdash/monitor/plain_rate.py, as the dashboard's reference), once
        `plain_steps` K=0 steps were measured."""
        return self._plain.tokens_per_s() if len(self._plain) >= self.th.plain_steps else None

    def _not_paying(self) -> HealthRule:
        th = self.th
        if not self._knows_plain():
            return HealthRule("speculation_not_paying", "unknown", "no plain rate: the source runs no plain steps")
        plain = self.plain_tokens_per_s()
        if plain is None:
            return HealthRule("speculation_not_paying", "unknown",
                              f"plain rate after {th.plain_steps} K=0 steps ({len(self._plain)} so far)")
        if len(self.spec) < th.recent:
            return HealthRule("speculation_not_paying", "unknown", f"plain {_g(plain)} tok/s; "
                              f"{len(self.spec)} of {th.recent} readings drafting", None, plain)
        recent = _sum(self.spec)
        rate = recent.spec_tokens / recent.spec_seconds
        state = "alarm" if rate < th.not_paying_ratio * plain * self._sticky("speculation_not_paying") else "ok"
        return HealthRule("speculation_not_paying", state, f"{_g(rate)} tok/s drafting, plain {_g(plain)} tok/s "
                          f"({rate / plain:.2f}x) over {recent.spec_seconds:.0f} s", rate, plain)


def _earlier(readings: list[Reading], alarm: str, enough: int) -> list[Reading]:
    """The readings a median is taken over: those taken while the rule was not in alarm, so
    a drop that lasts does not become the norm at once; all of them once the history holds
    fewer than `enough` others (a drop that lasted `history` readings is the norm now)."""
    calm = [r for r in readings if not getattr(r, alarm)]
    return calm if len(calm) >= enough else readings


def _what_is_judged(s: SettingsEvent) -> tuple[object, ...]:
    """The settings a history belongs to: a change of any starts the medians over."""
    return (s.target, s.drafter, s.draft, s.k, s.adaptive, s.temperature)


def verdict(rules: Iterable[HealthRule]) -> str:
    """One word: the most serious alarm, else healthy when a rule could judge, else unknown."""
    rules = list(rules)
    firing = {rule.name for rule in rules if rule.state == "alarm"}
    for name in SEVERITY:
        if name in firing:
            return VERDICT_OF[name]
    return "healthy" if any(rule.state == "ok" for rule in rules) else "unknown"


def alarms(ev: HealthEvent) -> list[str]:
    """The firing rules as lines: 'acceptance collapse: acceptance length 1.30, median ...'."""
    return [f"{TITLES.get(rule.name, rule.name)}: {rule.message}" for rule in ev.rules if rule.state == "alarm"]


def is_alarm(word: str) -> bool:
    return word in ALARMS


def in_order(ev: Event, judged: list[Event]) -> list[Event]:
    """`ev` and what the monitor made of it, in the order to emit them: after the event
    judged, but before a Summary (it stays the last line of its request: `run --json`,
    drive mode and `specdash compare` read it as the end)."""
    return [*judged, ev] if isinstance(ev, Summary) else [ev, *judged]


@dataclass
class Monitored:
    """An emit function that also emits what a HealthMonitor makes of each event; several
    threads may call it (a server's poller and its drive-mode thread)."""

    emit: Callable[[Event], None]
    monitor: HealthMonitor
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, ev: Event) -> None:
        with self._lock:
            for out in in_order(ev, self.monitor.feed(ev)):
                self.emit(out)


def monitored(emit: Callable[[Event], None], thresholds: HealthThresholds | None = None, *,
              label: str = "") -> Monitored:
    """`emit`, with each event's health verdicts emitted after it."""
    return Monitored(emit, HealthMonitor(thresholds, label=label))
