"""The event contract: what every source says and every command it may be sent.

A *source* is anything that yields these events and accepts these commands: the
embedded engine, a recording played back, a remote server. The dashboard, `run --json`,
recordings and the bench all speak only this, so the panels draw every source alike;
where sources differ they ask for a capability (`supports`), never the source's kind.

Events (`event` is the tag in JSON; every dict also carries `schema`):

    settings   the full settings snapshot, at start and after every change (`command`
               names the change), plus the commands the source takes now (`supports`)
               and why it refuses others
    status     the source's lifecycle: loading (with progress), ready, running, idle,
               error, down (a remote server that stopped answering), ended
    prompt     a new prompt started (the generation panel's title and text)
    prefill    the prompt was processed (tokens, milliseconds)
    step       one speculative step: drafted, accepted, K, the drafter, timings, and the
               committed tokens with their provenance (draft or target)
    counters   a remote source's counter deltas over one poll: the same totals as a run of
               steps (drafts, draft tokens, accepted, per position), without per-step detail
    notice     something to tell the operator: a command refused, a reload, a warning
    summary    one prompt's totals
    telemetry  one sample of per-core load, NUMA memory and the process footprint
    server     one remote server's state for the fleet table
    replay     where a replay stands (position, speed); `rewind` starts the state over
    health     the speculation health verdict and each rule's state (specdash/monitor/health.py),
               whenever a rule changes state

Time: `t` is seconds on the source's monotonic clock (time.perf_counter() here). Only
differences mean anything; a recording's header gives the wall-clock start.

Compatibility: `SCHEMA` grows by one when a field changes meaning or a required field is
added. Readers accept unknown extra fields (a newer minor writer) and refuse a newer
schema with a message that says so.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from specdash.contract.limits import K_CAP
from specdash.telemetry.numa import NumaNode, NumaStat
from specdash.telemetry.process import ProcessStats

SCHEMA = 1


def now() -> float:
    """The clock every event's `t` is on."""
    return time.perf_counter()


class ContractError(ValueError):
    """A dict that is not a valid event or command; the message says which field."""


# --- events -------------------------------------------------------------------------


@dataclass(slots=True)
class SettingsEvent:
    """The live settings, complete. Field names are those of engine.settings.LIMITS; a
    remote source leaves what it cannot know as None."""

    source: str  # "engine" | "remote" | "replay"
    target: str
    drafter: str  # what drafts, as shown: a model name, "lookup", "chain(lookup, suffix, X)"
    draft: str | None = None  # the drafter spec the settings hold
    draft_model: str | None = None  # the model auto and chain may draft with (settings.draft_model)
    k: int | None = None
    adaptive: bool = False
    k_min: int | None = None
    k_max: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    draft_p_min: float | None = None
    draft_p_joint: float | None = None
    lookup_min_ngram: int | None = None
    lookup_max_ngram: int | None = None
    threads: int | None = None
    ctx: int | None = None
    max_tokens: int | None = None
    raw: bool | None = None
    translate: bool | None = None  # a draft with another vocabulary may draft through translation
    experts: int | None = None  # the expert-count override; None = the file's own
    experts_active: int | None = None  # active experts per token, as loaded
    expert_count: int | None = None  # experts in the model; None for a dense model
    target_path: str | None = None  # the GGUF file the target was loaded from
    draft_path: str | None = None  # the draft model's GGUF, when one drafts
    paused: bool = False
    command: str = ""  # the command that caused this snapshot, in command syntax; "" at start
    # The commands this source takes now, by name (commands_registry: "k", "draft", ...):
    # anything not listed is refused. `unavailable` says why, for names it knows it cannot.
    supports: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    # How the target takes back rejected drafts, e.g. "snapshots (n_rs_seq 16)" or
    # "checkpoint 1.6 KB + replay"; "" for a KV cache (or unknown).
    rollback: str = ""
    repack: str | None = None  # the weight-repacking setting: auto | on | no-amx | off
    # What the target was loaded with and why, e.g. "off (AMX crashed in a probe)";
    # "" where unknown (remote sources).
    repack_verdict: str = ""
    t: float = 0.0
    event: str = "settings"


@dataclass(slots=True)
class StatusEvent:
    state: str  # loading | ready | running | idle | error | down | ended
    message: str = ""
    fraction: float | None = None  # loading progress, when known
    t: float = 0.0
    event: str = "status"


