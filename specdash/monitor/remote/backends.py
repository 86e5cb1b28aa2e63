"""Per backend, a typed snapshot of the numbers that matter, read from one scrape.

Every snapshot reduces to `Counters`: monotonic totals since the server started, named
as in the event contract (vLLM's speculative names), which window.py turns into deltas.
What each backend exposes, checked against its source:

llama.cpp (tools/server/server-task.cpp, `server_task_result_metrics::to_metrics`):
    counters  llamacpp:prompt_tokens_total, tokens_predicted_total, n_decode_total,
              spec_decode_num_drafts_total (verification steps), spec_decode_num_draft_tokens_total,
              spec_decode_num_accepted_tokens_total,
              spec_decode_num_accepted_tokens_per_pos_total{position}
    gauges    requests_processing, requests_deferred
    NEVER     prompt_tokens_seconds / predicted_tokens_seconds: averages over the window
              between two scrapes, reset by every scrape (ours or anyone else's)
    trap      the token and speculative counters move only when a request ends
              (`metrics_on_prediction` on release), so the live token count adds the
              in-flight `n_decoded` of every busy slot from /slots.

vLLM (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py), labelled
model_name and engine (summed over engines):
    counters  vllm:generation_tokens_total, prompt_tokens_total, spec_decode_num_drafts_total,
              spec_decode_num_draft_tokens_total, spec_decode_num_accepted_tokens_total,
              spec_decode_num_accepted_tokens_per_pos_total{position}, each with `_created`
    gauges    num_requests_running, num_requests_waiting, kv_cache_usage_perc
              (gpu_cache_usage_perc before 0.9)
    histos    time_to_first_token_seconds, inter_token_latency_seconds
              (time_per_output_token_seconds before it)

specdash (specdash/monitor/metrics_exporter.py): vLLM's names under `specdash_` (`specdash:` before issue 42), or
vLLM's own `vllm:` names beside `specdash_build_info` (--metrics-names vllm).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdash.contract.names import display_name
from specdash.monitor.remote.metrics import MAX_POSITIONS, MAX_READING, Scrape, histogram_buckets

TTFT = "ttft"
ITL = "itl"


@dataclass(slots=True)
class Counters:
    """Totals since the server (re)started. `raw` holds the server's own counters,
    untouched, for reset detection: `tokens` may include in-flight work that can move
    in ways a counter never does."""

    tokens: float = 0.0  # generated
    prompt_tokens: float = 0.0
    steps: float | None = None  # decode steps, when the backend says
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    per_pos: list[float] = field(default_factory=list)
    histograms: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # cumulative buckets
    raw: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Snapshot:
    backend: str
    counters: Counters
    model: str = ""
    requests_running: int | None = None
    requests_waiting: int | None = None
    kv_cache_usage: float | None = None
    k: int | None = None  # draft length: per-position series count, or what the server says
    # Something that changes when the server process restarts (vLLM's `_created`, a start
    # time), None when the backend has none: then only a counter going down tells.
    start_marker: float | None = None
    start_time: float | None = None  # server process start, Unix seconds, when exposed
    notes: list[str] = field(default_factory=list)  # what was left out of this reading, and why


@dataclass(slots=True)
class SlotInfo:
    """One llama-server slot from /slots (server-context.cpp `server_slot::to_json`)."""

    id: int
    is_processing: bool
    id_task: int | None
    n_decoded: int
    n_ctx: int | None = None
    speculative: bool | None = None  # the server can speculate on this slot
    spec_types: str = ""  # params["speculative.types"] of the slot's last task


@dataclass(slots=True)
class LlamaCppSnapshot(Snapshot):
    tokens_predicted_total: float = 0.0
    n_decode_total: float = 0.0
    in_flight_tokens: int = 0  # n_decoded of the busy slots (not yet in the counters)
    slots: list[SlotInfo] = field(default_factory=list)


@dataclass(slots=True)
class VllmSnapshot(Snapshot):
    engines: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SpecdashSnapshot(Snapshot):
    drafter: str = ""


def _int(x: float | None) -> int | None:
    return None if x is None else int(round(x))


def _per_pos(scrape: Scrape, name: str) -> tuple[list[float], int]:
    """The per-position counts, positions 0..MAX_POSITIONS-1, and how many series lay
    beyond (dropped: parse() drops most before parsing, this the rest)."""
    by_pos = scrape.by_label(name, "position")
    positions: dict[int, float] = {}
    dropped = scrape.dropped_positions
    for key, value in by_pos.items():
        try:
            pos = int(key)
        except ValueError:
            continue
        if 0 <= pos < MAX_POSITIONS:
            positions[pos] = value
        elif pos >= MAX_POSITIONS:
            dropped += 1
    if not positions:
        return [], dropped
    return [positions.get(i, 0.0) for i in range(max(positions) + 1)], dropped


def per_pos_note(dropped: int) -> str:
    return (f"{dropped} per-position series at position {MAX_POSITIONS} or beyond were dropped: "
            f"no drafter drafts that far (specdash shows positions 0-{MAX_POSITIONS - 1})")


def _spec(scrape: Scrape, prefix: str, c: Counters, notes: list[str]) -> None:
    c.num_drafts = scrape.value(prefix + "spec_decode_num_drafts_total", 0.0) or 0.0
    c.num_draft_tokens = scrape.value(prefix + "spec_decode_num_draft_tokens_total", 0.0) or 0.0
    c.num_accepted_tokens = scrape.value(prefix + "spec_decode_num_accepted_tokens_total", 0.0) or 0.0
    c.per_pos, dropped = _per_pos(scrape, prefix + "spec_decode_num_accepted_tokens_per_pos_total")
    if dropped:
        notes.append(per_pos_note(dropped))
    c.raw.update(num_drafts=c.num_drafts, num_draft_tokens=c.num_draft_tokens,
                 num_accepted_tokens=c.num_accepted_tokens)


def _count(value: Any) -> int:
    """A JSON count from /slots: a whole number 0..2^53, else 0 (Python's json reads
    `Infinity`, `NaN` and `1e400`; none of them is a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value) if 0 <= value <= MAX_READING else 0  # NaN fails the comparison


