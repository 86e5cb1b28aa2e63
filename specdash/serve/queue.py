"""The serve queue: requests first in, first out, kept across engine restarts.

It is the embedded source's prompt queue (sources/embedded.PromptQueue), with what a
server needs on top: it never runs the built-in workload, a new request never cuts off
the one in flight, and it outlives the source. The dashboard's `r` builds a new source
with a new prompt queue; `adopt` takes that queue's typed prompts into this one and
reopens it, so requests that waited through a restart run after it. The source asks
`waiting()` and emits what it says as a QueueEvent (the status line, the requests
screen, `num_requests_waiting`).
"""

from __future__ import annotations

from collections import deque

from specdash.serve.request import ServedRequest
from specdash.sources.embedded import SERVER_TURNS, PromptQueue, WorkItem


class ServeQueue(PromptQueue):
    turns = SERVER_TURNS  # each request waits its turn; the queue is reported and outlives a restart

    def submit(self, request: ServedRequest) -> None:
        self.push(WorkItem(request.title, request.text, request.max_tokens, request=request))

    def drop(self, request: ServedRequest) -> bool:
        """Take a waiting request out of the line (its client left): True if it waited."""
        with self._cond:
            kept = deque(item for item in self._typed if item.request is not request)
            dropped = len(kept) != len(self._typed)
            self._typed = kept
        if dropped:
            self.on_change()
        return dropped

    def adopt(self, other: PromptQueue) -> ServeQueue:
        """This queue, reopened, with `other`'s waiting prompts (typed with `n`) at its end."""
        with self._cond:
            self._closed = False
        if other is not self:
            while (item := other.pop_nowait()) is not None:
                self.push(item)
        return self

    def cancel_all(self) -> tuple[int, int]:
        """Cancel the request running and every one waiting (the server is leaving):
        (running, waiting) cancelled. Their clients are told why."""
        counts = [0, 0]
        running = [(0, item) for item in (self.batch or (self.running,))]
        for n, item in (*running, *((1, w) for w in self.waiting())):
            request = item.request if item is not None else None
            if isinstance(request, ServedRequest) and request.state in ("waiting", "running"):
                request.cancel()
                request.fail("the server stopped before this request finished")
                counts[n] += 1
        return counts[0], counts[1]