@dataclass(slots=True)
class PromptEvent:
    title: str
    text: str
    request: str = ""  # the served request it starts, when several run in one batch (engine/batch)
    t: float = 0.0
    event: str = "prompt"


@dataclass(slots=True)
class PrefillEvent:
    n_tokens: int
    ms: float
    # Of n_tokens, the rows kept from the run before (the same prompt again, or a chat's
    # next turn on a server): computed then, not now.
    reused: int = 0
    # The served request this belongs to when several run in one batch (engine/batch); ""
    # when one run at a time (and in older recordings).
    request: str = ""
    t: float = 0.0
    event: str = "prefill"


@dataclass(slots=True)
class StepEvent:
    step: int
    k: int  # K in force for this step (what was asked of the drafter)
    drafter: str  # the source that produced this step's draft ("none" when nothing drafted)
    drafted: int
    accepted: int
    tokens: list[int]  # committed this step: accepted drafts, then one target token
    pieces: list[str]  # text of each committed token ('' while a UTF-8 char is incomplete)
    from_draft: list[bool]  # provenance per committed token
    draft_ms: float
    verify_ms: float
    other_ms: float  # bookkeeping: verify rules, commit, KV rollback, event building
    n_past: int  # tokens in the target context after this step
    n_generated: int
    t: float  # at the end of the step
    content: str = ""  # content detector label (code / json / prose ...), "" when unknown
    adaptive: bool = False
    decision: str = ""  # adaptive controller's reason for this K, "" when fixed
    # How this step took back rejected drafts on a recurrent/hybrid target: "" (a KV cache),
    # "snapshots" or "checkpoint"; the ms its save, restore and replay took (target and
    # draft model, part of the times above) and the bytes checkpointed.
    rollback: str = ""
    rollback_ms: float = 0.0
    checkpoint_bytes: int = 0
    # Of draft_ms, the time spent translating between vocabularies (a draft model with
    # another vocabulary, drafter "xvocab"); 0 otherwise and in older recordings.
    translate_ms: float = 0.0
    # Several requests in one target batch (engine/batch): whose step this is, and how many
    # sequences the step's batch held (its width); "" and 0 when one runs at a time.
    request: str = ""
    batch: int = 0
    event: str = "step"

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def step_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.other_ms


@dataclass(slots=True)
class CountersEvent:
    """Counter deltas over `seconds` of a remote server's time (one poll). Speculative
    names follow vLLM; per position i: drafts whose position i was accepted."""

    seconds: float
    tokens: int  # generated
    steps: int  # decode steps (llama.cpp n_decode; vLLM: tokens - accepted)
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: list[int]
    prompt_tokens: int = 0
    k: int | None = None  # drafts' length when the server reports it
    t: float = 0.0
    event: str = "counters"


@dataclass(slots=True)
class NoticeEvent:
    """Something the operator should see: a command applied or refused, a reload."""

    level: str  # "info" | "warning" | "error"
    message: str
    t: float = 0.0
    # The command this notice refuses, as typed ("k=3"), so a reader acts on the refusal
    # from data, never by parsing the message; "" when it refuses nothing.
    refused: str = ""
    event: str = "notice"


@dataclass(slots=True)
class Summary:
    text: str
    # "eos" | "max_tokens" | "context" | "stopped"; a served request's also "stop" (one of
    # its stop strings) | "cancelled" (its client left)
    stop_reason: str
    n_prompt: int
    n_generated: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: list[int]
    acceptance_rate: float | None  # None when nothing was drafted
    mean_accepted_length: float
    tokens_per_s: float  # decode only
    prefill_tokens_per_s: float
    prefill_ms: float
    decode_s: float
    draft_ms: float
    verify_ms: float
    other_ms: float
    steps: int
    # Index j: drafting steps of this request that accepted exactly j draft tokens, as the
    # server reported it (vLLM's per-request metrics.speculative_decoding); [] where no
    # server sent one (the requests table then builds it from the request's own steps).
    acceptance_histogram: list[int] = field(default_factory=list)
    drafter: str = ""  # what drafted for this request, as the settings name it; "" when unknown
    request: str = ""  # the served request, when several run in one batch (engine/batch)
    calls: list[str] = field(default_factory=list)  # a served request's tool calls, by tool name, in order
    t: float = 0.0
    event: str = "summary"


