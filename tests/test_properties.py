"""Property-based tests (hypothesis): whatever a server's /metrics or a recording's lines
say, nothing escapes as an exception, and every number shown is finite.

1. The exposition parser, the backends and the counter window, through a real
   RemoteSource whose client answers generated pages (and a generated /props): arbitrary metric names (and the
   ones the backends read), labels, values (NaN, inf, negative, huge, denormal), TYPE
   lines, duplicated series and cut-off text. Every event the source emits has only
   finite numbers, and the event contract accepts it (what a live source emits, a
   recording of it must replay).
2. The window's arithmetic alone, over any valid counts at any times.
3. `events.from_dict` and the dashboard's reducer over events whose fields hold arbitrary
   JSON values: from_dict refuses with ContractError or the fold takes the event, and the
   figures the panels read never raise.

Example counts stay moderate: the file runs in well under 30 s on a loaded 2-core box.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdash.contract import events as E
from specdash.commands.attach import text_row
from specdash.monitor.remote.backends import Counters
from specdash.monitor.remote.client import Client, parse_url
from specdash.monitor.remote.window import CounterWindow
from specdash.sources.remote import RemoteSource
from specdash.tui.reducer import DashState

# A deeper run, now and then: SPECDASH_PROPERTY_EXAMPLES=2000 pytest tests/test_properties.py
EXAMPLES = int(os.environ.get("SPECDASH_PROPERTY_EXAMPLES", "60"))
FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def numbers(value: Any) -> list[float]:
    """Every number inside an event's dict."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in numbers(v)]
    return []


# --- 1. /metrics pages -----------------------------------------------------------------

KNOWN = [
    "llamacpp:n_decode_total", "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total",
    "llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    "llamacpp:requests_processing", "llamacpp:requests_deferred",
    "vllm:generation_tokens_total", "vllm:generation_tokens_created", "vllm:prompt_tokens_total",
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "specdash_generation_tokens_total", "specdash_num_speculative_tokens", "specdash_decode_steps_total",
    "specdash_model_info", "process_start_time_seconds",
    "specdash:generation_tokens_total", "specdash:decode_steps_total", "specdash_build_info",
]
VALUES = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "inf", "-5", "1e308", "0", "-0", "1e-320", "9007199254740993",
                     "3", "12", "40"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**20), 10**20).map(str),
)
NAMES = st.one_of(st.sampled_from(KNOWN), st.from_regex(r"\A[a-zA-Z_:][a-zA-Z0-9_:]{0,24}\Z"))
LABEL_NAMES = st.one_of(st.sampled_from(["position", "le", "engine", "model_name", "target", "drafter"]),
                        st.from_regex(r"\A[a-zA-Z_][a-zA-Z0-9_]{0,8}\Z"))
LABEL_VALUES = st.one_of(st.integers(-3, 300).map(str), st.integers(0, 10**12).map(str),
                         st.sampled_from(["+Inf", "NaN", "-1", "0.5", "1e9", ""]), st.text(max_size=6))


@st.composite
def sample_line(draw: st.DrawFn) -> str:
    name = draw(NAMES)
    labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=3))
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())  # values unescaped: some lines are malformed
    return f"{name}{{{inner}}} {draw(VALUES)}" if labels else f"{name} {draw(VALUES)}"


@st.composite
def page(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(1, 25))):
        if draw(st.booleans()):
            kind = draw(st.sampled_from(["counter", "gauge", "histogram", "untyped", "summary"]))
            lines.append(f"# TYPE {draw(NAMES)} {kind}")
        lines.append(draw(sample_line()))
    if lines and draw(st.booleans()):  # duplicated series
        lines += draw(st.lists(st.sampled_from(lines), max_size=5))
    text = "\n".join(lines) + "\n"
    if draw(st.booleans()):  # cut off anywhere
        text = text[: draw(st.integers(0, len(text)))]
    return text


PROP_NUMBERS = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=3),
                         st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def props(draw: st.DrawFn) -> dict[str, Any] | None:
    """llama-server's /props as a server might answer it (or no /props at all)."""
    if draw(st.booleans()):
        return None
    params = {key: draw(PROP_NUMBERS) for key in ("temperature", "top_p", "top_k", "seed", "n_predict")}
    return {"default_generation_settings": {"params": params, "n_ctx": draw(PROP_NUMBERS)},
            "model_path": draw(st.sampled_from(["/m/a.gguf", "none", ""]) | st.text(max_size=4))}


