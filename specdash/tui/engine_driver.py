"""The body of the dashboard's engine thread, kept free of Textual so it can be tested
and reasoned about on its own.

The thread owns the Session: it builds it (loading models, fetching them first if need
be), runs one prompt after another and closes it. Everything it learns goes into an
inbox (a deque: appends and pops are thread-safe) and a `ping` callback tells the UI to
drain it. Pings are rate-limited here — at most one per `flush_interval` while tokens
stream — so the token loop never waits for the UI and the UI redraws a few times a
second however fast the engine steps.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from specdash.engine import commands as C
from specdash.engine.settings import EngineSettings
from specdash.engine.stats import NoticeEvent, PrefillEvent, SettingsEvent, Summary

Progress = Callable[[str, float | None], None]
SessionFactory = Callable[[EngineSettings, Progress], object]


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A prompt to generate for: `title` is what the generation panel shows."""

    title: str
    text: str


@dataclass(frozen=True, slots=True)
class PromptStarted:
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class Loading:
    message: str
    fraction: float | None


@dataclass(frozen=True, slots=True)
class Ready:
    """The session is built; commands now reach the engine."""


@dataclass(frozen=True, slots=True)
class Idle:
    """The last prompt finished and nothing is queued: waiting for a new prompt."""


class ShutdownRequested(BaseException):
    """Raised from the progress callback to abandon a fetch/load when the app quits.
    A BaseException so that no `except Exception` on the way swallows it."""


class PromptQueue:
    """Prompts the operator typed, in order; then, if a workload is set, the workload
    cycling forever."""

    def __init__(self, workload: Iterable[WorkItem] = ()):
        self._workload = list(workload)
        self._next_workload = 0
        self._typed: deque[WorkItem] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def push(self, item: WorkItem) -> None:
        with self._cond:
            self._typed.append(item)
            # The operator's own prompt ends the built-in workload: after it, the
            # dashboard waits for the next one instead of drifting back to canned prompts.
            self._workload = []
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def next(self) -> WorkItem | None:
        """The next prompt; blocks while there is none; None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._typed:
                    return self._typed.popleft()
                if self._workload:
                    item = self._workload[self._next_workload % len(self._workload)]
                    self._next_workload += 1
                    return item
                self._cond.wait()

    def would_block(self) -> bool:
        with self._cond:
            return not (self._closed or self._typed or self._workload)


class EngineDriver:
    def __init__(
        self,
        make_session: SessionFactory,
        settings: EngineSettings,
        prompts: PromptQueue,
        ping: Callable[[], None],
        *,
        flush_interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._make_session = make_session
        self._settings = settings
        self.prompts = prompts
        self._ping = ping
        self._flush_interval = flush_interval
        self._clock = clock
        self.inbox: deque[object] = deque()
        self.session: object | None = None
        self._lock = threading.Lock()  # guards session/_pending/_running between threads
        self._pending: list[C.Command] = []
        self._running = False  # inside session.run()
        self._shutdown = threading.Event()
        # Set when run() has ended or shutdown was asked for: what a supervisor waits on.
        self.finished = threading.Event()
        self._abort_run = threading.Event()
        self._paused = False
        self._last_ping = float("-inf")
        self._last_progress = float("-inf")
        self.thread_id: int | None = None  # native id of the engine thread, for CPU accounting

    # --- called from the UI thread --------------------------------------------------
    def send(self, cmd: C.Command) -> None:
        """Forward a command to the engine; before the session exists, hold it."""
        with self._lock:
            if self.session is None:
                self._pending.append(cmd)
                return
            session = self.session
        session.send(cmd)

    def new_prompt(self, item: WorkItem) -> None:
        """Queue `item`; a prompt being generated is abandoned so this one starts now."""
        self.prompts.push(item)
        self._abort_run.set()
        with self._lock:
            blocked, session = self._running and self._paused, self.session
        # A paused engine yields nothing, so the loop below cannot break out: only Stop
        # wakes it. Otherwise no Stop is sent on purpose: one that arrived just after the
        # run ended would stop the *next* run at its first step.
        if blocked and session is not None:
            session.send(C.Stop())

    def shutdown(self) -> None:
        """Make run() return within about one engine step."""
        self._shutdown.set()
        self.finished.set()
        self._abort_run.set()
        self.prompts.close()
        with self._lock:
            session = self.session
        if session is not None:
            session.send(C.Stop())

    # --- the thread body -------------------------------------------------------------
    def run(self) -> None:
        self.thread_id = threading.get_native_id()
        try:
            session = self._make_session(self._settings, self._progress)
            with self._lock:  # held while sending, so later commands cannot overtake these
                self.session = session
                for cmd in self._pending:
                    session.send(cmd)
                self._pending = []
            self._emit(Ready(), flush=True)
            try:
                self._loop(session)
            finally:
                with self._lock:
                    self.session = None
                session.close()
        except ShutdownRequested:
            pass
        finally:
            self._flush()

    def _loop(self, session) -> None:
        while not self._shutdown.is_set():
            if self.prompts.would_block():
                self._emit(Idle(), flush=True)
            item = self.prompts.next()
            if item is None or self._shutdown.is_set():
                return
            self._abort_run.clear()
            self._emit(PromptStarted(item.title, item.text), flush=True)
            with self._lock:
                self._running = True
            events = session.run(item.text)  # max_tokens: the session's settings
            try:
                for ev in events:
                    if isinstance(ev, SettingsEvent):
                        with self._lock:
                            self._paused = ev.paused
                    # Rare events go out at once (a refused command, a pause, the end of
                    # a prompt); steps ride along with the next timed flush.
                    self._emit(ev, flush=isinstance(ev, (NoticeEvent, SettingsEvent, PrefillEvent, Summary)))
                    if self._abort_run.is_set():
                        break  # closing the generator ends the run after this step
            finally:
                if hasattr(events, "close"):  # a generator: run its cleanup now, not at GC
                    events.close()
                with self._lock:
                    self._running = False
            self._flush()

    def _progress(self, message: str, fraction: float | None) -> None:
        if self._shutdown.is_set():
            raise ShutdownRequested()
        now = self._clock()
        # A fetch reports per chunk; ten updates a second is plenty to watch.
        final = fraction is not None and fraction >= 1.0
        if final or fraction is None or now - self._last_progress >= 0.1:
            self._last_progress = now
            self._emit(Loading(message, fraction), flush=True)

    def _emit(self, item: object, *, flush: bool = False) -> None:
        self.inbox.append(item)
        if flush or self._clock() - self._last_ping >= self._flush_interval:
            self._flush()

    def _flush(self) -> None:
        self._last_ping = self._clock()
        self._ping()
