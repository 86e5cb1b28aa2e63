"""`--metrics-port N`: the embedded engine's numbers as Prometheus text on 127.0.0.1:N.

Names follow Prometheus' rules (issue 42): a `specdash_` prefix, base units, `_total` on
counters, `_seconds` histograms. The series are vLLM's (vllm/v1/spec_decode/metrics.py,
vllm/v1/metrics/loggers.py) with vLLM's `model_name` and `engine` labels:

    specdash_spec_decode_num_drafts_total                      drafting steps
    specdash_spec_decode_num_draft_tokens_total                drafted tokens
    specdash_spec_decode_num_accepted_tokens_total             accepted drafted tokens
    specdash_spec_decode_num_accepted_tokens_per_pos_total{position}  drafts whose
                                                               position i was accepted
    specdash_generation_tokens_total, specdash_prompt_tokens_total
    specdash_request_success_total{finished_reason}
    specdash_num_requests_running, specdash_num_requests_waiting
    specdash_time_to_first_token_seconds                       histogram, per run/request
    specdash_inter_token_latency_seconds                       histogram, one observation
                                                               per step (per streamed
                                                               output, as vLLM counts)
and specdash's own:
    specdash_decode_steps_total                                engine steps (target passes)
    specdash_source_draft_tokens_total{drafter}                drafted tokens by the source
    specdash_source_accepted_tokens_total{drafter}             accepted ones (grammar: a
                                                               grammar's fixed text)
    specdash_num_speculative_tokens                            K in force
    specdash_model_info{target,drafter}                        1
    specdash_build_info{version,llama_cpp_python,names}        1: says a specdash wrote it
    specdash_health_acceptance_collapse, ..._acceptance_repetition, ..._decode_stall,
    specdash_health_speculation_not_paying                     1 while that health rule
                                                               is in alarm, else 0
                                                               (specdash/monitor/health.py)
    specdash_health_verdict{verdict}                           1 for the verdict in force
    process_*                                                  (start time, CPU, memory)

`--metrics-names vllm` exports the series vLLM has under vLLM's own names (`vllm:...`,
as vLLM's Grafana boards query them; vLLM's colon breaks Prometheus' rule, which reserves
colons for recording rules, so it is not the default); specdash's own series keep their
`specdash_` names, and `specdash_build_info` tells a reader (attach, the fleet) that this
is a specdash, not a vLLM. Before issue 42 the prefix was `specdash:`; readers still
take that.

Its own CollectorRegistry (never the global one) and prometheus_client's own HTTP
server thread. No Textual. Feed it contract events from any thread.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

from specdash import __version__
from specdash.contract import events as E
from specdash.contract.errors import SpecdashError
from specdash.monitor.health import RULES, TITLES, VERDICTS

OWN = "specdash_"  # specdash's own series, under either naming
NAMINGS = {"specdash": OWN, "vllm": "vllm:"}  # --metrics-names: the prefix of the series vLLM has too
LABELS = ["model_name", "engine"]
# Why serve refused a request (specdash_http_refusals_total{reason}); each starts at zero.
REFUSALS = ("host", "origin", "content_type", "auth", "steer", "body_too_large", "queue_full", "timeout",
            "slow_reader")
ENGINE = "0"
# vLLM's buckets (vllm/v1/metrics/buckets.py), so its boards' quantiles read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)


def check_names(names: str, flag: str = "--metrics-names") -> str:
    if names not in NAMINGS:
        raise SpecdashError(f"{flag} {names!r}: must be one of {', '.join(NAMINGS)}")
    return names


class MetricsExporter:
    """Serves Prometheus text on `host:port` until `close()`. `port=0` picks a free port
    (see `.port`); `port=None` serves nothing: `specdash serve` puts `.registry` on its own
    /metrics route."""

    def __init__(self, port: int | None, host: str = "127.0.0.1", names: str = "specdash"):
        if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535):
            raise SpecdashError(f"--metrics-port {port!r}: must be a port number 1..65535")
        shared = NAMINGS[check_names(names)]
        self.names = names
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._drafts = Counter(shared + "spec_decode_num_drafts", "Number of spec decoding drafts.", LABELS, registry=r)
        self._draft_tokens = Counter(shared + "spec_decode_num_draft_tokens", "Number of draft tokens.", LABELS, registry=r)
        self._accepted = Counter(shared + "spec_decode_num_accepted_tokens", "Number of accepted tokens.", LABELS, registry=r)
        self._per_pos = Counter(shared + "spec_decode_num_accepted_tokens_per_pos",
                                "Accepted tokens per draft position.", LABELS + ["position"], registry=r)
        self._generation = Counter(shared + "generation_tokens", "Number of generation tokens processed.", LABELS, registry=r)
        self._prompt = Counter(shared + "prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r)
        self._success = Counter(shared + "request_success", "Count of successfully processed requests.",
                                LABELS + ["finished_reason"], registry=r)
        self._running = Gauge(shared + "num_requests_running", "Number of requests in model execution.", LABELS, registry=r)
        self._waiting = Gauge(shared + "num_requests_waiting", "Number of requests waiting to be processed.", LABELS, registry=r)
        self._ttft = Histogram(shared + "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               LABELS, buckets=TTFT_BUCKETS, registry=r)
        self._itl = Histogram(shared + "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                              LABELS, buckets=ITL_BUCKETS, registry=r)
        self._steps = Counter(OWN + "decode_steps", "Engine steps (one target pass each).", LABELS, registry=r)
        # By the source that drafted the step (lookup, suffix, draft, grammar, ...): which one earns.
        self._by_source = Counter(OWN + "source_draft_tokens", "Drafted tokens, by the source that drafted them.",
                                  LABELS + ["drafter"], registry=r)
        self._by_source_accepted = Counter(OWN + "source_accepted_tokens", "Accepted drafted tokens, by the "
                                           "source that drafted them.", LABELS + ["drafter"], registry=r)
        # The HTTP server's refusals (serve/http.py), by reason: specdash's own under either naming.
        self._refusals = Counter(OWN + "http_refusals", "Requests the HTTP server refused or ended at a limit, "
                                 "by reason.", ["reason"], registry=r)
        for reason in REFUSALS:
            self._refusals.labels(reason)
        self._k = Gauge(OWN + "num_speculative_tokens", "K in force (tokens drafted per step).", LABELS, registry=r)
        self._info = Gauge(OWN + "model_info", "The target and the draft source; value 1.", ["target", "drafter"], registry=r)
        # A gauge per health rule (1 = in alarm), so an alert names the rule; and the verdict.
        self._health = {name: Gauge(OWN + "health_" + name, f"1 while the health rule '{TITLES[name]}' is in "
                                    "alarm, else 0.", LABELS, registry=r) for name in RULES}
        self._verdict = Gauge(OWN + "health_verdict", "1 for the speculation health verdict in force.",
                              LABELS + ["verdict"], registry=r)
        Gauge(OWN + "build_info", "The specdash that exports these series, and its naming; value 1.",
              ["version", "llama_cpp_python", "names"], registry=r).labels(__version__, _llama_cpp_version(), names).set(1)
        # Each model's series: created at zero when it is first seen (_touch), dropped with
        # the placeholder model (_settings).
        self._model_counters = (self._drafts, self._draft_tokens, self._accepted, self._generation, self._prompt,
                                self._steps, self._ttft, self._itl)
        self._model_gauges = (self._running, self._waiting, *self._health.values())
        # When the run in progress started (its prefill), and its last step: the latencies.
        self._started: float | None = None
        self._last_step: float | None = None
        ProcessCollector(registry=r)
        self._lock = threading.Lock()
        self._model = "specdash"
        self._info_labels: tuple[str, str] | None = None
        self._labels_seen: set[str] = set()
        self._counted = False
        self._touch(self._model)
        self.host = host
        self._closed = False
        self._server: Any = None
        if port is None:
            self.port = 0
            return
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=r)
        except OSError as exc:
            raise SpecdashError(f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                                f"pick a free port") from None
        self.port = self._server.server_address[1]

    def refused(self, reason: str) -> None:
        """One request refused by the HTTP server (a reason of REFUSALS)."""
        self._refusals.labels(reason).inc()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _touch(self, model: str) -> None:
        """Create a label set's series at zero (vLLM shows every series from the start)."""
        if model in self._labels_seen:
            return
        self._labels_seen.add(model)
        for c in self._model_counters:
            c.labels(model, ENGINE)
        for g in self._model_gauges:
            g.labels(model, ENGINE).set(0)
        for word in VERDICTS:
            self._verdict.labels(model, ENGINE, word).set(1 if word == "unknown" else 0)

    def feed(self, event: Any) -> None:
        """Fold one contract event into the counters. Unknown events are ignored."""
        with self._lock:
            lv = (self._model, ENGINE)
            if isinstance(event, (E.StepEvent, E.PrefillEvent, E.Summary)):
                self._counted = True
            if isinstance(event, E.StepEvent):
                self._latency(event.t, lv)
                n = len(event.tokens) or len(event.pieces)
                self._generation.labels(*lv).inc(n)
                self._steps.labels(*lv).inc()
                if event.drafted > 0:
                    self._drafts.labels(*lv).inc()
                    self._draft_tokens.labels(*lv).inc(event.drafted)
                    self._accepted.labels(*lv).inc(event.accepted)
                    for i in range(event.accepted):
                        self._per_pos.labels(*lv, str(i)).inc()
                    self._by_source.labels(*lv, event.drafter).inc(event.drafted)
                    self._by_source_accepted.labels(*lv, event.drafter).inc(event.accepted)
                self._running.labels(*lv).set(1)
            elif isinstance(event, E.PrefillEvent):
                self._started, self._last_step = event.t - event.ms / 1e3, None
                self._prompt.labels(*lv).inc(event.n_tokens)
                self._running.labels(*lv).set(1)
            elif isinstance(event, E.PromptEvent):
                self._running.labels(*lv).set(1)
            elif isinstance(event, E.Summary):
                self._started = self._last_step = None
                self._success.labels(*lv, _finish_reason(event.stop_reason)).inc()
                self._running.labels(*lv).set(0)
            elif isinstance(event, E.StatusEvent):
                if event.state in ("ended", "error", "idle", "down"):
                    self._running.labels(*lv).set(0)
            elif isinstance(event, E.SettingsEvent):
                self._settings(event)
            elif isinstance(event, E.QueueEvent):  # a server's: the counts are exact
                self._running.labels(*lv).set(len(event.running))
                self._waiting.labels(*lv).set(len(event.waiting))
            elif isinstance(event, E.HealthEvent):
                for rule in event.rules:
                    if rule.name in self._health:
                        self._health[rule.name].labels(*lv).set(1 if rule.state == "alarm" else 0)
                for word in VERDICTS:
                    self._verdict.labels(*lv, word).set(1 if word == event.verdict else 0)

    def _latency(self, t: float, lv: tuple[str, str]) -> None:
        """A step at time t: the run's first token (time from its prefill's start), or
        one more streamed output (time since the step before)."""
        if not t:
            return
        if self._started is not None:
            self._ttft.labels(*lv).observe(max(0.0, t - self._started))
            self._started = None
        elif self._last_step is not None:
            self._itl.labels(*lv).observe(max(0.0, t - self._last_step))
        self._last_step = t

    def _settings(self, s: E.SettingsEvent) -> None:
        model = s.target or "specdash"
        if model != self._model:
            old = self._model
            self._running.labels(old, ENGINE).set(0)
            self._model = model
            self._touch(model)
            if old == "specdash" and not self._counted:
                # The placeholder series from before the first settings: nothing was counted
                # under it, so it goes (totals are unchanged).
                for metric in (*self._model_counters, *self._model_gauges):
                    try:
                        metric.remove(old, ENGINE)
                    except KeyError:
                        pass
                for word in VERDICTS:
                    try:
                        self._verdict.remove(old, ENGINE, word)
                    except KeyError:
                        pass
                self._labels_seen.discard(old)
        lv = (self._model, ENGINE)
        k = s.k or 0
        self._k.labels(*lv).set(k)
        for i in range(k):
            self._per_pos.labels(*lv, str(i))
        info = (s.target, s.drafter)
        if info != self._info_labels:
            if self._info_labels is not None:
                try:
                    self._info.remove(*self._info_labels)
                except KeyError:
                    pass
            self._info.labels(*info).set(1)
            self._info_labels = info

    def close(self) -> None:
        """Stop serving; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2.0)


def _finish_reason(stop_reason: str) -> str:
    """vLLM's finished_reason values: stop | length | abort (a served request's stop string
    is a stop; a client that left, an abort)."""
    return {"eos": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}.get(stop_reason, "abort")


def _llama_cpp_version() -> str:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:  # a wheel without metadata: the build info says so instead of failing
        return "unknown"
