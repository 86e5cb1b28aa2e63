"""The embedded engine as a source: a Session in its own thread, prompts one after another.

The thread owns the Session: it builds it (loading models, fetching them first if need
be), runs one prompt after another and closes it. Everything it learns becomes contract
events handed to `emit`; commands reach the engine's queue through `send`. A failure in
the thread becomes a StatusEvent("error", ...) and the thread ends: the consumer shows
it and may start a new source with the last good settings.

Why a daemon thread: Stop is honoured between steps, but one step (or a prefill, or a
model load) can take seconds on a loaded machine, and Python waits for non-daemon
threads before the process may exit. A daemon thread lets `q` return the terminal at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from specdash.contract import events as E
from specdash.engine import supports as engine_supports
from specdash.engine.engine import RunOptions
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError
from specdash.contract.events import Event
from specdash.monitor.health import HealthThresholds, monitored
from specdash.sources.base import Preset, Telemetry

Progress = Callable[[str, float | None], None]

# What this source does itself, on top of the engine's own list (engine.settings_event):
# take a new prompt, and so rerun one at each K (a sweep).
SUPPORTS = ("prompt", "sweep")


class Served(Protocol):
    """A request a server queued (specdash/serve/request.py): its tokens and its own
    settings, and where the events of its run go. The source runs it like a typed prompt."""

    @property
    def tokens(self) -> list[int]: ...
    @property
    def max_tokens(self) -> int | None: ...
    def run_options(self) -> RunOptions:
        """Its own options for a run of it: settings, seed, drafter, sampling rules, a fresh
        grammar state (a request run again after an engine fault starts over), its stop check,
        and the rows it shares with the previous request kept (a chat's next turn)."""
        ...

    def begin(self) -> bool:
        """The engine takes it now; False: its client left while it waited (skip it)."""
        ...

    def feed(self, ev: Event) -> None:
        """Every event of its run, in the engine thread."""
        ...

    def stop_reason(self) -> str:
        """Asked before every step: why it must end now ("" to go on)."""
        ...

    def fail(self, message: str) -> None:
        """The run failed or was abandoned; `message` says why."""
        ...

    def called(self) -> list[str]:
        """The tools its answer called, by name (read after its Summary is fed)."""
        ...


class SessionLike(Protocol):
    """What the source needs of a session (specdash.sources.session.Session; tests pass fakes)."""

    @property
    def settings(self) -> EngineSettings:
        """The live settings: what a reload after an engine fault starts from."""
        ...

    def run(self, prompt: str, max_tokens: int | None = None) -> Iterator[Event]: ...

    def run_request(self, tokens: Sequence[int], max_tokens: int | None, options: RunOptions) -> Iterator[Event]: ...

    def send(self, cmd: E.Command) -> None: ...

    def apply_pending(self) -> Iterable[Event]:
        """Apply the commands sent while no prompt runs; their settings events."""
        ...

    def close(self) -> None: ...


class Runner(Protocol):
    """A batch of requests (engine/batch/runner.BatchRunner)."""

    slots: dict[int, Any]

    @property
    def free(self) -> int: ...

    def step(self) -> Iterator[Event]: ...


class BatchingSession(SessionLike, Protocol):
    """A session that runs a server's requests in one target batch (serve --parallel)."""

    width: int  # requests at once; 1: one at a time

    def batch(self, width: int) -> Runner: ...

    def admit_request(self, runner: Runner, tokens: Sequence[int], max_tokens: int | None,
                      options: RunOptions, tag: str) -> Iterator[Event]: ...

    def admit_prompt(self, runner: Runner, text: str, max_tokens: int | None, tag: str) -> Iterator[Event]: ...


SessionFactory = Callable[[EngineSettings, Progress], SessionLike]


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A prompt to generate for: `title` is what the generation panel shows."""

    title: str
    text: str
    max_tokens: int | None = None  # None: the settings' max_tokens
    request: Served | None = None  # a server's request: run its tokens, feed it the events


class ShutdownRequested(BaseException):
    """Raised from the progress callback to abandon a fetch/load when the source closes.
    A BaseException so that no `except Exception` on the way swallows it."""


class Commands:
    """What PromptQueue.next() returns when poked: commands wait, not a prompt."""


COMMANDS = Commands()


@dataclass(frozen=True, slots=True)
class Turns:
    """How a queue's prompts take their turns: decided once, by the queue's kind (the
    dashboard's own, or a server's: serve/queue.py), and only read by the source."""

    cut_in: bool  # a new prompt abandons the one running (else it waits its turn)
    reported: bool  # the queue is shown and exported (QueueEvent)
    kept_on_close: bool  # what waits when the source closes runs in the next (a restart)
    batched: bool  # requests share one target batch when the session runs several
    idle: str  # the status line while nothing waits
    # An engine failure mid-run fails what runs, and the engine reloads for what waits
    # (a server's clients); else it is the source's error (the dashboard's `r` reloads).
    survives_faults: bool


DASHBOARD_TURNS = Turns(cut_in=True, reported=False, kept_on_close=False, batched=False,
                        idle="Done. Press n for a new prompt.", survives_faults=False)
SERVER_TURNS = Turns(cut_in=False, reported=True, kept_on_close=True, batched=True,
                     idle="Waiting for requests (n queues one here).", survives_faults=True)
FAULTS_PER_MINUTE = 3  # more engine faults than this in a minute: the engine stays down


class EngineFault(Exception):
    """The engine failed mid-run (llama_decode, a drafter's bug): what ran was failed with
    this message; the session is rebuilt (its rows may not be what it believes)."""


class PromptQueue:
    """Prompts the operator typed, in order; then, if a workload is set, the workload
    cycling forever. Between prompts the engine thread waits here, so a command sent
    while it waits pokes it awake to apply that command."""

    turns = DASHBOARD_TURNS

    def __init__(self, workload: Iterable[WorkItem] = ()):
        self._workload = list(workload)
        self._next_workload = 0
        self._typed: deque[WorkItem] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._poked = False
        self.running: WorkItem | None = None  # the item being generated (set by the source)
        # A server's requests in one batch (serve --parallel), replaced whole by the source
        # so the HTTP thread reading it never sees it change under it.
        self.batch: tuple[WorkItem, ...] = ()
        self.on_change: Callable[[], None] = lambda: None  # pushed or taken (any thread)

    def poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify_all()

    def push(self, item: WorkItem) -> None:
        with self._cond:
            self._typed.append(item)
            # The operator's own prompt ends the built-in workload: after it, the
            # dashboard waits for the next one instead of drifting back to canned prompts.
            self._workload = []
            self._cond.notify_all()
        self.on_change()

    def requeue(self, item: WorkItem) -> None:
        """Put an item taken but not run back at the head (a source closing as it took it)."""
        with self._cond:
            self._typed.appendleft(item)
            self._cond.notify_all()

    def waiting(self) -> list[WorkItem]:
        """The typed items (a server's requests) that wait, in the order they will run."""
        with self._cond:
            return list(self._typed)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def next(self) -> WorkItem | Commands | None:
        """The next prompt; blocks while there is none; COMMANDS when poked meanwhile;
        None once closed."""
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
                if self._poked:
                    self._poked = False
                    return COMMANDS
                self._cond.wait()

    def pop_nowait(self) -> WorkItem | None:
        """The next prompt if one waits, else None: for a source that takes its prompt
        when built (a server's, restarted by `n` with the prompt typed)."""
        with self._cond:  # an RLock: next() inside returns at once, nothing to wait for
            if self._closed or not (self._typed or self._workload):
                return None
            item = self.next()
        return item if isinstance(item, WorkItem) else None

    def would_block(self) -> bool:
        with self._cond:
            return not (self._closed or self._typed or self._workload)


class EmbeddedSource:
    kind = "engine"
    telemetry: Telemetry = "local"  # the engine runs here: the dashboard samples this machine
    # Before the first settings event (loading): what a session's engine takes (it always
    # has a drafter factory and a controller), but the expert count, which only a MoE
    # target has (its settings event says so).
    supports: frozenset[str] = frozenset(
        {*engine_supports.ALWAYS, *(n for n in engine_supports.WHEN_ABLE if n != "experts"), *SUPPORTS})

    def __init__(self, make_session: SessionFactory, settings: EngineSettings, prompts: PromptQueue,
                 *, on_session: Callable[[SessionLike], Iterable[Event] | None] | None = None,
                 clock: Callable[[], float] = E.now, health: HealthThresholds | None = None,
                 listener: Callable[[Event], None] | None = None):
        self._make_session = make_session
        # Fed every event in the engine thread, before whoever started the source: a
        # server's /health and /metrics (serve/link.py) never wait on the dashboard's thread.
        self._listener = listener
        self._settings = settings
        self.label = settings.target
        self.prompts = prompts
        # Called in the engine thread once the session is up; the events it yields are
        # emitted (a server's warm-up: adaptive K's costs timed before it says ready).
        self._on_session = on_session or (lambda session: None)
        self._emit: Callable[[Event], None] = lambda ev: None
        self.session: SessionLike | None = None
        self._lock = threading.Lock()  # guards session/_pending/_running/_paused between threads
        self._pending: list[E.Command] = []
        self._running = False  # inside session.run()
        self._paused = False
        self._shutdown = threading.Event()
        self._abort_run = threading.Event()
        self.finished = threading.Event()  # set when the thread has ended (or on close)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None  # what ended the thread, when it failed
        self._last_progress = float("-inf")
        self._clock = clock  # throttles progress reports; tests pass a fake one
        self._health = health  # the health rules' thresholds ([health] in the config)
        self._typed_serial = itertools.count(1)  # prompts typed on a batching server: their tags

    # --- Source ------------------------------------------------------------------------
    def start(self, emit: Callable[[Event], None]) -> None:
        def relay(ev: Event) -> None:
            if isinstance(ev, E.SettingsEvent):
                # The engine lists what it applies; this source adds what it does itself.
                ev = dataclasses.replace(ev, supports=sorted({*ev.supports, *SUPPORTS}))
            if self._listener is not None:
                self._listener(ev)
            emit(ev)

        # Every event is also judged by the health rules (specdash/monitor/health.py). A server's
        # queue changes in its HTTP thread too: Monitored's own lock keeps the fold in order.
        self._emit = monitored(relay, self._health)
        if self.prompts.turns.reported:
            self.prompts.on_change = self._queue_changed
            self._queue_changed()  # the dashboard shows an empty queue from the start
        self.thread = threading.Thread(target=self._body, name="specdash-engine", daemon=True)
        self.thread.start()

    def send(self, cmd: E.Command) -> None:
        """Forward a command to the engine; before the session exists, hold it. A new
        prompt is the source's business, not the engine's."""
        if isinstance(cmd, E.NewPrompt):
            title = cmd.title or cmd.text_.strip().splitlines()[0][:50]
            self.new_prompt(WorkItem(title, cmd.text_, cmd.max_tokens))
            return
        with self._lock:
            if self.session is None:
                self._pending.append(cmd)
                return
            session, between_prompts = self.session, not self._running
        session.send(cmd)
        if between_prompts:
            # No step will come to apply it: wake the thread to (a prompt that starts
            # first applies it before its prefill; the wake then finds nothing to do).
            self.prompts.poke()

    def close(self) -> None:
        """Make the thread end within about one engine step."""
        self._shutdown.set()
        self.finished.set()
        self._abort_run.set()
        self.prompts.close()
        with self._lock:
            session = self.session
        if session is not None:
            session.send(E.Stop())

    def presets(self) -> list[Preset]:
        return []  # the draft picker lists models and drafter kinds instead

    def new_prompt(self, item: WorkItem) -> None:
        """Queue `item`; a prompt being generated is abandoned so this one starts now (but
        on a server, where it waits its turn behind the requests)."""
        self.prompts.push(item)
        if not self.prompts.turns.cut_in:
            return
        self._abort_run.set()
        with self._lock:
            blocked, session = self._running and self._paused, self.session
        # A paused engine yields nothing, so the loop below cannot break out: only Stop
        # wakes it. Otherwise no Stop is sent on purpose: one that arrived just after the
        # run ended would stop the *next* run at its first step.
        if blocked and session is not None:
            session.send(E.Stop())

    # --- the thread ------------------------------------------------------------------
    def _body(self) -> None:
        faults: list[float] = []
        try:
            self._emit(E.StatusEvent("loading", f"loading {self._settings.target}", t=E.now()))
            while True:
                session = self._make_session(self._settings, self._progress)
                with self._lock:  # held while sending, so later commands cannot overtake these
                    self.session = session
                    for cmd in self._pending:
                        session.send(cmd)
                    self._pending = []
                for ev in self._on_session(session) or ():
                    self._emit(ev)
                self._emit(E.StatusEvent("ready", t=E.now()))
                try:
                    self._loop(session)
                    break
                except EngineFault as fault:
                    now = time.monotonic()
                    faults = [t for t in faults if now - t < 60.0] + [now]
                    if len(faults) > FAULTS_PER_MINUTE:
                        raise SpecdashError(f"{fault}; {len(faults)} engine faults within a minute, so the "
                                            "engine stays down (r reloads it)") from fault
                    # What the steering route and the keys changed is kept across the reload.
                    self._settings = session.settings
                    self._emit(E.NoticeEvent("error", f"{fault}; the engine reloads, and the requests waiting "
                                             "run after it", t=E.now()))
                    self._emit(E.StatusEvent("loading", f"reloading {self._settings.target} after an "
                                             "engine fault", t=E.now()))
                finally:
                    with self._lock:
                        self.session = None
                    session.close()
            self._emit(E.StatusEvent("ended", t=E.now()))
        except ShutdownRequested:
            pass
        except BaseException as exc:  # reported, never raised: the UI stays alive
            self.error = exc
            message = str(exc) if isinstance(exc, SpecdashError) else f"{type(exc).__name__}: {exc}"
            self._emit(E.StatusEvent("error", message, t=E.now()))
            if not isinstance(exc, SpecdashError):
                self._emit(E.NoticeEvent("error", "".join(traceback.format_exception(exc)[-3:]).strip(), t=E.now()))
        finally:
            self.finished.set()

    def _loop(self, session: SessionLike) -> None:
        idle_said = False
        while not self._shutdown.is_set():
            if self.prompts.would_block() and not idle_said:
                self._emit(E.StatusEvent("idle", self.prompts.turns.idle, t=E.now()))
                idle_said = True
            item = self.prompts.next()
            if item is None or self._shutdown.is_set():
                if isinstance(item, WorkItem) and self.prompts.turns.kept_on_close:
                    self.prompts.requeue(item)  # the next source runs it (a server's restart)
                return
            if isinstance(item, Commands):
                # Settings changed between prompts show now, not when the next one starts.
                for ev in session.apply_pending():
                    if isinstance(ev, E.SettingsEvent):
                        with self._lock:
                            self._paused = ev.paused
                    self._emit(ev)
                continue
            idle_said = False
            if self.prompts.turns.batched and getattr(session, "width", 1) > 1:
                self._serve_batched(cast(BatchingSession, session), item)
                continue
            self._run_item(session, item)

    def _run_item(self, session: SessionLike, item: WorkItem) -> None:
        request = item.request
        if request is not None and not request.begin():
            self._queue_changed()  # its client left while it waited
            return
        self._abort_run.clear()
        self.prompts.running = item
        self._queue_changed()
        self._emit(E.PromptEvent(item.title, item.text, t=E.now()))
        with self._lock:
            self._running = True
        events = session.run(item.text, item.max_tokens) if request is None \
            else session.run_request(request.tokens, request.max_tokens, request.run_options())
        try:
            for ev in events:
                if isinstance(ev, E.SettingsEvent):
                    with self._lock:
                        self._paused = ev.paused
                if request is not None:
                    request.feed(ev)
                    if isinstance(ev, E.Summary):
                        ev.calls = request.called()  # the requests screen names the tool called
                self._emit(ev)
                # A new prompt abandons a typed one; a served request ends only by its own
                # stop (or its client leaving), or when the source closes.
                if self._abort_run.is_set() and (request is None or self._shutdown.is_set()):
                    break  # closing the generator ends the run after this step
        except SpecdashError as exc:
            if request is None:
                raise
            # One request's failure is its own (a drafter it asked for would not build):
            # it is answered with the reason and the server goes on.
            request.fail(str(exc))
            self._emit(E.NoticeEvent("warning", f"{item.title} failed: {exc}", t=E.now()))
        except Exception as exc:
            if not self.prompts.turns.survives_faults:
                raise
            message = f"the engine failed on {item.title} ({type(exc).__name__}: {exc})"
            if request is not None:
                request.fail(message)
            raise EngineFault(message) from exc
        finally:
            if isinstance(events, Generator):  # run its cleanup now, not at GC
                events.close()
            if request is not None:
                request.fail("the engine stopped before this request finished")  # no-op once done
            with self._lock:
                self._running = False
            self.prompts.running = None
            self._queue_changed()
            # A command sent as the run ended found it running and poked nothing: wake the
            # loop so it applies now, not with the next prompt (the K pressed there was lost).
            self.prompts.poke()

    def _serve_batched(self, session: BatchingSession, first: WorkItem) -> None:
        """A server's requests, up to session.width in one target batch (engine/batch): each
        joins between steps and leaves when it ends while the others go on. Returns when
        none runs and none waits (the loop above then waits for the next)."""
        runner = session.batch(session.width)
        batch: dict[str, WorkItem] = {}  # by tag: the requests in the batch
        item: WorkItem | None = first
        why = "the engine stopped before this request finished"
        try:
            while not self._shutdown.is_set():
                while item is not None:
                    taken, item = item, None  # once admitted, never requeued (it is answered)
                    self._admit(session, runner, batch, taken)
                    item = self.prompts.pop_nowait() if runner.free else None
                if not batch:
                    return
                with self._lock:
                    self._running = True
                for ev in runner.step():
                    self._batch_event(batch, ev)
                item = self.prompts.pop_nowait() if runner.free else None
        except SpecdashError:
            raise
        except Exception as exc:
            if not self.prompts.turns.survives_faults:
                raise
            why = f"the engine failed on a batch of {len(batch)} ({type(exc).__name__}: {exc})"
            raise EngineFault(why) from exc
        finally:
            for done in batch.values():
                if done.request is not None:
                    done.request.fail(why)
            batch.clear()
            self.prompts.batch = ()
            with self._lock:
                self._running = False
            self._queue_changed()
            self.prompts.poke()  # as after one run: a command sent as the batch ran dry applies now
            if item is not None:
                self.prompts.requeue(item)  # taken as the source closed: the next source runs it

    def _admit(self, session: BatchingSession, runner: Runner, batch: dict[str, WorkItem], item: WorkItem) -> None:
        request = item.request
        if request is not None and not request.begin():
            self._queue_changed()  # its client left while it waited
            return
        tag = item.title if request is not None else f"{item.title} ({next(self._typed_serial)})"
        batch[tag] = item
        self.prompts.batch = tuple(batch.values())
        self._queue_changed()
        self._emit(E.PromptEvent(item.title, item.text, request=tag, t=E.now()))
        try:
            events = session.admit_prompt(runner, item.text, item.max_tokens, tag) if request is None \
                else session.admit_request(runner, request.tokens, request.max_tokens, request.run_options(), tag)
            for ev in events:
                self._batch_event(batch, ev)
        except SpecdashError as exc:  # one request's failure is its own, as one at a time
            del batch[tag]
            self.prompts.batch = tuple(batch.values())
            if request is not None:
                request.fail(str(exc))
            self._emit(E.NoticeEvent("warning", f"{item.title} failed: {exc}", t=E.now()))
            self._queue_changed()

    def _batch_event(self, batch: dict[str, WorkItem], ev: Event) -> None:
        """Emit a batch's event and hand it to the request it belongs to."""
        if isinstance(ev, E.SettingsEvent):
            with self._lock:
                self._paused = ev.paused
        tag = getattr(ev, "request", "")
        item = batch.get(tag) if tag else None
        if item is None:
            self._emit(ev)
            return
        if isinstance(ev, E.Summary) and self._shutdown.is_set() and item.request is not None:
            # Ended by the server leaving, not by itself: an error to its client, as one at a time.
            item.request.fail("the server stopped before this request finished")
        elif item.request is not None:
            item.request.feed(ev)
            if isinstance(ev, E.Summary):
                ev.calls = item.request.called()  # the requests screen names the tool called
        self._emit(ev)
        if isinstance(ev, E.Summary):
            del batch[tag]
            self.prompts.batch = tuple(batch.values())
            self._queue_changed()

    def _queue_changed(self) -> None:
        """A server's queue, as the dashboard and the exporter show it."""
        if not self.prompts.turns.reported:
            return
        batch, one = self.prompts.batch, self.prompts.running
        running = [item.title for item in batch] if batch else [one.title] if one is not None else []
        self._emit(E.QueueEvent(running=running, waiting=[w.title for w in self.prompts.waiting()], t=E.now()))

    def _progress(self, message: str, fraction: float | None) -> None:
        if self._shutdown.is_set():
            raise ShutdownRequested()
        now = self._clock()
        # A fetch reports per chunk; ten updates a second is plenty to watch.
        final = fraction is not None and fraction >= 1.0
        if final or fraction is None or now - self._last_progress >= 0.1:
            self._last_progress = now
            self._emit(E.StatusEvent("loading", message, fraction, t=now))
