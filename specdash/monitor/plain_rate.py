"""Plain decoding's speed on this machine, measured from the K=0 steps a run makes (the
engine's calibration steps, or an operator's K=0).

One estimator, fed the same events, for both places that show it: the dashboard's plain
reference line (tui/live_stats.py) and the health rule "speculation not paying"
(health.py). Two had grown apart and read 51.7 and 94.1 tok/s on the same screen.
"""

from __future__ import annotations

from collections import deque

from specdash.contract.events import Event, PrefillEvent, PromptEvent, SettingsEvent, StatusEvent, StepEvent, Summary

PLAIN_KEEP = 32  # the K=0 steps the rate is measured over


class PlainRate:
    def __init__(self, keep: int = PLAIN_KEEP):
        self._per_token: deque[float] = deque(maxlen=keep)  # seconds per token, steady K=0 steps
        self._prev_t: float | None = None
        self._settings: SettingsEvent | None = None

    def feed(self, ev: Event) -> None:
        match ev:
            case StepEvent():
                # The first step of a stretch (after a prefill, a pause, a settings change)
                # has no predecessor to be timed from; it also carries the warm-up.
                prev, self._prev_t = self._prev_t, ev.t
                if ev.batch > 1:  # one of several requests' steps in one batch: not one stream's
                    self._prev_t = None
                    return
                n = len(ev.tokens)
                if prev is not None and ev.k == 0 and ev.drafted == 0 and n and self.knows_plain():
                    self._per_token.append(max(ev.t - prev, 0.0) / n)
            case SettingsEvent():
                before, self._settings = self._settings, ev
                if before is not None and (before.target, before.experts_active) != (ev.target, ev.experts_active):
                    self._per_token.clear()  # another model: its plain speed is another
                self._prev_t = None
            case PromptEvent() | PrefillEvent() | Summary():
                self._prev_t = None
            case StatusEvent(state=state) if state != "running":
                self._prev_t = None

    def knows_plain(self) -> bool:
        """Only the embedded engine's K=0 steps are plain decoding: a server's steps
        without drafts are not (it may speculate where we cannot see)."""
        return self._settings is None or self._settings.source == "engine"

    def __len__(self) -> int:
        return len(self._per_token)

    def tokens_per_s(self) -> float | None:
        """Tokens over time of the kept K=0 steps, leaving out steps over twice the median
        (the first steps of a process fault the mmapped weights in and can be 10x slower).
        Not the median itself: step times skew slow on a busy host, and a plain run's
        tok/s (a mean) then read 0.90-0.98x of it."""
        if not self._per_token:
            return None
        ordered = sorted(self._per_token)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        kept = [x for x in ordered if x <= 2 * median]
        mean = sum(kept) / len(kept)
        return 1.0 / mean if mean > 0 else None