@dataclass(slots=True)
class TelemetryEvent:
    """One telemetry sample of the machine the source runs on."""

    core_loads: list[float]  # busy percent per logical CPU since the previous sample
    numa_nodes: list[NumaNode]
    process: ProcessStats | None
    sample_seconds: float = 0.0  # what taking the sample cost
    dashboard_cpu: float | None = None  # the UI thread's share of a core, when measured
    t: float = 0.0
    event: str = "telemetry"

    @staticmethod
    def of(snapshot: Any, dashboard_cpu: float | None = None) -> TelemetryEvent:
        """From a telemetry.TelemetrySnapshot, stamped now."""
        return TelemetryEvent(list(snapshot.core_loads), list(snapshot.numa_nodes), snapshot.process,
                              snapshot.sample_seconds, dashboard_cpu=dashboard_cpu, t=now())


@dataclass(slots=True)
class ServerEvent:
    """One remote server as the fleet table shows it (vLLM-style field names)."""

    url: str
    state: str  # up | down | starting | bad (it answers, with numbers that cannot be counts)
    backend: str = ""  # llamacpp | vllm | specdash
    model: str = ""
    requests_running: int | None = None
    requests_waiting: int | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    tokens_per_step: float | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    kv_cache_usage: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    uptime_s: float | None = None
    errors: int = 0
    resets: int = 0  # counter resets seen (server restarts)
    last_seen: float | None = None  # wall clock (time.time()) of the last good poll
    error: str = ""
    note: str = ""  # what the reading left out, and why (per-position series beyond the cap)
    health: str = ""  # the health verdict (specdash/monitor/health.py VERDICTS); "" before any
    alarms: list[str] = field(default_factory=list)  # what each firing health rule read
    t: float = 0.0
    event: str = "server"


@dataclass(slots=True)
class ReplayEvent:
    """Where a replay stands. `rewind`: the consumer starts over from an empty state;
    the events up to `position` follow at once."""

    file: str
    position: float  # seconds from the start of the recording
    duration: float
    speed: float
    playing: bool
    rewind: bool = False
    problem: str = ""  # where and why the recording stops early, if it does
    t: float = 0.0
    event: str = "replay"


@dataclass(slots=True)
class HealthRule:
    """One health rule's state: unknown (not enough history yet), ok, or alarm; `message`
    says what it read, `value` and `reference` are the two figures it compared."""

    name: str  # specdash.monitor.health.RULES
    state: str  # unknown | ok | alarm
    message: str = ""
    value: float | None = None
    reference: float | None = None


@dataclass(slots=True)
class HealthEvent:
    """The source's speculation health, emitted when a rule changes state."""

    verdict: str  # unknown | healthy | stalled | collapse | losing | repetitive
    rules: list[HealthRule] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # the rules whose state changed
    t: float = 0.0
    event: str = "health"


@dataclass(slots=True)
class QueueEvent:
    """A server's requests (`specdash serve`), by title: the one running, those waiting in
    the order they will run. Sent whenever either changes."""

    running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    t: float = 0.0
    event: str = "queue"


Event = Union[
    SettingsEvent, StatusEvent, PromptEvent, PrefillEvent, StepEvent, CountersEvent,
    NoticeEvent, Summary, TelemetryEvent, ServerEvent, ReplayEvent, HealthEvent, QueueEvent,
]
EVENT_TYPES: dict[str, type] = {
    cls.__dataclass_fields__["event"].default: cls
    for cls in typing.get_args(Event)
}


# --- commands -----------------------------------------------------------------------
# The only way anything changes. A source applies them between steps, and one that cannot
# honour a command refuses it with a notice. `text()` is the command syntax shared by
# `run --at/--schedule`, the notices and SettingsEvent.command.


@dataclass(frozen=True, slots=True)
class SetK:
    k: int

    def text(self) -> str:
        return f"k={self.k}"


@dataclass(frozen=True, slots=True)
class SetDrafter:
    spec: str  # registry name, GGUF path, or one of engine.drafters.KINDS

    def text(self) -> str:
        return f"draft={self.spec}"


@dataclass(frozen=True, slots=True)
class SetSampling:
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None

    def text(self) -> str:
        parts = [f"{name}={value:g}" for name, value in
                 (("temp", self.temperature), ("top_k", self.top_k), ("top_p", self.top_p))
                 if value is not None]
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class SetAdaptive:
    on: bool

    def text(self) -> str:
        return f"adaptive={'on' if self.on else 'off'}"


