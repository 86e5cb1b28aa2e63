"""Stop strings over streamed text: what may be sent now, and where the text ends.

Text that could still become a stop string is held back until it resolves (mlx-lm's
server does the same): a client never receives the start of a stop string it asked not
to see. The stop string itself is never sent.
"""

from __future__ import annotations


class StopText:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._held = ""  # text received, not sent yet
        self.stopped = False  # a stop string was found: nothing more is sent

    def feed(self, text: str) -> str:
        """Take newly generated text; return what may be sent now."""
        if self.stopped:
            return ""
        held = self._held + text
        if not self.stops:
            self._held = ""
            return held
        first = min((i for i in (held.find(s) for s in self.stops) if i >= 0), default=-1)
        if first >= 0:
            self.stopped = True
            self._held = ""
            return held[:first]
        keep = self._tail(held)
        self._held = held[len(held) - keep:] if keep else ""
        return held[: len(held) - keep]

    def _tail(self, text: str) -> int:
        """The length of the longest suffix of `text` that begins some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        """At the end of generation: what was held back is text after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
