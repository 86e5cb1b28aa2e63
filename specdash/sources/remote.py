"""A running server as a source: llama-server, vLLM, or another specdash's --metrics-port.

It polls the server on its own timer thread (remote.poller) and speaks the contract:

    start        StatusEvent("loading", "connecting"); on the first good poll a SettingsEvent
                 (source="remote") built from /props and the metrics, then "running"
    every poll   CountersEvent (the deltas since the previous poll) and ServerEvent (the
                 fleet row); on up<->down transitions StatusEvent("down", error) and back
                 to "running" (a bad reading, too, is "down" here, and "bad" in the row);
                 a NoticeEvent when a counter reset shows the server restarted, and when
                 the reading left something out (per-position series beyond 64)
    NewPrompt    drive mode: the prompt goes to the server's completion endpoint and the
                 streamed text comes back as PromptEvent, PrefillEvent, StepEvents, Summary
    SetDrafter   llama-server in router mode (--models-preset): switch to the preset named
                 (`model@ngram`, or just `ngram`): unload the current one, load that one
    Stop         stops polling (as close())
    anything     else is refused with a NoticeEvent saying why

Credentials given as headers or URL userinfo never appear in any event (client.Redactor).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from specdash.contract import events as E
from specdash.contract.vocabulary import name_of
from specdash.contract.limits import K_CAP
from specdash.contract.errors import describe
from specdash.contract.events import Event, now
from specdash.monitor.health import HealthMonitor, HealthThresholds, alarms, in_order
from specdash.monitor.remote.backends import LlamaCppSnapshot, Snapshot
from specdash.monitor.remote.client import Client, RemoteError, parse_url
from specdash.monitor.remote.metrics import NotMetricsError, parse
from specdash.monitor.remote.poller import (DEFAULT_INTERVAL, DEFAULT_WINDOW, Poller, PollResult, ServerWatch,
                                    model_status, preset_options)
from specdash.monitor.remote.window import acceptance_rate, mean_accepted_length
from specdash.sources.base import Preset, Telemetry
from specdash.sources.embedded import WorkItem

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256

READ_ONLY_VLLM = "vLLM is read-only from here: its settings are fixed when it starts"
READ_ONLY_SPECDASH = "another specdash's --metrics-port is read-only; steer it in its own dashboard"
# The dashboard's controls a server may or may not take from here (beyond prompt and stop).
CONTROLS = ("k", "draft", "temp", "adaptive", "experts", "pause", "forget", "sweep")
SERVE_UNSTEERABLE = "a specdash server takes K, drafter, temperature and adaptive from here; the rest in its own dashboard"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def supported_commands(backend: str, *, router_presets: int = 0, steer: tuple[str, ...] = ()) -> list[str]:
    """What this kind of server takes from here, by command name (SettingsEvent.supports):
    a prompt in drive mode (not another specdash's metrics port), a preset switch on a
    llama-server router, what a `specdash serve` lists as steerable (`steer`), and stop.
    Everything else is refused."""
    names = ["stop", *steer]
    if backend != "specdash" or steer:
        names.append("prompt")
    if backend not in ("vllm", "specdash") and router_presets >= 2:
        names.append("draft")
    return sorted(names)


def unavailable_controls(backend: str, *, router_presets: int = 0, steer: tuple[str, ...] = ()) -> dict[str, str]:
    """Why this kind of server cannot do what it does not support, by command name."""
    if steer:  # a `specdash serve`: steered over its command route
        return {name: SERVE_UNSTEERABLE for name in CONTROLS if name not in steer}
    if backend == "vllm":
        return {name: READ_ONLY_VLLM for name in CONTROLS}
    if backend == "specdash":
        out = {name: READ_ONLY_SPECDASH for name in CONTROLS}
        out["prompt"] = "another specdash's --metrics-port has no completion endpoint"
        return out
    out = {
        "k": "llama-server sets the draft size at launch (--spec-draft-n-max); "
             + ("use router presets (d)" if router_presets > 1 else
                "start it in router mode with --models-preset to switch presets (d)"),
        "temp": "llama-server's sampling defaults are set at launch; drive-mode prompts use them",
        "adaptive": "llama-server has no adaptive K",
        "experts": "llama-server sets the expert count at launch (--override-kv)",
        "pause": "a server cannot be paused from here",
        "forget": "llama-server keeps no adaptive state to forget",
        "sweep": "a sweep reruns the prompt at each K, and llama-server's K is fixed at launch: "
                 "run `specdash sweep` on the model instead",
    }
    if router_presets < 2:
        out["draft"] = ("llama-server fixes its draft at launch (-md / --spec-type); start it in router "
                        "mode with --models-preset to switch presets (d)")
    return out


@dataclass
class _Drive:
    """Reconstructs speculative steps from llama-server's per-token stream: with
    `timings_per_token` every chunk carries the request's running draft_n and
    draft_n_accepted, which change at the first token of each verified step; that step
    then commits accepted + 1 tokens (the accepted drafts, then the target's own)."""

    k: int | None
    drafter: str
    n_prompt: int = 0
    step: int = 0
    generated: int = 0
    draft_n: int = 0
    accepted_n: int = 0
    num_drafts: int = 0
    per_pos: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    _open: dict[str, Any] | None = None
    _last_t: float = 0.0

    def feed(self, content: str, token: int | None, timings: dict[str, Any] | None) -> Iterator[E.StepEvent]:
        dn = da = 0
        if timings:
            draft_n = int(timings.get("draft_n", 0) or 0)
            accepted_n = int(timings.get("draft_n_accepted", 0) or 0)
            dn, da = max(0, draft_n - self.draft_n), max(0, accepted_n - self.accepted_n)
            self.draft_n, self.accepted_n = max(self.draft_n, draft_n), max(self.accepted_n, accepted_n)
        if self._open is not None and (dn or da):
            yield from self.flush()  # the previous step was cut short (a stop word, the end)
        if self._open is None:
            self._open = {"drafted": dn, "accepted": da, "tokens": [], "pieces": [], "need": da + 1}
            if dn:
                self.num_drafts += 1
                if len(self.per_pos) < max(da, self.k or 0):
                    self.per_pos.extend([0] * (max(da, self.k or 0) - len(self.per_pos)))
                for i in range(da):
                    self.per_pos[i] += 1
        group = self._open
        if token is not None:
            group["tokens"].append(token)
        group["pieces"].append(content)
        self.text.append(content)
        if len(group["pieces"]) >= group["need"]:
            yield from self.flush()

    def finish(self, timings: dict[str, Any] | None) -> Iterator[E.StepEvent]:
        """The end of the stream. A last verification whose tokens were never streamed (the
        end-of-generation token, or the token limit, cut it) shows only in the final
        timings: it becomes a step without tokens, so the steps add up to the server's
        own counts."""
        yield from self.flush()
        if not timings:
            return
        dn = int(timings.get("draft_n", 0) or 0) - self.draft_n
        da = int(timings.get("draft_n_accepted", 0) or 0) - self.accepted_n
        if dn <= 0 and da <= 0:
            return
        self.draft_n += max(0, dn)
        self.accepted_n += max(0, da)
        self._open = {"drafted": max(0, dn), "accepted": max(0, da), "tokens": [], "pieces": [], "need": 0}
        if dn > 0:
            self.num_drafts += 1
            if len(self.per_pos) < max(da, self.k or 0):
                self.per_pos.extend([0] * (max(da, self.k or 0) - len(self.per_pos)))
            for i in range(max(0, da)):
                self.per_pos[i] += 1
        yield from self.flush(allow_empty=True)

    def flush(self, allow_empty: bool = False) -> Iterator[E.StepEvent]:
        group, self._open = self._open, None
        if not group or (not group["pieces"] and not allow_empty):
            return
        t = now()
        elapsed_ms = (t - self._last_t) * 1000.0 if self._last_t else 0.0
        self._last_t = t
        n = len(group["pieces"])
        drafted = group["drafted"]
        # A last verification read only from the final timings may lump steps together:
        # the contract wants accepted <= drafted <= K, so K is at least what was drafted.
        accepted_all = min(group["accepted"], drafted)
        accepted = min(accepted_all, n)
        self.generated += n
        self.step += 1
        yield E.StepEvent(
            step=self.step, k=max(self.k or 0, drafted), drafter=self.drafter if drafted else "none",
            drafted=drafted, accepted=accepted_all, tokens=list(group["tokens"]),
            pieces=list(group["pieces"]), from_draft=[i < accepted for i in range(n)],
            draft_ms=0.0, verify_ms=elapsed_ms, other_ms=0.0, n_past=self.n_prompt + self.generated,
            n_generated=self.generated, t=t)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A request's own speculative numbers, as vLLM returns them with
    --per-request-spec-decode-metrics (vLLM PR #48915): a top-level
    `metrics.speculative_decoding` object in the response, and in a stream in the final
    usage chunk (`choices: []`, with stream_options.include_usage), e.g.

        {"mean_acceptance_length": 1.23, "draft_acceptance_rate": 0.078,
         "acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43,
         "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3}

    `acceptance_histogram[j]`: verify steps that accepted exactly j draft tokens."""

    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    acceptance_histogram: list[int]
    num_spec_tokens: int | None

    def per_pos(self) -> list[int]:
        """Per position i: the steps whose draft position i was accepted (those that
        accepted more than i tokens)."""
        h = self.acceptance_histogram
        return [sum(h[i + 1:]) for i in range(max(len(h) - 1, 0))]

    def summary(self, **kw: Any) -> E.Summary:
        drafts, drafted, accepted = self.num_spec_steps, self.num_draft_tokens, self.num_accepted_draft_tokens
        return E.Summary(
            num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
            num_accepted_tokens_per_pos=self.per_pos(), acceptance_rate=acceptance_rate(accepted, drafted),
            mean_accepted_length=mean_accepted_length(accepted, drafts) or 1.0, prefill_tokens_per_s=0.0,
            draft_ms=0.0, verify_ms=kw["decode_s"] * 1000.0, other_ms=0.0,
            acceptance_histogram=list(self.acceptance_histogram), **kw)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53 else None


def request_spec(response: Any) -> RequestSpec | None:
    """`metrics.speculative_decoding` of a vLLM response or chunk, or None when it has none
    or it is not what vLLM documents (then the /metrics deltas stand in). The histogram is
    a dense list; a sparse {"j": count} object is read as well."""
    metrics = response.get("metrics") if isinstance(response, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    hist = spec.get("acceptance_histogram")
    if isinstance(hist, dict):
        try:
            pairs = {int(j): v for j, v in hist.items()}
        except ValueError:
            return None
        hist = [pairs.get(j, 0) for j in range(max(pairs, default=-1) + 1)] if all(j >= 0 for j in pairs) else None
    if not isinstance(hist, list) or len(hist) > K_CAP + 1 or any(_count(v) is None for v in hist):
        return None
    steps, drafted, accepted = (_count(spec.get(k)) for k in ("num_spec_steps", "num_draft_tokens",
                                                               "num_accepted_draft_tokens"))
    if steps is None or drafted is None or accepted is None or accepted > drafted:
        return None
    return RequestSpec(steps, drafted, accepted, list(hist), _count(spec.get("num_spec_tokens")))


class RemoteSource:
    """One server as a Source (specdash.sources.base). Construct, then `start(emit)`."""

    kind = "remote"
    telemetry: Telemetry = "none"  # a server sends counters, never its machine's load
    # Before the first poll: a prompt waits for the server (drive mode); what else it
    # takes comes with its settings.
    supports: frozenset[str] = frozenset({"prompt", "stop"})
    thread: threading.Thread | None = None  # its threads poll and drive; none worth accounting

    def __init__(self, url: str, *, headers: dict[str, str] | None = None,
                 interval: float = DEFAULT_INTERVAL, window: float = DEFAULT_WINDOW,
                 prompt: str | None = None, prompt_title: str = "", max_tokens: int = DEFAULT_MAX_TOKENS,
                 connect_timeout: float = 2.0, read_timeout: float = 5.0,
                 client: Client | None = None, health: HealthThresholds | None = None):
        self.client = client or Client(parse_url(url), headers, connect_timeout=connect_timeout,
                                       read_timeout=read_timeout)
        self.label = self.client.display
        self.url = self.client.display
        self.interval = interval
        self.max_tokens = max_tokens
        self._window = window  # for again()
        self.health = HealthMonitor(health, label=self.url)  # fed everything this source says
        self._health_lock = threading.Lock()  # the poller and the drive thread both emit
        self.watch = ServerWatch(self.client, window=window)
        self.poller = Poller(self.watch, self._on_poll, interval=interval)
        self._emit: Callable[[Event], None] | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._settings: E.SettingsEvent | None = None
        self._server: E.ServerEvent = E.ServerEvent(url=self.url, state="starting")
        self._status = ""
        self._note = ""  # the reading's note last told (a notice each time it changes)
        self._prompts: queue.Queue[E.NewPrompt | None] = queue.Queue()
        self._driver: threading.Thread | None = None
        self._stream_cancel = threading.Event()
        self._polled = threading.Condition()  # notified after each poll is handled
        self._polls = 0
        if prompt:
            self._prompts.put(E.NewPrompt(prompt, prompt_title or "prompt"))

    # --- Source protocol ---

    def start(self, emit: Callable[[Event], None]) -> None:
        self._emit = emit
        self._status = "loading"
        emit(E.StatusEvent("loading", f"connecting to {self.url}", t=now()))
        self.poller.start()
        self._driver = threading.Thread(target=self._drive_loop, name=f"drive {self.url}", daemon=True)
        self._driver.start()

    def send(self, cmd: E.Command) -> None:
        if self._closed.is_set():
            return
        if isinstance(cmd, E.Stop):
            self.close()
            return
        name = name_of(cmd)
        # Before the first poll nothing is known: a prompt waits, a preset switch probes.
        known = self._settings is not None and name not in self._settings.supports
        if isinstance(cmd, E.NewPrompt) and not known:
            self._prompts.put(cmd)
            return
        if isinstance(cmd, E.SetDrafter) and not known:
            threading.Thread(target=self._switch_preset, args=(cmd,), name=f"preset {self.url}", daemon=True).start()
            return
        if name in self._steerable():
            threading.Thread(target=self._steer, args=(cmd,), name=f"steer {self.url}", daemon=True).start()
            return
        reason = (self._settings.unavailable.get(name) if self._settings else None) or \
            unavailable_controls(self.watch.backend or "llamacpp").get(name) or \
            f"a remote server cannot {cmd.text()!r} from here"
        self._refuse(cmd, f"{reason}")

    def _steerable(self) -> tuple[str, ...]:
        """The commands a `specdash serve` takes over HTTP (its /props says), else ()."""
        own = _dict((self.watch.props or {}).get("specdash"))
        names = own.get("commands") if self.watch.backend == "specdash" and own.get("serve") else None
        return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()

    def _steer(self, cmd: E.Command) -> None:
        """Send `cmd` to a specdash server's command route; it applies it between steps, and
        the next poll shows the settings it took (its /props read again)."""
        try:
            self.client.post_json("/v1/specdash/command", {"command": cmd.text()}, timeout=10.0)
        except RemoteError as exc:
            self._refuse(cmd, f"{exc}")
            return
        self._notice("info", f"{cmd.text()} sent to {self.url}")
        self.watch.reread_props()
        self.poller.wake()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._stream_cancel.set()
        self.poller.stop()
        self._prompts.put(None)
        # The client is closed by the poller thread's exit would race; close it here: an
        # in-flight request fails at once, which the threads treat as the end.
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    # --- for the dashboard and the CLI ---

    def again(self, prompt: WorkItem | None = None) -> RemoteSource:
        """A new source, not started, for the same server with the same options: the
        dashboard restarts a source by closing it and building another (`n` after the
        server went down), and a closed one cannot start again (its poller has run).
        `prompt`: the one typed with `n`, if any."""
        return RemoteSource(self.url, client=self.client.again(), interval=self.interval, window=self._window,
                            prompt=prompt.text if prompt else None, prompt_title=prompt.title if prompt else "",
                            max_tokens=self.max_tokens, health=self.health.th)

    @property
    def server(self) -> E.ServerEvent:
        """The latest fleet row (a copy is not needed: events are replaced, not mutated)."""
        return self._server

    @property
    def settings(self) -> E.SettingsEvent | None:
        return self._settings

    def presets(self) -> list[Preset]:
        """A llama-server router's models, for the `d` picker ([] when not a router)."""
        router = self.watch.router
        if router is None:
            return []
        return [Preset(str(m.get("id")), model_status(m), str(m.get("id")) == router.active)
                for m in router.models]

    def poll_now(self) -> E.ServerEvent:
        """One poll on the caller's thread (not concurrent with the timer's); the row."""
        result = self.poller.poll_once()
        self._on_poll(result)
        return self._server

    # --- polling ---

    def _put(self, ev: Event) -> None:
        """Emit `ev` and what the health rules make of it. The rules are fed even with no
        consumer (`attach --once` polls on its own thread and reads the rows)."""
        if self._closed.is_set():
            return
        with self._health_lock:
            judged = self.health.feed(ev)
            if self._emit is not None:
                for out in in_order(ev, judged):
                    self._emit(out)

    def _notice(self, level: str, message: str) -> None:
        self._put(E.NoticeEvent(level, self.client.redact(message), t=now()))

    def _refuse(self, cmd: E.Command, why: str) -> None:
        self._put(E.NoticeEvent("warning", self.client.redact(f"{cmd.text()} refused: {why}"), t=now(),
                                refused=cmd.text()))

    def _on_poll(self, r: PollResult) -> None:
        try:
            self._handle_poll(r)
        except Exception as exc:  # a bug here must not stop the polls; it is logged
            log.exception("remote source %s: handling a poll failed", self.url)
            # ...and shown: the row would otherwise say "starting" with no reason.
            self._server = E.ServerEvent(url=self.url, state="bad", errors=self.watch.errors,
                                         error=f"{self.url}: handling a poll failed ({describe(exc)})", t=r.t)
            self._put(self._server)
        with self._polled:
            self._polls += 1
            self._polled.notify_all()

    def _poll_after_now(self) -> None:
        """Return once a poll that began after this call has been handled (or the source
        closed, or it took too long). Some of what a request ran with shows only after it
        ran (llama-server's per-position series, whose length is K; a slot's last task),
        so the settings that poll brings describe the request just made. Two polls: the
        first to finish may have begun before this call."""
        limit = 2 * (self.interval + self.client.read_timeout + 2.0)
        for _ in range(2):
            with self._polled:
                seen = self._polls
            self.poller.wake()
            with self._polled:
                if not self._polled.wait_for(lambda: self._polls > seen or self._closed.is_set(), timeout=limit):
                    return

    def _handle_poll(self, r: PollResult) -> None:
        w = self.watch
        if r.ok and r.snapshot is not None:
            if r.props_changed or self._settings is None or self._settings_differ(r.snapshot):
                self._emit_settings(r.snapshot, r.command)
            if self._status != "running":
                self._status = "running"
                self._put(E.StatusEvent("running", f"{self.url}: {w.backend} up", t=r.t))
            if r.reset:
                self._notice("warning", f"{self.url}: counters went down: the server restarted "
                             f"(reset #{w.window.resets}); rates start again from here")
            if r.delta is not None:
                d = r.delta
                self._put(E.CountersEvent(
                    seconds=d.seconds, tokens=d.tokens, steps=d.steps or 0, num_drafts=d.num_drafts,
                    num_draft_tokens=d.num_draft_tokens, num_accepted_tokens=d.num_accepted_tokens,
                    num_accepted_tokens_per_pos=list(d.per_pos), prompt_tokens=d.prompt_tokens,
                    k=r.snapshot.k, t=r.t))
            note = "; ".join(w.notes)
            if note and note != self._note:
                self._notice("warning", f"{self.url}: {note}")
            self._note = note
        else:
            state = w.state  # down | starting | bad
            if self._status != state or r.state_changed:
                self._status = state
                self._put(E.StatusEvent("loading" if state == "starting" else "down", w.error, t=r.t))
        self._server = w.server_event(r.t)
        with self._health_lock:
            judged = self.health.current
        self._server.health, self._server.alarms = judged.verdict, alarms(judged)
        self._put(self._server)

    def _settings_differ(self, snap: Snapshot) -> bool:
        s = self._settings
        return (s is None or s.k != self._k(snap) or s.target != self._target(snap)
                or s.drafter != self._drafter(snap))

    def _target(self, snap: Snapshot) -> str:
        router = self.watch.router
        return (router.active if router and router.active else "") or snap.model or self.url

    def _preset(self) -> dict[str, str]:
        router = self.watch.router
        return preset_options(router.model(router.active)) if router and router.active else {}

    def _draft_path(self) -> str | None:
        return self._preset().get("model-draft") or self._preset().get("spec-draft-model") or None

    def _drafter(self, snap: Snapshot) -> str:
        if isinstance(snap, LlamaCppSnapshot):
            # The slot's last task says what it drafted with ("none,draft-simple"); /props
            # does not (its params are the defaults, not the server's).
            types = next((s.spec_types for s in snap.slots if s.spec_types), "") or \
                self._preset().get("spec-type", "")
            kinds = [t for t in types.split(",") if t.strip() and t.strip() != "none"]
            if kinds:
                return ",".join(t.strip() for t in kinds)
            if snap.counters.per_pos or any(s.speculative for s in snap.slots):
                return "speculative"
            return "none"
        if snap.backend == "specdash":
            return getattr(snap, "drafter", "") or ("speculative" if snap.counters.per_pos else "none")
        return "speculative" if snap.counters.per_pos or snap.counters.num_drafts else "none"

    def _k(self, snap: Snapshot) -> int | None:
        if snap.k is not None:
            return snap.k
        value = self._preset().get("spec-draft-n-max")
        return int(value) if value and value.isdigit() else None

    def _emit_settings(self, snap: Snapshot, command: str = "") -> None:
        props = self.watch.props or {}
        dgs = _dict(props.get("default_generation_settings"))
        params = _dict(dgs.get("params"))
        router = self.watch.router
        n_presets = len(router.models) if router else 0

        def num(key: str) -> float | None:
            v = params.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= 2**53:
                return float(v)
            return None  # absent, or Infinity/NaN/1e300 (json reads them): not a setting

        temperature, top_p = num("temperature"), num("top_p")
        if temperature is not None:
            temperature = max(0.0, temperature)  # llama.cpp: a temperature <= 0 is greedy
        if top_p is not None and not 0.0 <= top_p <= 1.0:
            top_p = None  # not a probability: the contract would refuse a recording of it
        n_predict = num("n_predict")
        seed = num("seed")
        top_k = num("top_k")
        n_ctx = dgs.get("n_ctx")
        path = props.get("model_path")
        steer = self._steerable()
        ev = E.SettingsEvent(
            source="remote", target=self._target(snap), drafter=self._drafter(snap), k=self._k(snap),
            temperature=temperature, top_k=int(top_k) if top_k is not None and 0 <= top_k < 2**31 else None,
            top_p=top_p, seed=int(seed) if seed is not None and 0 <= seed < 2**32 - 1 else None,
            ctx=n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and 0 < n_ctx < 2**32 else None,
            max_tokens=int(n_predict) if n_predict is not None and 0 < n_predict < 2**31 else None,
            target_path=path if isinstance(path, str) and path and path != "none" else None,
            command=command, draft_path=self._draft_path(),
            supports=supported_commands(snap.backend, router_presets=n_presets, steer=steer),
            unavailable=unavailable_controls(snap.backend, router_presets=n_presets, steer=steer), t=now())
        self._settings = ev
        self._put(ev)

    # --- router presets ---

    def _find_preset(self, spec: str) -> str | None:
        router = self.watch.router
        if router is None:
            return None
        ids = [str(m.get("id")) for m in router.models]
        if spec in ids:
            return spec
        for model_id in ids:
            _, _, tail = model_id.rpartition("@")
            if tail == spec or model_id.endswith("@" + spec):
                return model_id
        return None

    def _switch_preset(self, cmd: E.SetDrafter) -> None:
        """Router mode: ask for the preset; the poller shows "starting" until it is loaded,
        then a SettingsEvent whose `command` is this one."""
        w = self.watch
        if w.backend in ("vllm", "specdash"):
            self._refuse(cmd, f"{unavailable_controls(w.backend)['draft']}")
            return
        try:
            # Probe before offering: only a router lists presets under /models.
            with self.poller.lock:
                if w.router is not None:
                    w.refresh_router()
                router = w.router
                if router is None or len(router.models) < 2:
                    self._refuse(cmd, f"{unavailable_controls('llamacpp')['draft']}")
                    return
                target = self._find_preset(cmd.spec)
                if target is None:
                    names = ", ".join(str(m.get("id")) for m in router.models)
                    self._refuse(cmd, f"{self.url} has no preset {cmd.spec!r}; "
                                 f"it offers {names}")
                    return
                current = router.active
                if target == current:
                    self._notice("info", f"{cmd.text()}: {target} is already the active preset")
                    return
                status = model_status(router.model(target) or {})
                w.switch_to(target, cmd.text())
            self._notice("info", f"{cmd.text()}: switching {self.url} from {current} to {target}")
            if current:
                self.client.post_json("/models/unload", {"model": current}, timeout=60.0)
            if status not in ("loaded", "loading"):
                self.client.post_json("/models/load", {"model": target}, timeout=60.0)
            self.poller.wake()
        except RemoteError as exc:
            self._notice("error", f"{cmd.text()} failed: {exc}")

    # --- drive mode ---

    def _drive_loop(self) -> None:
        while not self._closed.is_set():
            item = self._prompts.get()
            if item is None or self._closed.is_set():
                return
            # Wait for the first poll: the backend decides the endpoint.
            deadline = time.monotonic() + 30.0
            while not self.watch.backend and not self._closed.is_set() and time.monotonic() < deadline:
                self._closed.wait(0.1)
            if self._closed.is_set():
                return
            self._stream_cancel.clear()
            try:
                self._drive(item)
            except RemoteError as exc:
                self._notice("error", f"prompt failed: {exc}")
            except Exception as exc:  # noqa: BLE001 - shown, and the source stays alive
                if not self._closed.is_set():
                    log.exception("drive mode on %s", self.url)
                    self._notice("error", self.client.redact(f"prompt failed: {type(exc).__name__}: {exc}"))

    def _metrics_counts(self) -> dict[str, Any] | None:
        """The speculative counters right now (for a prompt's exact per-position counts)."""
        try:
            from specdash.monitor.remote.backends import snapshot as take
            query = {"model": self.watch.router.active, "autoload": "false"} \
                if self.watch.router and self.watch.router.active else None
            scrape = parse(self.client.metrics_text(query))
            backend = scrape.backend()
            if backend is None or scrape.bad_reading() is not None:
                return None
            c = take(scrape, backend).counters
            return {"drafts": c.num_drafts, "draft_tokens": c.num_draft_tokens,
                    "accepted": c.num_accepted_tokens, "per_pos": list(c.per_pos)}
        except (RemoteError, NotMetricsError, ValueError):
            return None

    def _drive(self, cmd: E.NewPrompt) -> None:
        backend = self.watch.backend
        if (backend == "specdash" and not self._steerable()) or not backend:
            reason = unavailable_controls("specdash")["prompt"] if backend else f"{self.url} never answered"
            self._refuse(cmd, reason)
            return
        self._put(E.PromptEvent(cmd.title or "prompt", cmd.text_, t=now()))
        before = self._metrics_counts()
        if backend == "llamacpp":
            summary = self._drive_llamacpp(cmd.text_)
        else:
            summary = self._drive_openai(cmd.text_)
        if summary is None:
            return
        summary.drafter = summary.drafter or (self._settings.drafter if self._settings else "")
        after = self._metrics_counts()
        if before and after and not summary.acceptance_histogram:
            # (A request that reported its own speculative numbers keeps them: the counters
            # move with every other request the server runs meanwhile.)
            d_tokens = after["draft_tokens"] - before["draft_tokens"]
            d_acc = after["accepted"] - before["accepted"]
            exact = backend != "llamacpp" or (d_tokens == summary.num_draft_tokens and d_acc == summary.num_accepted_tokens)
            if exact and (backend != "llamacpp" or d_tokens > 0):
                # The server's own counts for this request (nothing else ran meanwhile).
                summary.num_drafts = int(after["drafts"] - before["drafts"])
                summary.num_draft_tokens = int(d_tokens)
                summary.num_accepted_tokens = int(d_acc)
                n = max(len(after["per_pos"]), len(before["per_pos"]))
                summary.num_accepted_tokens_per_pos = [
                    int((after["per_pos"][i] if i < len(after["per_pos"]) else 0)
                        - (before["per_pos"][i] if i < len(before["per_pos"]) else 0)) for i in range(n)]
                summary.acceptance_rate = acceptance_rate(summary.num_accepted_tokens, summary.num_draft_tokens)
                summary.mean_accepted_length = mean_accepted_length(
                    summary.num_accepted_tokens, summary.num_drafts) or 1.0
        # The summary closes the request's events: the settings before it are the server's
        # as of this request (a recording attributes them to it).
        self._poll_after_now()
        summary.t = now()
        self._put(summary)

    def _drive_llamacpp(self, prompt: str) -> E.Summary | None:
        settings = self._settings
        drive = _Drive(k=settings.k if settings else None, drafter=settings.drafter if settings else "speculative")
        body: dict[str, Any] = {"prompt": prompt, "stream": True, "n_predict": self.max_tokens,
                                "timings_per_token": True}
        if self.watch.router and self.watch.router.active:
            body["model"] = self.watch.router.active
        final: dict[str, Any] = {}
        prefilled = False
        t0 = now()
        for chunk in self.client.stream_events("/completion", body):
            if self._stream_cancel.is_set():
                break
            if "error" in chunk:
                err = chunk["error"]
                msg = err.get("message") if isinstance(err, dict) else str(err)
                raise RemoteError("http", f"{self.url}/completion: {msg}")
            timings = _dict(chunk.get("timings")) or None
            if not prefilled and timings and (chunk.get("content") or chunk.get("stop")):
                prefilled = True
                drive.n_prompt = int(chunk.get("tokens_evaluated") or timings.get("prompt_n") or 0)
                self._put(E.PrefillEvent(int(timings.get("prompt_n") or 0), float(timings.get("prompt_ms") or 0.0), t=now()))
            content = chunk.get("content")
            tokens = chunk.get("tokens") if isinstance(chunk.get("tokens"), list) else []
            if isinstance(content, str) and (content or tokens) and not chunk.get("stop"):
                token = tokens[0] if tokens and isinstance(tokens[0], int) else None
                for step in drive.feed(content, token, timings):
                    self._put(step)
            if chunk.get("stop"):
                final = chunk
                if isinstance(content, str) and content:
                    for step in drive.feed(content, None, timings):
                        self._put(step)
                break
        for step in drive.finish(_dict(final.get("timings")) or None):
            self._put(step)
        if self._closed.is_set():
            return None
        timings = _dict(final.get("timings"))
        stopped = not final
        stop_type = str(final.get("stop_type", ""))
        stop_reason = ("stopped" if stopped else "context" if final.get("truncated") else
                       "max_tokens" if stop_type == "limit" else "eos")
        n_gen = int(timings.get("predicted_n") or final.get("tokens_predicted") or drive.generated)
        draft_n = int(timings.get("draft_n") or drive.draft_n)
        acc_n = int(timings.get("draft_n_accepted") or drive.accepted_n)
        predicted_ms = float(timings.get("predicted_ms") or (now() - t0) * 1000.0)
        return E.Summary(
            text="".join(drive.text), stop_reason=stop_reason,
            n_prompt=int(final.get("tokens_evaluated") or timings.get("prompt_n") or drive.n_prompt),
            n_generated=n_gen, num_drafts=drive.num_drafts, num_draft_tokens=draft_n,
            num_accepted_tokens=acc_n, num_accepted_tokens_per_pos=list(drive.per_pos),
            acceptance_rate=acceptance_rate(acc_n, draft_n),
            mean_accepted_length=mean_accepted_length(acc_n, drive.num_drafts) or 1.0,
            tokens_per_s=float(timings.get("predicted_per_second") or 0.0),
            prefill_tokens_per_s=float(timings.get("prompt_per_second") or 0.0),
            prefill_ms=float(timings.get("prompt_ms") or 0.0), decode_s=predicted_ms / 1000.0,
            draft_ms=0.0, verify_ms=predicted_ms, other_ms=0.0, steps=drive.step)

    def _drive_openai(self, prompt: str) -> E.Summary | None:
        """vLLM (or any OpenAI-compatible server): /v1/completions, streamed. No per-step
        speculative detail comes back; the summary's come from /metrics deltas."""
        model = self.watch.last.model.split(", ")[0] if self.watch.last else ""
        body: dict[str, Any] = {"prompt": prompt, "stream": True, "max_tokens": self.max_tokens,
                                "stream_options": {"include_usage": True}}
        if model:
            body["model"] = model
        t0 = now()
        first: float | None = None
        last = t0
        text: list[str] = []
        usage: dict[str, Any] = {}
        spec: RequestSpec | None = None
        finish = ""
        step = 0
        for chunk in self.client.stream_events("/v1/completions", body):
            if self._stream_cancel.is_set():
                break
            if "error" in chunk:
                err = chunk["error"]
                msg = err.get("message") if isinstance(err, dict) else str(err)
                raise RemoteError("http", f"{self.url}/v1/completions: {msg}")
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            spec = request_spec(chunk) or spec
            for choice in chunk.get("choices") or []:
                piece = choice.get("text") if isinstance(choice, dict) else None
                if isinstance(choice, dict) and choice.get("finish_reason"):
                    finish = str(choice["finish_reason"])
                if not isinstance(piece, str) or not piece:
                    continue
                t = now()
                if first is None:
                    first = t
                    self._put(E.PrefillEvent(int(usage.get("prompt_tokens") or 0), (t - t0) * 1000.0, t=t))
                step += 1
                text.append(piece)
                self._put(E.StepEvent(step=step, k=self._settings.k or 0 if self._settings else 0,
                                      drafter="none", drafted=0, accepted=0, tokens=[], pieces=[piece],
                                      from_draft=[False], draft_ms=0.0, verify_ms=(t - last) * 1000.0,
                                      other_ms=0.0, n_past=step, n_generated=step, t=t))
                last = t
        if self._closed.is_set():
            return None
        n_gen = int(usage.get("completion_tokens") or step)
        decode_s = max(0.0, last - (first or last))
        if spec is not None:
            return spec.summary(
                text="".join(text), stop_reason="max_tokens" if finish == "length" else "eos" if finish else "stopped",
                n_prompt=int(usage.get("prompt_tokens") or 0), n_generated=n_gen,
                tokens_per_s=(n_gen - 1) / decode_s if decode_s > 0 and n_gen > 1 else 0.0,
                prefill_ms=((first or t0) - t0) * 1000.0, decode_s=decode_s, steps=step)
        return E.Summary(
            text="".join(text), stop_reason="max_tokens" if finish == "length" else "eos" if finish else "stopped",
            n_prompt=int(usage.get("prompt_tokens") or 0), n_generated=n_gen, num_drafts=0,
            num_draft_tokens=0, num_accepted_tokens=0, num_accepted_tokens_per_pos=[],
            acceptance_rate=None, mean_accepted_length=1.0,
            tokens_per_s=(n_gen - 1) / decode_s if decode_s > 0 and n_gen > 1 else 0.0,
            prefill_tokens_per_s=0.0, prefill_ms=((first or t0) - t0) * 1000.0, decode_s=decode_s,
            draft_ms=0.0, verify_ms=decode_s * 1000.0, other_ms=0.0, steps=step)
