"""Which copy sources are asked this step: a source that keeps finding nothing is asked
less often, at a rate set by what asking it costs on this machine.

A copy source (lookup, suffix) is "free" only next to a target step: asking it runs
Python over the sequence (lookup's n-gram votes, suffix's anchor hashes across every
remembered answer) and adaptive K then prices what it offered. Where nothing copies
that time is pure loss against plain decoding, paid every step. So each source's asks
are timed (the propose and the pricing of its offer, Python included), and after N asks
in a row that found nothing worth verifying it is asked only every M steps:

    N = ask_patience * s(1) / ask_ms     (misses may spend half a plain step, in all)
    M = ask_ms / (ask_share * s(1))      (backed off, asks cost 1% of plain's time)

both within bounds (ControllerSettings). A cheap source is thus never backed off (lookup
at 0.1 ms of a 36 ms step: N = 180, M = 1), a dear one soon and far. An ask that finds a
copy worth verifying, or a new kind of text (the content label), asks every step again.

A source not asked still sees the step (propose(tokens, 0): it indexes what was
committed), so asking it later costs nothing extra. One AskBackoff per request: a request
with nothing to copy pays for its own asks only (the batch keeps one per slot).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from specdash.engine.controller_settings import ControllerSettings
from specdash.engine.target_costs import Ema


@dataclass(slots=True)
class _Asks:
    cost: Ema  # ms per ask
    misses: int = 0  # asks in a row that found nothing worth verifying
    waited: int = 0  # steps since it was last asked


class AskBackoff:
    def __init__(self, settings: ControllerSettings | None = None, replayed: Iterable[float] | None = None) -> None:
        """`replayed`: the ms of each ask a real run made, in order, used instead of this
        process's timings (whatif replaying an engine run decides as the engine did)."""
        self.settings = settings or ControllerSettings()
        self._replayed: Iterator[float] | None = iter(replayed) if replayed is not None else None
        self._sources: dict[str, _Asks] = {}
        self._content: str | None = None
        self._plain_ms = 0.0

    def step(self, content: str, plain_ms: float) -> None:
        """A new step: its content label and plain decoding's ms per token (0: unknown)."""
        if content != self._content:
            self._content = content
            for asks in self._sources.values():
                asks.misses = 0  # new kind of text: every source gets a fresh look
        self._plain_ms = plain_ms

    def _get(self, source: str) -> _Asks:
        asks = self._sources.get(source)
        if asks is None:
            asks = self._sources[source] = _Asks(Ema())
        return asks

    def patience(self, source: str) -> int:
        """N: asks in a row that may find nothing before `source` is asked less often."""
        asks, s = self._get(source), self.settings
        if not asks.cost.count or not self._plain_ms or asks.cost.value <= 0:
            return 1 << 30
        return max(1, int(s.ask_patience * self._plain_ms / asks.cost.value))

    def every(self, source: str) -> int:
        """M: steps between asks once backed off."""
        asks, s = self._get(source), self.settings
        if not asks.cost.count or not self._plain_ms:
            return 1
        return min(max(1, math.ceil(asks.cost.value / (s.ask_share * self._plain_ms))), s.ask_every_max)

    def due(self, source: str) -> bool:
        """Whether to ask `source` this step (if not, call skipped)."""
        asks = self._get(source)
        return asks.misses < self.patience(source) or asks.waited + 1 >= self.every(source)

    def skipped(self, source: str) -> None:
        self._get(source).waited += 1

    def ask_now(self, source: str) -> bool:
        """due(), and a step not asked counted as waited."""
        if self.due(source):
            return True
        self.skipped(source)
        return False

    def asked(self, source: str, ms: float, found: bool) -> None:
        """`source` was asked, for `ms` (propose and pricing), and found a copy worth
        verifying or not."""
        asks, s = self._get(source), self.settings
        if self._replayed is not None:
            ms = next(self._replayed, ms)
        asks.cost.add(ms, s.beta, s.ema_clip)
        asks.waited = 0
        asks.misses = 0 if found else asks.misses + 1

    def backed_off(self) -> list[str]:
        """The sources asked less often now, for the reason line."""
        return [name for name, asks in self._sources.items() if asks.misses >= self.patience(name)]

    def why(self) -> str:
        """A clause for the step's reason: which sources wait, every how many steps."""
        off = self.backed_off()
        if not off:
            return ""
        return "; " + ", ".join(f"{name} asked every {self.every(name)} steps "
                                f"({self._sources[name].misses} found nothing)" for name in off)
