"""Prometheus text exposition -> samples, and which server wrote it.

Parsing is prometheus_client's own (`text_string_to_metric_families`). Two of its habits
matter here: it strips `_total` from a counter *family's* name (the samples keep it), and
it appends `_total` to the samples of a counter declared without it (llama.cpp's
`llamacpp:n_tokens_max` arrives as `llamacpp:n_tokens_max_total`). So everything below
looks samples up by their sample name, and `value()` accepts either spelling.

vLLM's counters also carry a `<name>_created` series (the counter's creation time, a
Unix timestamp) and its histograms `_bucket{le}`, `_sum`, `_count` (and `_created`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specdash.contract.limits import K_CAP

# Backends by the prefix of their metric names, in detection order.
BACKEND_PREFIXES: dict[str, tuple[str, ...]] = {
    "llamacpp": ("llamacpp:",),
    "vllm": ("vllm:",),
    "specdash": ("specdash_", "specdash:"),  # specdash: before issue 42; a fleet mixes versions
}
# A specdash exporting vLLM's names (--metrics-names vllm) says so here: it is no vLLM.
SPECDASH_BUILD = "specdash_build_info"


class NotMetricsError(ValueError):
    """The text is not Prometheus exposition (an HTML page, JSON, garbage)."""


# Every series the backends read is a count, a gauge of work or a Unix time: never
# negative, never NaN or infinite, and never beyond 2^53, where a float stops counting by
# one (a counter there is corrupt: at a million tokens a second it takes 285 years).
MAX_READING = 2.0**53

# Per-position series beyond K_CAP: no drafter specdash knows drafts that far, and a
# server exposing 300,000 of them cost seconds of parsing per poll; they are dropped
# before parsing, and the snapshot says how many were.
MAX_POSITIONS = K_CAP
_PER_POS = "_per_pos"
_POSITION = re.compile(r'position="([^"]*)"')


def bad_value(value: float) -> str | None:
    """Why `value` cannot be a reading, or None when it can."""
    if math.isnan(value):
        return "not a number"
    if math.isinf(value):
        return "infinite"
    if value < 0:
        return "negative"
    if value > MAX_READING:
        return "beyond 2^53"
    return None


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Scrape:
    """One /metrics response: samples by sample name, plus each family's declared type."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # family name -> counter|gauge|histogram...
    dropped_positions: int = 0  # per-position series at or beyond MAX_POSITIONS, not kept

    def bad_reading(self) -> str | None:
        """The first sample that cannot be a reading, as `name{labels} = value (why)`,
        or None when every one can."""
        for name, samples in self.samples.items():
            for s in samples:
                why = bad_value(s.value)
                if why is not None:
                    labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
                    return f"{name}{{{labels}}} = {s.value!r} ({why})" if labels else f"{name} = {s.value!r} ({why})"
        return None

    def names(self) -> Iterable[str]:
        return self.samples.keys()

    def get(self, name: str) -> list[Sample]:
        """Samples named `name`, or `name_total` (a counter's samples), or `name` without
        `_total` (a counter declared with it, when the caller asked for the family)."""
        found = self.samples.get(name)
        if found is None and not name.endswith("_total"):
            found = self.samples.get(name + "_total")
        if found is None and name.endswith("_total"):
            found = self.samples.get(name[: -len("_total")])
        return found or []

    def has(self, name: str) -> bool:
        return bool(self.get(name))

    def value(self, name: str, default: float | None = None, **labels: str) -> float | None:
        """The sum of the matching samples (over every other label: engines, replicas),
        or `default` when there is none."""
        total: float | None = None
        for s in self.get(name):
            if all(s.labels.get(k) == v for k, v in labels.items()):
                total = s.value if total is None else total + s.value
        return default if total is None else total

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Sum of the samples per value of `label` (e.g. per draft position)."""
        out: dict[str, float] = {}
        for s in self.get(name):
            key = s.labels.get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + s.value
        return out

    def label_values(self, name: str, label: str) -> list[str]:
        seen: list[str] = []
        for s in self.get(name):
            v = s.labels.get(label)
            if v is not None and v not in seen:
                seen.append(v)
        return seen

    def backend(self) -> str | None:
        """llamacpp | vllm | specdash by metric prefix, or None when none is present."""
        if SPECDASH_BUILD in self.samples:
            return "specdash"
        counts = {b: 0 for b in BACKEND_PREFIXES}
        for name in self.samples:
            for backend, prefixes in BACKEND_PREFIXES.items():
                if name.startswith(prefixes):
                    counts[backend] += 1
        best = max(counts, key=lambda b: counts[b])
        return best if counts[best] else None


# The families the backends read (specdash/monitor/remote/backends.py). Everything else (HELP
# lines, python_gc_*, http_*, llama.cpp's *_seconds gauges...) is dropped before parsing:
# the parser is most of a poll's own CPU, and these are most of the page.
KEEP = (
    "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total",
    "llamacpp:spec_decode_", "llamacpp:requests_processing", "llamacpp:requests_deferred",
    "vllm:generation_tokens", "vllm:prompt_tokens_total", "vllm:prompt_tokens_created", "vllm:spec_decode_",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "specdash:", "specdash_",
    "process_start_time_seconds",
)
_KEEP_TYPES = tuple(f"# TYPE {prefix}" for prefix in KEEP)


def _kept(text: str, keep: tuple[str, ...]) -> tuple[str, int]:
    """The lines worth parsing, and how many per-position series were dropped."""
    types = _KEEP_TYPES if keep is KEEP else tuple(f"# TYPE {prefix}" for prefix in keep)
    lines = [line for line in text.splitlines() if line.startswith(keep) or line.startswith(types)]
    kept = [line for line in lines if not (_PER_POS in line.partition("{")[0] and not line.startswith("#")
                                           and _far(line))]
    return "\n".join(kept) + "\n", len(lines) - len(kept)


def _far(line: str) -> bool:
    """A per-position sample at or beyond MAX_POSITIONS."""
    m = _POSITION.search(line)
    if m is None:
        return False
    try:
        return int(m.group(1)) >= MAX_POSITIONS
    except ValueError:
        return False


def parse(text: str, keep: tuple[str, ...] | None = KEEP) -> Scrape:
    """Prometheus text -> Scrape, keeping only the metric names that start with `keep`
    (and their TYPE lines; None keeps everything). Raises NotMetricsError when it is not exposition text: an HTML page or
    JSON would otherwise parse into nonsense or fail deep inside."""
    head = text.lstrip()[:200].lower()
    if head.startswith("<"):
        raise NotMetricsError("an HTML page, not Prometheus metrics")
    if head.startswith(("{", "[")):
        raise NotMetricsError("JSON, not Prometheus metrics")
    dropped = 0
    if keep is not None:
        kept, dropped = _kept(text, keep)
        if not kept.strip() and text.strip():
            # Nothing we know: parse it all, so garbage is still told from foreign metrics.
            kept, dropped = text, 0
        text = kept
    scrape = Scrape(dropped_positions=dropped)
    try:
        for family in text_string_to_metric_families(text):
            scrape.types[family.name] = family.type
            for s in family.samples:
                scrape.samples.setdefault(s.name, []).append(Sample(s.name, dict(s.labels), float(s.value)))
    except (ValueError, IndexError, KeyError) as exc:
        raise NotMetricsError(f"not Prometheus text ({str(exc)[:80]})") from None
    return scrape


def histogram_buckets(scrape: Scrape, name: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets [(le, count)], summed over every other label
    (engines), ascending, ending with +Inf. [] when absent."""
    acc: dict[float, float] = {}
    for s in scrape.get(name + "_bucket"):
        le = s.labels.get("le")
        if le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        if math.isnan(bound) or bound < 0 or bound == float("-inf"):
            continue  # not a bucket bound: a quantile from it would be nonsense
        acc[bound] = acc.get(bound, 0.0) + s.value
    return sorted(acc.items())


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile over cumulative buckets: linear interpolation
    inside the bucket the rank falls in; the +Inf bucket answers with the last finite
    bound. None when the histogram is empty."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound
