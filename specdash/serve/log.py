"""`serve --headless`: what the dashboard would show, as log lines on stderr.

One line per state change, notice and finished request, with the request's own numbers
(tokens, tok/s, drafted and accepted), so a service's journal says what speculation did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from specdash.contract import events as E


class EventLog:
    def __init__(self, out: TextIO, progress: Callable[[str, float | None], None] | None = None):
        self._out = out
        self._progress = progress
        self._title = ""

    def _say(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=self._out, flush=True)

    def feed(self, ev: E.Event) -> None:
        match ev:
            case E.StatusEvent(state="loading", fraction=fraction) if fraction is not None and self._progress:
                self._progress(ev.message, fraction)
            case E.StatusEvent(state=state) if state in ("ready", "error", "ended") or (state == "loading" and ev.message):
                self._say(f"{state}" + (f": {ev.message}" if ev.message else ""))
            case E.NoticeEvent():
                self._say(f"{ev.level}: {ev.message}")
            case E.PromptEvent():
                self._title = ev.title
            case E.Summary():
                acc = "" if not ev.num_draft_tokens else \
                    f", drafted {ev.num_draft_tokens}, accepted {ev.num_accepted_tokens}"
                # In a batch (serve --parallel) the request names itself: its tag is its title.
                self._say(f"{ev.request or self._title}: {ev.n_prompt} prompt tokens, {ev.n_generated} generated at "
                          f"{ev.tokens_per_s:.1f} tok/s ({ev.stop_reason}{acc})")
            case E.QueueEvent() if ev.waiting:
                self._say(f"queue: {len(ev.running)} running, {len(ev.waiting)} waiting")