def parse_slots(data: Any) -> list[SlotInfo]:
    """/slots JSON -> slots; tolerant of fields a build leaves out, and of nonsense."""
    out: list[SlotInfo] = []
    if not isinstance(data, list):
        return out
    for item in data:
        if not isinstance(item, dict):
            continue
        n_decoded = 0
        next_token = item.get("next_token")
        if isinstance(next_token, list) and next_token and isinstance(next_token[0], dict):
            n_decoded = _count(next_token[0].get("n_decoded"))
        elif isinstance(next_token, dict):
            n_decoded = _count(next_token.get("n_decoded"))
        id_task = item.get("id_task")
        raw_params = item.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        n_ctx = item.get("n_ctx")
        slot_id = item.get("id")
        out.append(SlotInfo(
            id=slot_id if isinstance(slot_id, int) and not isinstance(slot_id, bool) else len(out),
            is_processing=bool(item.get("is_processing", False)),
            id_task=id_task if isinstance(id_task, int) and not isinstance(id_task, bool) else None,
            n_decoded=n_decoded,
            n_ctx=n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None,
            speculative=item.get("speculative") if isinstance(item.get("speculative"), bool) else None,
            spec_types=str(params.get("speculative.types") or ""),
        ))
    return out


def model_from_props(props: dict[str, Any] | None) -> str:
    """llama-server /props -> the model's name: its alias, else the file's stem."""
    if not props:
        return ""
    alias = props.get("model_alias")
    path = props.get("model_path")
    if isinstance(alias, str) and alias and alias != "llama-server":
        # The server sets the alias to the file name when none was given (server.cpp).
        return display_name(alias)
    if isinstance(path, str) and path and path != "none":
        return display_name(path)
    return ""


def llamacpp_snapshot(scrape: Scrape, slots: list[SlotInfo] | None = None,
                      props: dict[str, Any] | None = None) -> LlamaCppSnapshot:
    p = "llamacpp:"
    c = Counters()
    predicted = scrape.value(p + "tokens_predicted_total", 0.0) or 0.0
    n_decode = scrape.value(p + "n_decode_total", 0.0) or 0.0
    c.prompt_tokens = scrape.value(p + "prompt_tokens_total", 0.0) or 0.0
    c.steps = n_decode
    notes: list[str] = []
    _spec(scrape, p, c, notes)
    c.raw.update(tokens_predicted=predicted, n_decode=n_decode, prompt_tokens=c.prompt_tokens)
    in_flight = sum(s.n_decoded for s in slots or [] if s.is_processing)
    c.tokens = predicted + in_flight
    return LlamaCppSnapshot(
        backend="llamacpp", counters=c, model=model_from_props(props),
        requests_running=_int(scrape.value(p + "requests_processing")),
        requests_waiting=_int(scrape.value(p + "requests_deferred")),
        k=len(c.per_pos) or None,
        tokens_predicted_total=predicted, n_decode_total=n_decode,
        in_flight_tokens=in_flight, slots=list(slots or []), notes=notes,
    )


