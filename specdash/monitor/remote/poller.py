"""One server, polled on its own timer thread.

`ServerWatch` does one poll (synchronously): /props once per connection (the model, and
whether this is a llama-server router), /metrics every time, and /slots for llama.cpp
(live tokens). It keeps the server's state: up/down/starting, or bad (it answers with
numbers no counter can hold: NaN, inf, negative, beyond 2^53, more accepted than drafted),
when it was last seen, the error text, how many polls failed, and the counter window.

`Poller` runs a watch on a daemon thread. Polls never overlap: the next one is scheduled
only after the previous one returned, `interval` after it started (or a little after it
ended, for a server slower than the interval). A dead server costs its own thread a
connect timeout and nothing else.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdash.contract.errors import describe
from specdash.contract.events import ServerEvent, now
from specdash.monitor.remote.backends import ITL, TTFT, LlamaCppSnapshot, SlotInfo, Snapshot, parse_slots, snapshot
from specdash.monitor.remote.client import Client, RemoteError, model_query
from specdash.monitor.remote.metrics import MAX_READING, NotMetricsError, parse
from specdash.monitor.remote.window import CounterWindow, Delta, acceptance_rate, mean_accepted_length

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0
DEFAULT_WINDOW = 10.0


@dataclass(slots=True)
class PollResult:
    ok: bool
    t: float  # events.now() at the end of the poll
    wall: float  # time.time() at the end of the poll
    snapshot: Snapshot | None = None
    delta: Delta | None = None  # None on the first good poll after (re)connecting
    error: RemoteError | None = None
    reset: bool = False
    state_changed: bool = False  # up <-> down/starting since the previous poll
    props_changed: bool = False  # /props was (re)read this poll
    command: str = ""  # the command whose effect this poll first shows (a router preset switch)


@dataclass(slots=True)
class RouterInfo:
    """llama-server in router mode: its models and the one we watch."""

    models: list[dict[str, Any]] = field(default_factory=list)
    active: str | None = None
    pending: str | None = None  # a preset being switched to
    pending_command: str = ""

    def model(self, model_id: str | None) -> dict[str, Any] | None:
        return next((m for m in self.models if str(m.get("id")) == model_id), None)


def preset_options(model: dict[str, Any] | None) -> dict[str, str]:
    """A router model's preset (its INI section as /models returns it) -> {key: value}."""
    status = model.get("status") if model else None
    text = status.get("preset") if isinstance(status, dict) else None
    out: dict[str, str] = {}
    if isinstance(text, str):
        for line in text.splitlines():
            key, eq, value = line.partition("=")
            if eq and not line.lstrip().startswith((";", "#", "[")):
                out[key.strip()] = value.strip()
    return out


