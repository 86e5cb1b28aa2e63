"""What the dashboard's charts show, folded from engine events. No Textual import.

Everything here is a function of the events alone (their `t` stamps included), never of
when the UI happened to receive them: a replayed recording therefore draws the same
charts every time, which is what the snapshot tests rely on.

Time axis: "decode time" — the wall time between consecutive steps of a run. Prefill,
pauses and the gap after a settings change (a draft model loading) are left out, so a
pause does not draw a flat line and a reload does not look like a slow step.

One rule for tok/s, wherever it shows (status line, chart title, chart): the last
`rate_window_s` of decoding (the chart: over its last whole bins). Time with nothing decoding is not decode time: after a
request ends (between prompts, paused, or a server's polls that generated nothing) the
numbers hold the last request's, and `idle` says so.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from specdash.engine.stats import SpecCounters
from specdash.contract.events import CountersEvent, Event, PrefillEvent, SettingsEvent, StepEvent, Summary
from specdash.monitor.plain_rate import PlainRate

# Settings whose change is a hot-swap worth a marker on the time charts, with the short
# label the marker carries.
MARKED = {"k": "K", "draft": "draft", "temperature": "T", "adaptive": "adaptive", "experts": "experts", "draft_p_joint": "cut"}


@dataclass(slots=True)
class Bin:
    """One column of the time charts: the steps of `bin_seconds` of decode time."""

    seconds: float = 0.0
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    k: int = 0  # K of the bin's last step
    t_end: float = 0.0  # decode time (seconds since the session's first step) when it closed

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass(slots=True)
class Timeline:
    xs: list[float]  # decode time at each bin's end
    acceptance: list[float | None]
    tokens_per_s: list[float | None]
    k: list[float]
    markers: list[tuple[float, str]]
    x_min: float
    x_max: float


class LiveStats:
    def __init__(
        self,
        bin_seconds: float = 0.5,
        history_bins: int = 400,
        rate_window_s: float = 2.0,
        recent_steps: int = 128,
        plain_steps: int = 32,
    ):
        self.bin_seconds = bin_seconds
        self.rate_window_s = rate_window_s
        self.bins: deque[Bin] = deque(maxlen=history_bins)
        self._open = Bin()
        self.total = SpecCounters()  # the whole session, every prompt
        self.run = SpecCounters()  # the current prompt
        self.recent: deque[StepEvent | CountersEvent] = deque(maxlen=recent_steps)
        self._recent_dt: deque[tuple[float, int]] = deque()  # (decode seconds, tokens)
        self._recent_dt_sum = 0.0
        self._plain = PlainRate(plain_steps)  # the one estimator health's rule reads too
        self._run_dt, self._run_tokens = 0.0, 0  # this prompt's steady-state steps (tokens_per_s)
        self._prev_t: float | None = None
        self.settings: SettingsEvent | None = None
        self.last_step: StepEvent | None = None
        self.last_summary: Summary | None = None
        self.last_prefill: PrefillEvent | None = None
        self.decode_time = 0.0  # seconds of decode time so far: the time charts' x axis
        # Hot-swaps, (decode time, short label): vertical markers on the time charts.
        self.markers: deque[tuple[float, str]] = deque(maxlen=200)
        self.idle = False  # nothing decodes now: the rates are the last request's

    # --- feeding ---------------------------------------------------------------------
    def feed(self, ev: Event) -> None:
        self._plain.feed(ev)
        match ev:
            case StepEvent():
                self._step(ev)
            case CountersEvent():
                self._counters(ev)
            case SettingsEvent():
                self._mark(self.settings, ev)
                self.settings = ev
                self.drafter = ev.drafter
                self._prev_t = None
            case PrefillEvent():
                self.last_prefill = ev
                self.run = SpecCounters()
                self._prev_t = None
            case Summary():
                self.last_summary = ev
                self._prev_t = None
                self.idle = True

    def _mark(self, old: SettingsEvent | None, new: SettingsEvent) -> None:
        """A marker for each hot-swap: a change of K, drafter, temperature, adaptive or
        experts between two snapshots (not the first snapshot, not a pause)."""
        if old is None:
            return
        for name, label in MARKED.items():
            before, after = getattr(old, name), getattr(new, name)
            if before != after:
                if name == "adaptive":
                    text = f"adaptive {'on' if after else 'off'}"
                elif name == "draft":
                    text = new.drafter
                else:
                    text = f"{label}={after:g}" if isinstance(after, float) else f"{label}={after}"
                self.markers.append((self.decode_time, text))

    def _counters(self, ev: CountersEvent) -> None:
        """A remote source's poll: one bin's worth of steps at once. A poll in which
        nothing was generated is not decode time (the server idles between requests):
        it enters neither the rates nor the charts, which keep the last request's."""
        self.total.add_counters(ev)
        self.run.add_counters(ev)
        self.idle = ev.tokens == 0
        if self.idle and not ev.num_draft_tokens:
            return
        # (llama-server moves its draft counters when a request ends, possibly in a poll
        # that generated nothing more: those count for acceptance, with no time.)
        self.recent.append(ev)
        self._add(0.0 if self.idle else ev.seconds, ev.tokens, ev.steps, ev.num_draft_tokens, ev.num_accepted_tokens,
                  ev.k if ev.k is not None else self._open.k)

    def _step(self, ev: StepEvent) -> None:
        # The first step after a prefill, a pause or a settings change has no predecessor
        # in the same stretch of decoding: its own measured cost stands in.
        prev = self._prev_t
        first_of_stretch = prev is None
        dt = ev.step_ms / 1e3 if prev is None else max(ev.t - prev, 0.0)
        self._prev_t = ev.t
        n = len(ev.tokens)
        run_ended = self.idle and self.last_summary is not None  # this step starts the next run
        self.total.add(ev)
        self.run.add(ev)
        self.recent.append(ev)
        self.last_step = ev
        self.idle = False

        if run_ended:  # kept until now: while the next prompt prefills, the last run shows
            self._run_dt, self._run_tokens = 0.0, 0
        if not first_of_stretch:
            self._run_dt += dt
            self._run_tokens += n

        self._add(dt, n, 1, ev.drafted, ev.accepted, ev.k)

    def _add(self, dt: float, tokens: int, steps: int, drafted: int, accepted: int, k: int) -> None:
        self._recent_dt.append((dt, tokens))
        self._recent_dt_sum += dt
        while len(self._recent_dt) > 1 and self._recent_dt_sum - self._recent_dt[0][0] >= self.rate_window_s:
            self._recent_dt_sum -= self._recent_dt.popleft()[0]
        self.decode_time += dt
        b = self._open
        b.seconds += dt
        b.tokens += tokens
        b.steps += steps
        b.drafted += drafted
        b.accepted += accepted
        b.k = k
        if b.seconds >= self.bin_seconds:
            b.t_end = self.decode_time
            self.bins.append(b)
            self._open = Bin()

    # --- what the panels read ----------------------------------------------------------
    @property
    def tokens_per_s(self) -> float | None:
        """Decode tok/s over the last `rate_window_s` seconds of decode time; while idle
        after a run that reported its Summary, that whole run's, timed as the plain
        reference is (without the first step of each stretch, which carries warm-up). The
        last seconds of a short run can hold its one probe of a draft and read a loss the
        run as a whole did not have."""
        if self.idle and self.last_summary is not None and self._run_dt > 0:
            return self._run_tokens / self._run_dt
        tokens = sum(n for _, n in self._recent_dt)
        return tokens / self._recent_dt_sum if self._recent_dt_sum > 0 else None

    @property
    def plain_tokens_per_s(self) -> float | None:
        """Plain-decoding speed measured on this machine (specdash/monitor/plain_rate.py), over the
        last `plain_steps` steps that ran at K=0 without a draft."""
        return self._plain.tokens_per_s()

    def recent_counters(self) -> SpecCounters:
        """SpecCounters over the last `recent_steps` steps: what speculation does now, not
        averaged with minutes-old settings."""
        counters = SpecCounters()
        for ev in self.recent:
            if isinstance(ev, StepEvent):
                counters.add(ev)
            else:
                counters.add_counters(ev)
        return counters

    def series(self, n: int) -> list[Bin]:
        """The last `n` completed bins, oldest first. The bin still filling is left out:
        a chart then changes once per bin, not on every redraw, which keeps the UI's
        CPU share down at the cost of at most `bin_seconds` of lag."""
        bins = list(self.bins)
        return bins[-n:] if n > 0 else []

    def timeline(self, window: float) -> Timeline:
        """The time charts' data over the last `window` seconds of decode time: per
        completed bin its end time, acceptance and tok/s (smoothed like smoothed()) and
        K; plus the hot-swap markers inside the window."""
        start = self.decode_time - window
        span = max(round(self.rate_window_s / self.bin_seconds), 1)
        bins = list(self.bins)
        first = next((i for i, b in enumerate(bins) if b.t_end >= start), len(bins))
        xs, acc, tps, ks = [], [], [], []
        for i in range(first, len(bins)):
            window_bins = bins[max(i - span + 1, 0): i + 1]
            drafted = sum(b.drafted for b in window_bins)
            seconds = sum(b.seconds for b in window_bins)
            xs.append(bins[i].t_end)
            acc.append(sum(b.accepted for b in window_bins) / drafted if drafted else None)
            tps.append(sum(b.tokens for b in window_bins) / seconds if seconds > 0 else None)
            ks.append(float(bins[i].k))
        markers = [(t, label) for t, label in self.markers if t >= start]
        return Timeline(xs, acc, tps, ks, markers, max(start, 0.0), max(self.decode_time, window))

    def smoothed(self, n: int) -> list[tuple[float | None, float | None]]:
        """(acceptance, tok/s) for the last `n` bins, each over the trailing
        `rate_window_s` of decode time — the same window as the headline numbers, so a
        step of a few hundred ms does not turn the chart into 0/1 noise."""
        span = max(round(self.rate_window_s / self.bin_seconds), 1)
        bins = self.series(n + span - 1)
        out = []
        for i in range(max(len(bins) - n, 0), len(bins)):
            window = bins[max(i - span + 1, 0) : i + 1]
            drafted = sum(b.drafted for b in window)
            accepted = sum(b.accepted for b in window)
            seconds = sum(b.seconds for b in window)
            tokens = sum(b.tokens for b in window)
            out.append((accepted / drafted if drafted else None, tokens / seconds if seconds > 0 else None))
        return out