def _created(scrape: Scrape, prefix: str) -> float | None:
    """The earliest `_created` of the counters we read: a new value = a new process."""
    names = ("generation_tokens_created", "prompt_tokens_created", "spec_decode_num_drafts_created")
    values = [s.value for n in names for s in scrape.get(prefix + n)]
    return min(values) if values else None


def vllm_snapshot(scrape: Scrape) -> VllmSnapshot:
    p = "vllm:"
    c = Counters()
    c.tokens = scrape.value(p + "generation_tokens_total", 0.0) or 0.0
    c.prompt_tokens = scrape.value(p + "prompt_tokens_total", 0.0) or 0.0
    notes: list[str] = []
    _spec(scrape, p, c, notes)
    # vLLM commits accepted + 1 tokens per decode step of a request: steps = tokens - accepted.
    c.steps = max(0.0, c.tokens - c.num_accepted_tokens)
    c.raw.update(tokens=c.tokens, prompt_tokens=c.prompt_tokens)
    ttft = histogram_buckets(scrape, p + "time_to_first_token_seconds")
    itl = histogram_buckets(scrape, p + "inter_token_latency_seconds") or \
        histogram_buckets(scrape, p + "time_per_output_token_seconds")
    if ttft:
        c.histograms[TTFT] = ttft
    if itl:
        c.histograms[ITL] = itl
    kv = scrape.value(p + "kv_cache_usage_perc")
    if kv is None:
        kv = scrape.value(p + "gpu_cache_usage_perc")
    engines = scrape.label_values(p + "num_requests_running", "engine")
    if kv is not None and len(engines) > 1:
        kv /= len(engines)  # a share per engine: show the mean, not the sum
    models: list[str] = []
    for name in (p + "num_requests_running", p + "generation_tokens_total", p + "spec_decode_num_drafts_total"):
        for m in scrape.label_values(name, "model_name"):
            if m not in models:
                models.append(m)
    start = scrape.value("process_start_time_seconds")
    created = _created(scrape, p)
    return VllmSnapshot(
        backend="vllm", counters=c, model=", ".join(models),
        requests_running=_int(scrape.value(p + "num_requests_running")),
        requests_waiting=_int(scrape.value(p + "num_requests_waiting")),
        kv_cache_usage=kv, k=len(c.per_pos) or None,
        start_marker=created if created is not None else start,
        start_time=start if start is not None else created,
        engines=engines, models=models, notes=notes,
    )


def specdash_prefixes(scrape: Scrape) -> tuple[str, str]:
    """(prefix of the series vLLM has too, prefix of specdash's own) in this exposition:
    `specdash:` for both before issue 42; now `specdash_`, or `vllm:` for the shared ones
    under --metrics-names vllm."""
    if any(name.startswith("specdash:") for name in scrape.names()):
        return "specdash:", "specdash:"
    return ("vllm:" if scrape.has("vllm:generation_tokens_total") else "specdash_"), "specdash_"


def specdash_snapshot(scrape: Scrape) -> SpecdashSnapshot:
    p, own = specdash_prefixes(scrape)
    c = Counters()
    c.tokens = scrape.value(p + "generation_tokens_total", 0.0) or 0.0
    c.prompt_tokens = scrape.value(p + "prompt_tokens_total", 0.0) or 0.0
    notes: list[str] = []
    _spec(scrape, p, c, notes)
    steps = scrape.value(own + "decode_steps_total")
    c.steps = steps if steps is not None else max(0.0, c.tokens - c.num_accepted_tokens)
    c.raw.update(tokens=c.tokens, prompt_tokens=c.prompt_tokens)
    info = scrape.get(own + "model_info")
    model = info[0].labels.get("target", "") if info else ""
    drafter = info[0].labels.get("drafter", "") if info else ""
    k = scrape.value(own + "num_speculative_tokens")
    start = scrape.value("process_start_time_seconds")
    return SpecdashSnapshot(
        backend="specdash", counters=c, model=model,
        requests_running=_int(scrape.value(p + "num_requests_running")),
        requests_waiting=_int(scrape.value(p + "num_requests_waiting")),
        k=_int(k) if k and k <= MAX_POSITIONS else (len(c.per_pos) or None),
        start_marker=start, start_time=start, drafter=drafter, notes=notes,
    )


def snapshot(scrape: Scrape, backend: str, *, slots: list[SlotInfo] | None = None,
             props: dict[str, Any] | None = None) -> Snapshot:
    if backend == "llamacpp":
        return llamacpp_snapshot(scrape, slots, props)
    if backend == "vllm":
        return vllm_snapshot(scrape)
    if backend == "specdash":
        return specdash_snapshot(scrape)
    raise ValueError(f"unknown backend {backend!r}")