class ServerWatch:
    """The state of one server and how to poll it once. Not thread-safe by itself: the
    Poller's thread is its only caller (RemoteSource reads results from callbacks)."""

    def __init__(self, client: Client, *, window: float = DEFAULT_WINDOW,
                 clock: Callable[[], float] = now, wall: Callable[[], float] = time.time):
        self.client = client
        self.window = CounterWindow(window)
        self.state = "starting"
        self.backend = ""
        self.error = ""
        self.error_kind = ""
        self.errors = 0
        self.polls = 0
        self.last_seen: float | None = None
        self.up_since: float | None = None  # wall clock, our own observation
        self.props: dict[str, Any] | None = None
        self.router: RouterInfo | None = None
        self.slots_supported = True
        self.last: Snapshot | None = None
        self.notes: list[str] = []  # what the last good reading left out (snapshot notes)
        self._clock = clock
        self._wall = wall
        self._need_props = True
        self._announce = ""  # a command whose effect the next good poll shows

    @property
    def url(self) -> str:
        return self.client.display

    # --- one poll ---

    def _query(self) -> dict[str, str] | None:
        return model_query(self.router.active) if self.router else None

    def reread_props(self) -> None:
        """Read /props again at the next poll (a command changed what it says)."""
        self._need_props = True

    def _read_props(self) -> None:
        props = self.client.get_json_optional("/props")
        if isinstance(props, dict) and props.get("role") == "router":
            if self.router is None:  # keep the active/pending preset across re-reads
                self.router = RouterInfo()
            self.refresh_router()
            if self.router.active:
                sub = self.client.get_json_optional("/props", model_query(self.router.active))
                props = sub if isinstance(sub, dict) else props
        else:
            self.router = None
        self.props = props if isinstance(props, dict) else None
        self._need_props = False

    def refresh_router(self) -> None:
        """Re-read a router's model list; keep watching the active model if it is still
        loaded, else the first loaded one."""
        if self.router is None:
            return
        data = self.client.get_json_optional("/models")
        models = data.get("data", []) if isinstance(data, dict) else []
        self.router.models = [m for m in models if isinstance(m, dict)]
        loaded = [str(m.get("id")) for m in self.router.models if model_status(m) == "loaded"]
        if self.router.active not in loaded and self.router.pending is None:
            self.router.active = loaded[0] if loaded else None

    def poll(self) -> PollResult:
        was_up = self.state == "up"
        props_changed = False
        try:
            if self.router is not None and self.router.pending is not None:
                self._pending_switch()
            if self._need_props:
                self._read_props()
                props_changed = True
            if self.router is not None and self.router.active is None:
                self.refresh_router()
                if self.router.active is None:
                    raise RemoteError("loading", f"{self.url}: llama-server router with no model "
                                      f"loaded; load one (d in the dashboard, or POST /models/load)")
            text = self.client.metrics_text(self._query())
            try:
                scrape = parse(text)
            except NotMetricsError as exc:
                raise RemoteError("not_metrics", f"{self.url}/metrics: {exc}; give the server's base "
                                  f"URL (llama-server, vLLM or specdash --metrics-port)") from None
            backend = scrape.backend()
            if backend is None:
                raise RemoteError("unknown_backend", f"{self.url}/metrics: Prometheus metrics, but none "
                                  f"named llamacpp:, vllm:, specdash_ or specdash:; is this an inference server?")
            bad = scrape.bad_reading()
            if bad is not None:
                raise RemoteError("bad_reading", f"{self.url}/metrics: bad reading {bad}: a count must be a "
                                  f"finite number from 0 to 2^53")
            slots: list[SlotInfo] | None = None
            # /slots matters while a slot is busy (its in-flight n_decoded), and on
            # (re)connecting (what the slots speculate with); an idle server costs one
            # request per poll.
            busy = (scrape.value("llamacpp:requests_processing") or 0) > 0
            # A request ended since the last poll (the counters move then): the slot now
            # holds its task's params, what it drafted with (a short request can start and
            # end between two polls, never seen busy).
            ended = isinstance(self.last, LlamaCppSnapshot) and \
                (scrape.value("llamacpp:tokens_predicted_total") or 0.0) != self.last.tokens_predicted_total
            if backend == "llamacpp" and self.slots_supported and (busy or ended or props_changed or self.last is None):
                data = self.client.get_json_optional("/slots", self._query())
                if data is None:
                    self.slots_supported = False  # started with --no-slots
                else:
                    slots = parse_slots(data)
            elif backend == "llamacpp" and isinstance(self.last, LlamaCppSnapshot):
                # Idle: the slots as last read, none in flight.
                slots = [dataclasses.replace(s, is_processing=False, n_decoded=0) for s in self.last.slots]
            snap = snapshot(scrape, backend, slots=slots, props=self.props)
            why = self.window.check(snap.counters, snap.start_marker)
            if why is not None:
                raise RemoteError("bad_reading", f"{self.url}/metrics: bad reading: {why}")
        except RemoteError as exc:
            return self._failed(exc, was_up)
        except Exception as exc:
            # The server's answer broke a reader here (nested past the parser's stack,
            # a shape no reader expects): a bug of ours or nonsense of its own; either
            # way this server shows it and the polls go on: a poller never dies of it.
            log.debug("reading %s failed", self.url, exc_info=True)
            return self._failed(RemoteError("bad_reading", f"{self.url}: could not read its answer "
                                            f"({describe(exc)})"), was_up)
        t, wall = self._clock(), self._wall()
        self.backend = snap.backend
        self.polls += 1
        delta = self.window.add(t, snap.counters, snap.start_marker)
        reset = bool(delta and delta.reset)
        if reset:
            self._need_props = True  # a restarted server may have another model
        self.last = snap
        self.notes = list(snap.notes)
        self.state, self.error, self.error_kind = "up", "", ""
        self.last_seen = wall
        if not was_up or reset or self.up_since is None:
            self.up_since = wall
        # The command that caused a switch is announced by the first good poll after it.
        command, self._announce = self._announce, ""
        return PollResult(True, t, wall, snapshot=snap, delta=delta, reset=reset,
                          state_changed=not was_up, props_changed=props_changed or bool(command),
                          command=command)

    def switch_to(self, model_id: str, command: str) -> None:
        """A router preset switch was asked for: polls show "starting" until `model_id` is
        loaded, then watch it (a new baseline: another process, not a counter reset)."""
        if self.router is None:
            raise ValueError("not a router")
        self.router.pending = model_id
        self.router.pending_command = command

    def _pending_switch(self) -> None:
        """During a preset switch: once the preset is loaded, watch it and remember the
        command to announce; until then raise the "starting" state (not an error)."""
        router = self.router
        assert router is not None and router.pending is not None
        self.refresh_router()
        target = router.pending
        status = model_status(router.model(target) or {})
        if status == "loaded":
            router.active, router.pending = target, None
            self._announce, router.pending_command = router.pending_command, ""
            self.window.clear()
            self.last = None
            self._need_props = True
            self.slots_supported = True
            return
        if status == "failed":
            router.pending = None
            raise RemoteError("http", f"{self.url}: preset {target} failed to load; see the llama-server log")
        raise RemoteError("switching", f"{self.url}: loading preset {target} ({status or 'requested'})")

    def _failed(self, exc: RemoteError, was_up: bool) -> PollResult:
        if exc.kind != "switching":  # a switch we asked for is not the server's error
            self.errors += 1
        self.error = str(exc) or describe(exc)
        self.error_kind = exc.kind
        if exc.kind == "bad_reading":
            # It answered: "bad", not "down", and seen now.
            self.state, self.last_seen = "bad", self._wall()
        else:
            self.state = "starting" if exc.kind in ("loading", "switching") else "down"
        self._need_props = True  # whatever comes back may be another process
        self.up_since = None
        return PollResult(False, self._clock(), self._wall(), error=exc, state_changed=was_up)

    # --- the fleet row ---

    def server_event(self, t: float | None = None) -> ServerEvent:
        """This server as the fleet table shows it. Rates are over the window; acceptance
        and mean length over the window when it saw drafts, else since the server started."""
        snap = self.last
        ev = ServerEvent(url=self.url, state=self.state, backend=self.backend, errors=self.errors,
                         resets=self.window.resets, last_seen=self.last_seen, error=self.error,
                         t=self._clock() if t is None else t)
        if snap is None:
            return ev
        c = snap.counters
        ev.model = snap.model
        if self.router and self.router.active:
            ev.model = self.router.active
        if self.state == "up":
            ev.requests_running = snap.requests_running
            ev.requests_waiting = snap.requests_waiting
            ev.kv_cache_usage = snap.kv_cache_usage
        ev.note = "; ".join(self.notes)
        ev.num_drafts = int(c.num_drafts)  # every reading is finite, 0..2^53 (ServerWatch.poll)
        ev.num_draft_tokens = int(c.num_draft_tokens)
        ev.num_accepted_tokens = int(c.num_accepted_tokens)
        ev.num_accepted_tokens_per_pos = [int(v) for v in c.per_pos]
        tot = self.window.total()
        if tot is not None and tot.seconds > 0 and self.state == "up":
            ev.generation_tokens_per_s = tot.tokens / tot.seconds
            ev.prompt_tokens_per_s = tot.prompt_tokens / tot.seconds
        if tot is not None and tot.num_draft_tokens > 0:
            ev.acceptance_rate = acceptance_rate(tot.num_accepted_tokens, tot.num_draft_tokens)
            ev.mean_accepted_length = mean_accepted_length(tot.num_accepted_tokens, tot.num_drafts)
        else:
            ev.acceptance_rate = acceptance_rate(c.num_accepted_tokens, c.num_draft_tokens)
            ev.mean_accepted_length = mean_accepted_length(c.num_accepted_tokens, c.num_drafts)
        if tot is not None and tot.steps and tot.tokens:
            ev.tokens_per_step = tot.tokens / tot.steps
        elif c.steps:
            ev.tokens_per_step = c.tokens / c.steps if c.tokens else None
        if tot is not None:
            ev.ttft_p50_s = self.window.quantile(TTFT, 0.5)
            ev.ttft_p95_s = self.window.quantile(TTFT, 0.95)
            ev.itl_p50_s = self.window.quantile(ITL, 0.5)
            ev.itl_p95_s = self.window.quantile(ITL, 0.95)
        if self.state == "up":
            start = snap.start_time if snap.start_time is not None else self.up_since
            if start is not None and self.last_seen is not None:
                ev.uptime_s = max(0.0, self.last_seen - start)
        return _figures_shown(ev)