@dataclass(frozen=True, slots=True)
class SetExperts:
    n: int

    def text(self) -> str:
        return f"experts={self.n}"


@dataclass(frozen=True, slots=True)
class SetCut:
    """The draft model's joint confidence cut (settings.draft_p_joint): a draft stops
    where the product of its top-token probabilities falls below it; 0 = off."""

    p_joint: float

    def text(self) -> str:
        return f"cut={self.p_joint:g}"


@dataclass(frozen=True, slots=True)
class Pause:
    def text(self) -> str:
        return "pause"


@dataclass(frozen=True, slots=True)
class Resume:
    def text(self) -> str:
        return "resume"


@dataclass(frozen=True, slots=True)
class Stop:
    def text(self) -> str:
        return "stop"


@dataclass(frozen=True, slots=True)
class Forget:
    """Start cold: forget what adaptive K learned and the suffix drafter's memory of
    earlier outputs (the bench starts every measured run this way)."""

    def text(self) -> str:
        return "forget"


@dataclass(frozen=True, slots=True)
class NewPrompt:
    """Generate for this prompt now (the one running stops). max_tokens: for this prompt
    only (a sweep's short runs); None = the settings' max_tokens."""

    text_: str
    title: str = ""
    max_tokens: int | None = None

    def text(self) -> str:
        return "prompt"


@dataclass(frozen=True, slots=True)
class Seek:
    """Replay: jump to `to` seconds from the start, or by `by` seconds; None/None = end."""

    to: float | None = None
    by: float | None = None

    def text(self) -> str:
        return f"seek={self.to:g}" if self.to is not None else f"seek{self.by:+g}" if self.by is not None else "seek=end"


@dataclass(frozen=True, slots=True)
class SetSpeed:
    """Replay: playback speed, one of SPEEDS."""

    speed: float

    def text(self) -> str:
        return f"speed={self.speed:g}"


SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # a replay's speeds (SetSpeed); the UI steps through them

Command = Union[SetK, SetDrafter, SetSampling, SetAdaptive, SetExperts, SetCut, Pause, Resume, Stop,
                Forget, NewPrompt, Seek, SetSpeed]
# The vocabulary (each command's name, schedule syntax, parser and dashboard keys) is in
# specdash/contract/vocabulary.py, which imports these types (never the other way round).


# --- (de)serialisation --------------------------------------------------------------


def to_dict(event: Any) -> dict[str, Any]:
    """The event as JSON-ready data, with the schema version. Floats keep 6 decimals:
    microseconds for times, far below what anything here can measure, and a recording
    a third smaller than with 17 digits."""
    d: dict[str, Any] = _rounded(dataclasses.asdict(event))
    d["schema"] = SCHEMA
    return d


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def from_dict(data: Any) -> Event:
    """An event from `to_dict` output. Raises ContractError on anything else."""
    if not isinstance(data, dict):
        raise ContractError(f"expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema", SCHEMA)
    if not isinstance(schema, int) or schema > SCHEMA:
        raise ContractError(f"schema {schema!r} is newer than this specdash reads ({SCHEMA}); upgrade specdash")
    tag = data.get("event")
    cls = EVENT_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ContractError(f"unknown event {tag!r}; expected one of {', '.join(EVENT_TYPES)}")
    event: Event = _build(cls, data, cls.__name__)
    _check_event(event, cls.__name__)
    return event


# --- what a live source can emit ------------------------------------------------------
# from_dict refuses what no source ever emits, so a recording (or a peer) cannot feed the
# dashboard numbers it was never built for: Python's json reads `Infinity` and `NaN`, and a
# hand-edited or corrupted line can say anything. The rules go by type and field name,
# not per event, so a field added later is covered by the same rules.

# Every number is a count, a size, a duration, a rate or a clock reading: finite, never
# negative, and within 2^53 (beyond it a float no longer counts by one). A field that may
# legitimately be negative is named here, as "Class.field".
SIGNED: frozenset[str] = frozenset()
MAX_NUMBER = 2**53
# Fields that are fractions, 0..1.
FRACTIONS = frozenset({"acceptance_rate", "fraction", "top_p", "draft_p_min", "draft_p_joint"})
# Fields that are a draft length, and lists with an entry per draft position.
K_FIELDS = frozenset({"k", "k_min", "k_max"})
PER_POSITION_SUFFIX = "_per_pos"


