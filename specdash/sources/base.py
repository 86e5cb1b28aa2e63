"""What every source implements, and the outbox that carries its events to a consumer.

No Textual here: a source runs in its own thread(s) and hands events to `emit`; the
dashboard passes an Outbox whose `ping` posts one coalesced message to the UI, `run`
passes a function that prints JSON lines.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from specdash.contract.events import Command, Event, NoticeEvent, PrefillEvent, SettingsEvent, StatusEvent, Summary


@dataclass(frozen=True, slots=True)
class Preset:
    """One model a server offers as a draft source (a llama-server router's --models-preset
    section or cached model), for the dashboard's `d` picker."""

    id: str
    status: str  # loaded | loading | unloaded | sleeping | downloading | failed
    active: bool = False


# Where the machine telemetry shown with a source comes from: "local", the source runs
# here and the dashboard samples this machine; "recorded", its events carry a recorded
# machine's when the recording has any; "none", none ever comes (a server sends none).
Telemetry = Literal["local", "recorded", "none"]


class Source(Protocol):
    """What the dashboard, `run` and the recorder know of a source; they never test its
    class or decide by its kind. What it can do is data: `supports` until its first
    SettingsEvent, then that event's `supports` (see commands_registry); `telemetry`."""

    kind: str  # what it is, as shown and saved (screenshots): "engine" | "remote" | "replay"
    label: str  # what the title bar shows: a model path, a URL, a recording file
    telemetry: Telemetry  # declared before any event: a server down from the start sends none
    @property
    def supports(self) -> frozenset[str]:
        """The commands it can take at most, by registry name, before its first settings event."""
        ...

    @property
    def thread(self) -> threading.Thread | None:
        """The thread doing its work in this process, when one does (CPU accounting)."""
        ...

    def presets(self) -> list[Preset]:
        """The draft sources a server offers by name (a llama-server router); [] for others."""
        ...

    def start(self, emit: Callable[[Event], None]) -> None:
        """Begin producing events (in the source's own thread(s)); return at once."""
        ...

    def send(self, cmd: Command) -> None:
        """Thread-safe. A command the source cannot honour is refused with a NoticeEvent
        and leaves its settings as they were."""
        ...

    def close(self) -> None:
        """Stop producing events within about one step or poll; idempotent."""
        ...


# Rare events go out at once (a refused command, a pause, the end of a prompt); steps
# and counters ride along with the next timed flush.
URGENT = (NoticeEvent, SettingsEvent, PrefillEvent, Summary, StatusEvent)


class Outbox:
    """A thread-safe queue of events plus a rate-limited `ping` telling the consumer to
    drain it: at most one ping per `flush_interval` while steps stream, at once for
    urgent events. So a source never waits for the UI, and the UI redraws a few times a
    second however fast the source produces."""

    def __init__(self, ping: Callable[[], None], *, flush_interval: float = 0.25,
                 clock: Callable[[], float] = time.monotonic):
        self.items: deque[Event] = deque()  # appends and pops are thread-safe
        self._ping = ping
        self._flush_interval = flush_interval
        self._clock = clock
        self._last_ping = float("-inf")
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        self.items.append(event)
        urgent = isinstance(event, URGENT)
        with self._lock:
            due = urgent or self._clock() - self._last_ping >= self._flush_interval
            if due:
                self._last_ping = self._clock()
        if due:
            self._ping()

    def flush(self) -> None:
        with self._lock:
            self._last_ping = self._clock()
        self._ping()

    def drain(self) -> list[Event]:
        out = []
        while self.items:
            out.append(self.items.popleft())
        return out
