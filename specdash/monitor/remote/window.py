"""Counter deltas over a sliding window of wall time.

Each poll's totals are turned into a `Delta` against the previous poll; the window keeps
the deltas of the last `seconds` and sums them. A counter that went down means the
server restarted (or the counter was reset): that poll is a *reset*, its delta is the
new value itself (the counter restarted from zero), it is counted, and nothing ever
becomes a negative rate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from specdash.monitor.remote.backends import Counters
from specdash.monitor.remote.metrics import MAX_READING, histogram_quantile


@dataclass(slots=True)
class Delta:
    """What happened between two polls."""

    seconds: float
    tokens: int = 0
    prompt_tokens: int = 0
    steps: int | None = None
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    per_pos: list[int] = field(default_factory=list)
    histograms: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # cumulative bucket deltas
    reset: bool = False


def _d(now: float, before: float, reset: bool) -> int:
    return int(round(now if reset else max(0.0, now - before)))


def _hist_delta(now: list[tuple[float, float]], before: list[tuple[float, float]] | None,
                reset: bool) -> list[tuple[float, float]]:
    if reset or not before:
        return list(now)
    prev = dict(before)
    return [(le, max(0.0, count - prev.get(le, 0.0))) for le, count in now]


def _sum_hist(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    acc = dict(a)
    for le, count in b:
        acc[le] = acc.get(le, 0.0) + count
    return sorted(acc.items())


def _pad_add(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def is_reset(before: Counters, now: Counters, marker_before: float | None = None,
             marker_now: float | None = None) -> bool:
    """A server counter went down, a per-position series went down or vanished, or the
    process's start marker changed."""
    if marker_before is not None and marker_now is not None and marker_now != marker_before:
        return True
    for key, value in now.raw.items():
        if key in before.raw and value < before.raw[key]:
            return True
    if len(now.per_pos) < len(before.per_pos) and any(before.per_pos[len(now.per_pos):]):
        return True
    return any(n < b for n, b in zip(now.per_pos, before.per_pos))


def impossible(before: Counters | None, now: Counters, reset: bool) -> str | None:
    """Counts no server can report, or None: more tokens accepted than drafted, in total
    or (between two polls without a reset) in growth. Such a poll is a bad reading: the
    window never takes it, so no rate above 100% is ever shown."""
    # Each sample is 0..2^53 (ServerWatch.poll); series summed over labels (engines, or a
    # series repeated) can still pass it.
    sums = [now.tokens, now.prompt_tokens, now.steps or 0.0, now.num_drafts, now.num_draft_tokens,
            now.num_accepted_tokens, *now.per_pos, *(c for buckets in now.histograms.values() for _, c in buckets)]
    if any(not value <= MAX_READING for value in sums):
        return "a count beyond 2^53 once its series are summed"
    if now.num_accepted_tokens > now.num_draft_tokens:
        return (f"{now.num_accepted_tokens:.0f} draft tokens accepted but {now.num_draft_tokens:.0f} drafted")
    if before is not None and not reset:
        grew_acc = now.num_accepted_tokens - before.num_accepted_tokens
        grew_drafted = now.num_draft_tokens - before.num_draft_tokens
        if grew_acc > max(grew_drafted, 0.0):
            return (f"accepted draft tokens rose by {grew_acc:.0f} while drafted ones rose by "
                    f"{max(grew_drafted, 0.0):.0f}")
    return None