def _figures_shown(ev: ServerEvent) -> ServerEvent:
    """A figure no server can have (a rate over a denormal step count, a quantile from a
    bucket bound of 1e300) is unknown, not shown: every reading is 0..2^53, but what is
    derived from them need not be."""
    for f in dataclasses.fields(ev):
        value = getattr(ev, f.name)
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= MAX_READING):
            setattr(ev, f.name, None)
    return ev


def model_status(model: dict[str, Any]) -> str:
    """A router model's status (server-models.cpp): loaded, loading, unloaded, sleeping,
    downloading; "failed" when its last load exited with an error."""
    status = model.get("status")
    if isinstance(status, dict):
        if status.get("failed"):
            return "failed"
        return str(status.get("value", ""))
    return str(status or "")


class Poller:
    """Runs `watch.poll()` every `interval` seconds on its own daemon thread and hands each
    PollResult to `on_result` (called on the poller thread; keep it short)."""

    def __init__(self, watch: ServerWatch, on_result: Callable[[PollResult], None], *,
                 interval: float = DEFAULT_INTERVAL, name: str = ""):
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.watch = watch
        self.interval = interval
        self._on_result = on_result
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.lock = threading.Lock()  # one poll at a time; also held by whoever changes the watch
        self._thread = threading.Thread(target=self._run, name=name or f"poll {watch.url}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poll_once(self) -> PollResult:
        """One poll on the caller's thread (never concurrently with the timer's)."""
        with self.lock:
            return self.watch.poll()

    def wake(self) -> None:
        """Poll now instead of at the next tick (after a command changed the server)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with self.lock:
                if self._stop.is_set():
                    break
                try:
                    result = self.watch.poll()
                except Exception:
                    # A source's close() stops the poller and closes the client at once, so
                    # an in-flight poll fails on the closed client (httpx: RuntimeError);
                    # that is the end, not an error. Any other failure is raised as before.
                    if self._stop.is_set():
                        break
                    raise
            if self._stop.is_set():
                break
            try:
                self._on_result(result)
            except Exception:  # a consumer's bug must not kill the poller; it is logged
                log.exception("poller %s: the result handler failed", self.watch.url)
            elapsed = time.monotonic() - started
            delay = max(self.interval - elapsed, self.interval * 0.25)
            self._wake.wait(delay)
            self._wake.clear()

    def stop(self, join: float = 0.0) -> None:
        self._stop.set()
        self._wake.set()
        if join and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(join)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