@st.composite
def plausible_page(draw: st.DrawFn) -> str:
    """A llama-server page that reads well (so the polls get past the numbers to the
    settings, the deltas and the row), with some noise in it."""
    drafted = draw(st.integers(0, 10**6))
    lines = [f"llamacpp:n_decode_total {draw(st.integers(0, 10**6))}",
             f"llamacpp:tokens_predicted_total {draw(st.integers(0, 10**6))}",
             f"llamacpp:spec_decode_num_drafts_total {draw(st.integers(0, 10**6))}",
             f"llamacpp:spec_decode_num_draft_tokens_total {drafted}",
             f"llamacpp:spec_decode_num_accepted_tokens_total {draw(st.integers(0, drafted))}",
             f"llamacpp:requests_processing {draw(st.integers(0, 4))}"]
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {draw(st.integers(0, 99))}'
              for i in range(draw(st.integers(0, 70)))]
    lines += draw(st.lists(sample_line(), max_size=2))
    return "\n".join(lines) + "\n"


def fake_source(pages: list[str], props: dict[str, Any] | None = None) -> tuple[RemoteSource, list[E.Event]]:
    """A real RemoteSource whose client answers `pages` in turn, `props` on /props, no /slots."""
    client = Client(parse_url("http://127.0.0.1:9"))
    answers = iter(pages)
    client.metrics_text = lambda params=None: next(answers)  # type: ignore[method-assign]
    client.get_json_optional = lambda path, params=None: props if path == "/props" else None  # type: ignore[method-assign]
    source = RemoteSource(client.display, client=client)
    emitted: list[E.Event] = []
    source._emit = emitted.append  # as start() would, without the poller thread
    return source, emitted


@FAST
@given(st.lists(page() | plausible_page(), min_size=1, max_size=4), props())
def test_any_metrics_page_gives_finite_events_the_contract_accepts(pages: list[str],
                                                                   answer: dict[str, Any] | None) -> None:
    source, emitted = fake_source(pages, answer)
    try:
        rows = [source.poll_now() for _ in pages]
    finally:
        source.close()
    for row in rows:
        # The fallbacks for a bug of ours must never be what handled a page.
        assert "handling a poll failed" not in row.error and "could not read its answer" not in row.error, row.error
        assert row.state in ("up", "down", "bad"), row
        if row.state == "up":  # (a bad row's error quotes the bad value: that is the point)
            figures = text_row(row).lower().split("busy/queued", 1)[1]  # after the URL and the model's name
            assert " nan" not in figures and " inf" not in figures, figures
    for ev in emitted:
        d = E.to_dict(ev)
        assert all(math.isfinite(n) for n in numbers(d)), d
        assert E.to_dict(E.from_dict(json.loads(json.dumps(d)))) == d


COUNTS = st.floats(0.0, 2.0**53)


@st.composite
def counters(draw: st.DrawFn) -> Counters:
    drafted = draw(COUNTS)
    c = Counters(tokens=draw(COUNTS), prompt_tokens=draw(COUNTS), steps=draw(st.none() | COUNTS),
                 num_drafts=draw(COUNTS), num_draft_tokens=drafted,
                 num_accepted_tokens=draw(st.floats(0.0, drafted)),
                 per_pos=draw(st.lists(COUNTS, max_size=64)),
                 histograms={"ttft": sorted(draw(st.dictionaries(st.floats(0.0, 1e6) | st.just(math.inf), COUNTS,
                                                                 max_size=4)).items())})
    c.raw.update(num_drafts=c.num_drafts, num_draft_tokens=drafted, num_accepted_tokens=c.num_accepted_tokens,
                 tokens=c.tokens)
    return c


@FAST
@given(st.lists(st.tuples(st.floats(0.0, 1e7), counters()), min_size=1, max_size=6),
       st.floats(1.0, 3600.0))