def _number(value: float, where: str) -> None:
    if 0 <= value <= MAX_NUMBER:  # nearly every number: one comparison (NaN fails it)
        return
    if value != value or value in (float("inf"), float("-inf")):
        raise ContractError(f"{where}: {value!r} is not a finite number")
    field_ = where.split("[", 1)[0]
    if value < 0 and field_ not in SIGNED:
        raise ContractError(f"{where}: {_short(value)} is negative; it is a count, size or time")
    if abs(value) > MAX_NUMBER:
        raise ContractError(f"{where}: {_short(value)} is beyond 2^53; no source measures that much")


@functools.cache
def _ruled_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """`cls`'s fields under the name rules: fractions, draft lengths, per-position lists."""
    names = [f.name for f in dataclasses.fields(cls)]
    return (tuple(n for n in names if n in FRACTIONS), tuple(n for n in names if n in K_FIELDS),
            tuple(n for n in names if n.endswith(PER_POSITION_SUFFIX)))


def _short(value: float) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def _check_event(event: Any, where: str) -> None:
    """The rules across fields (each number alone was checked as it was read)."""
    cls: type = type(event)
    fractions, ks, per_pos = _ruled_fields(cls)
    for name in fractions:
        value = getattr(event, name)
        if isinstance(value, float) and value > 1:
            raise ContractError(f"{where}.{name}: {value!r} is a fraction; valid: 0..1")
    for name in ks:
        value = getattr(event, name)
        if isinstance(value, int) and value > K_CAP:
            raise ContractError(f"{where}.{name}: {value} drafts; valid: 0..{K_CAP}")
    for name in per_pos:
        value = getattr(event, name)
        if isinstance(value, list) and len(value) > K_CAP:
            raise ContractError(f"{where}.{name}: {len(value)} positions; valid: at most {K_CAP}")

    def at_most(small: str, big: str) -> None:
        a, b = getattr(event, small, None), getattr(event, big, None)
        if isinstance(a, int) and isinstance(b, int) and a > b:
            raise ContractError(f"{where}.{small}: {a} is more than {big} ({b})")

    at_most("accepted", "drafted")
    at_most("num_accepted_tokens", "num_draft_tokens")
    if isinstance(event, StepEvent):
        at_most("drafted", "k")
        if len(event.from_draft) != len(event.pieces):
            raise ContractError(f"{where}.from_draft: {len(event.from_draft)} entries for {len(event.pieces)} pieces; "
                                "one per committed token")
        if len(event.tokens) > len(event.pieces):
            raise ContractError(f"{where}.tokens: {len(event.tokens)} tokens for {len(event.pieces)} pieces")
        if sum(event.from_draft) > event.accepted:
            raise ContractError(f"{where}.from_draft: {sum(event.from_draft)} tokens from the draft, "
                                f"but {event.accepted} accepted")


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{where}: missing field {f.name!r}")
            continue
        kwargs[f.name] = _convert(_hints(cls)[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(tp: Any, value: Any, where: str) -> Any:
    """`value` checked against (and built into) type `tp`."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except ContractError as exc:
                errors.append(str(exc))
        raise ContractError(errors[0] if errors else f"{where}: unexpected {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ContractError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)[:1]
        items = [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        key_tp, value_tp = (typing.get_args(tp) + (Any, Any))[:2]
        return {_convert(key_tp, k, where): _convert(value_tp, v, f"{where}[{k!r}]") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        return _build(tp, value, where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ContractError(f"{where}: expected a number, got {value!r}")
        _number(value, where)
        return float(value)
    if tp in (int, bool, str):
        if type(value) is not tp:
            raise ContractError(f"{where}: expected {tp.__name__}, got {value!r}")
        if tp is int:
            _number(value, where)
        return value
    return value


__all__ = [
    "SCHEMA", "ContractError", "Event", "Command", "EVENT_TYPES",
    "SettingsEvent", "StatusEvent", "PromptEvent", "PrefillEvent", "StepEvent", "CountersEvent",
    "NoticeEvent", "Summary", "TelemetryEvent", "ServerEvent", "ReplayEvent", "HealthEvent", "QueueEvent", "HealthRule", "NumaNode", "NumaStat", "ProcessStats",
    "SetK", "SetDrafter", "SetSampling", "SetAdaptive", "SetExperts", "SetCut", "Pause", "Resume", "Stop",
    "Forget", "NewPrompt", "Seek", "SetSpeed", "SPEEDS", "to_dict", "from_dict", "now",
]