class CounterWindow:
    """Deltas of the last `seconds` of polls. `add` each poll's totals; read sums/rates."""

    def __init__(self, seconds: float = 10.0):
        self.seconds = seconds
        self.resets = 0
        self._last: Counters | None = None
        self._last_t: float | None = None
        self._last_marker: float | None = None
        self._deltas: deque[tuple[float, Delta]] = deque()
        self._total: Delta | None = None  # total() of the current deltas, computed once

    def clear(self) -> None:
        """Forget the baseline (a different model behind the same URL, say); keep resets."""
        self._last = None
        self._last_t = None
        self._last_marker = None
        self._deltas.clear()
        self._total = None

    def check(self, now: Counters, marker: float | None = None) -> str | None:
        """Why this poll's totals cannot be true (see `impossible`), or None; adds nothing."""
        reset = self._last is not None and is_reset(self._last, now, self._last_marker, marker)
        return impossible(self._last, now, reset)

    def add(self, t: float, now: Counters, marker: float | None = None) -> Delta | None:
        """This poll's totals at time `t` (seconds, monotonic). Returns the delta since the
        previous poll, or None for the first poll (a baseline has no delta)."""
        before, before_t = self._last, self._last_t
        reset = before is not None and is_reset(before, now, self._last_marker, marker)
        self._last, self._last_t = now, t
        if marker is not None:
            self._last_marker = marker
        if before is None or before_t is None:
            return None
        if reset:
            self.resets += 1
        delta = Delta(
            seconds=max(0.0, t - before_t),
            tokens=_d(now.tokens, before.tokens, reset),
            prompt_tokens=_d(now.prompt_tokens, before.prompt_tokens, reset),
            steps=None if now.steps is None else _d(now.steps, before.steps or 0.0, reset or before.steps is None),
            num_drafts=_d(now.num_drafts, before.num_drafts, reset),
            num_draft_tokens=_d(now.num_draft_tokens, before.num_draft_tokens, reset),
            num_accepted_tokens=_d(now.num_accepted_tokens, before.num_accepted_tokens, reset),
            per_pos=[_d(v, before.per_pos[i] if i < len(before.per_pos) else 0.0, reset)
                     for i, v in enumerate(now.per_pos)],
            histograms={name: _hist_delta(buckets, before.histograms.get(name), reset)
                        for name, buckets in now.histograms.items()},
            reset=reset,
        )
        self._deltas.append((t, delta))
        self._total = None
        # Keep the polls whose whole interval lies within the last `seconds` (at least one).
        while len(self._deltas) > 1 and self._deltas[0][0] - self._deltas[0][1].seconds < t - self.seconds - 1e-9:
            self._deltas.popleft()
        return delta

    def total(self) -> Delta | None:
        """The window's deltas summed (None before the second poll). Do not mutate it."""
        if self._total is None:
            self._total = self._sum()
        return self._total

    def _sum(self) -> Delta | None:
        if not self._deltas:
            return None
        out = Delta(seconds=0.0)
        steps_known = True
        for _, d in self._deltas:
            out.seconds += d.seconds
            out.tokens += d.tokens
            out.prompt_tokens += d.prompt_tokens
            if d.steps is None:
                steps_known = False
            else:
                out.steps = (out.steps or 0) + d.steps
            out.num_drafts += d.num_drafts
            out.num_draft_tokens += d.num_draft_tokens
            out.num_accepted_tokens += d.num_accepted_tokens
            out.per_pos = _pad_add(out.per_pos, d.per_pos)
            for name, buckets in d.histograms.items():
                out.histograms[name] = _sum_hist(out.histograms.get(name, []), buckets)
            out.reset = out.reset or d.reset
        if not steps_known:
            out.steps = None
        return out

    # --- figures over the window (None when unknown) ---

    def rate(self, attr: str) -> float | None:
        tot = self.total()
        if tot is None or tot.seconds <= 0:
            return None
        value = getattr(tot, attr)
        if value is None:
            return None
        rate: float = value / tot.seconds
        return rate if math.isfinite(rate) else None  # polls a denormal interval apart

    def quantile(self, name: str, q: float) -> float | None:
        tot = self.total()
        if tot is None:
            return None
        return histogram_quantile(q, tot.histograms.get(name, []))


def acceptance_rate(accepted: float, drafted: float) -> float | None:
    """accepted / drafted tokens (llama.cpp's definition); None when nothing was drafted."""
    return accepted / drafted if drafted > 0 else None


def mean_accepted_length(accepted: float, drafts: float) -> float | None:
    """1 + accepted / drafts (vLLM's definition); None when there were no drafts."""
    return 1.0 + accepted / drafts if drafts > 0 else None