def test_window_figures_are_finite_and_never_negative(polls: list[tuple[float, Counters]], seconds: float) -> None:
    window = CounterWindow(seconds)
    t = 0.0
    for dt, c in polls:
        t += dt
        window.add(t, c)
        for attr in ("tokens", "prompt_tokens", "steps", "num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            rate = window.rate(attr)
            assert rate is None or (math.isfinite(rate) and rate >= 0), (attr, rate)
        for q in (0.5, 0.95):
            value = window.quantile("ttft", q)
            assert value is None or (math.isfinite(value) and value >= 0), value
        total = window.total()
        if total is not None:
            assert all(n >= 0 for n in [total.tokens, total.num_draft_tokens, total.num_accepted_tokens, *total.per_pos])


# --- 3. events.from_dict and the reducer ----------------------------------------------

BASES: list[E.Event] = [
    E.SettingsEvent(source="engine", target="t", drafter="lookup", draft="lookup", k=4, adaptive=True, k_max=8,
                    temperature=0.7, unavailable={"k": "why"}),
    E.StatusEvent("running", "up", fraction=0.5),
    E.PromptEvent("p", "text"),
    E.PrefillEvent(12, 3.5, t=1.0),
    E.StepEvent(1, 4, "lookup", 3, 2, [1, 2, 3], ["a", "b", "c"], [True, True, False], 1.0, 2.0, 0.1, 3, 3, 2.0),
    E.CountersEvent(1.0, 9, 3, 3, 9, 4, [3, 1], prompt_tokens=5, k=3, t=3.0),
    E.NoticeEvent("warning", "careful"),
    E.Summary("abc", "eos", 12, 3, 1, 3, 2, [1, 1], 0.66, 3.0, 30.0, 100.0, 3.5, 0.1, 1.0, 2.0, 0.1, 1, t=4.0),
    E.TelemetryEvent([10.0, 20.0], [], None, t=5.0),
    E.ServerEvent(url="http://h:1", state="up", acceptance_rate=0.5, num_accepted_tokens_per_pos=[1, 2]),
    E.ReplayEvent("f.jsonl", 1.0, 10.0, 1.0, True),
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)
NEAR = st.one_of(st.integers(-3, 70), st.floats(-1.0, 2.0), st.sampled_from([1e-320, 1e308, 2**53 + 1]))
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-7.0, 0.0, 1e-320, 1e308])


def like(value: Any) -> st.SearchStrategy[Any]:
    """A value of the same shape as `value` (the likeliest to get past the type checks and
    reach the reducer): ints near the limits, any float, lists of the same items."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-8, 80) | st.sampled_from([2**53, 2**53 + 1, 10**30])
    if isinstance(value, float):
        return FLOATS
    if isinstance(value, str):
        return st.text(max_size=6)
    if isinstance(value, list):
        item = like(value[0]) if value else NEAR
        return st.lists(item, max_size=8)
    return JSON


@st.composite
def event_dict(draw: st.DrawFn) -> dict[str, Any]:
    # Steps and counters feed the charts: drawn three times as often as the rest.
    d = E.to_dict(draw(st.sampled_from(BASES + [b for b in BASES if isinstance(b, (E.StepEvent, E.CountersEvent))] * 2)))
    fields = [k for k in d if k not in ("event", "schema")]
    for name in draw(st.lists(st.sampled_from(fields), max_size=4, unique=True)):
        d[name] = draw(st.one_of(like(d[name]), like(d[name]), JSON, NEAR))
    if draw(st.integers(0, 9)) == 0:
        d.pop(draw(st.sampled_from(fields)))
    # As a recording holds it: json writes NaN and Infinity bare, and reads them back.
    loaded: dict[str, Any] = json.loads(json.dumps(d))
    return loaded


@settings(FAST, max_examples=max(100, EXAMPLES))
@given(st.lists(event_dict(), min_size=5, max_size=25))
def test_any_recorded_fields_are_refused_or_folded_without_an_exception(dicts: list[dict[str, Any]]) -> None:
    state = DashState()
    for d in dicts:
        try:
            ev = E.from_dict(d)
        except E.ContractError as exc:
            assert str(exc), d  # the "stopped at line N: ..." message is never empty
            continue
        assert all(math.isfinite(n) for n in numbers(E.to_dict(ev))), d
        state.feed(ev)
        stats = state.stats
        # What the panels and the status line read after every event.
        _ = (stats.tokens_per_s, stats.plain_tokens_per_s, stats.recent_counters(), stats.series(20),
             stats.smoothed(8), state.k_in_force())
        line = stats.timeline(state.window)
        assert len(line.xs) == len(line.acceptance) == len(line.tokens_per_s) == len(line.k)
        # Times, acceptance and K come from accepted numbers only: finite. (A rate over a
        # denormal interval can still overflow: the charts' own guard takes that.)
        assert all(math.isfinite(v) for v in [*line.xs, *line.k, line.x_min, line.x_max]), line
        assert all(v is None or math.isfinite(v) for v in line.acceptance), line
