"""vLLM cannot run here: its parser is tested on exposition text in vLLM's documented
format (tests/fixtures/vllm, made with prometheus_client and vLLM v1's metric
definitions: model_name/engine labels, `_created` series, histograms), two scrapes 2 s
apart for the deltas, and a restarted server for the reset."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest_remote import FIXTURES, Canned, ReplayServer, as_json, text
from specdash.monitor.remote.backends import ITL, TTFT, VllmSnapshot, snapshot, vllm_snapshot
from specdash.monitor.remote.metrics import histogram_quantile, parse
from specdash.monitor.remote.window import CounterWindow

MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"


def scrape(name: str) -> VllmSnapshot:
    s = parse((FIXTURES / "vllm" / name).read_text())
    assert s.backend() == "vllm"
    snap = snapshot(s, "vllm")
    assert isinstance(snap, VllmSnapshot)
    return snap


def test_counters_gauges_and_labels() -> None:
    snap = scrape("scrape_1.txt")
    c = snap.counters
    assert snap.model == MODEL and snap.engines == ["0"]
    assert c.tokens == 18044 and c.prompt_tokens == 5210
    assert c.num_drafts == 6500 and c.num_draft_tokens == 19500
    assert c.num_accepted_tokens == 4810 + 3390 + 2210
    assert c.per_pos == [4810, 3390, 2210] and snap.k == 3
    assert (snap.requests_running, snap.requests_waiting, snap.kv_cache_usage) == (2, 0, 0.125)
    assert c.steps == c.tokens - c.num_accepted_tokens
    assert snap.start_time == 1757299990.5 and snap.start_marker == 1757300000.125  # the counters' _created
    assert c.histograms[TTFT][-1] == (float("inf"), 42.0)
    assert c.histograms[ITL][-1][1] == 16550.0


def test_created_series_are_not_counters() -> None:
    """prometheus_client strips _total from the family name; _created is its own series
    (a separate gauge family in newer prometheus_client, inside the counter family in
    older ones, as vLLM captures show). Neither may be read as the counter."""
    older_layout = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09',
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0',
        'vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="m"} 1.7e+09',
        "",
    ])
    s = parse(older_layout)
    assert "vllm:spec_decode_num_drafts" in s.types  # the family, _total stripped
    snap = vllm_snapshot(s)
    assert snap.counters.num_drafts == 10 and snap.counters.num_accepted_tokens == 25
    assert snap.start_marker == 1.7e9


def test_engines_are_summed_and_old_names_understood() -> None:
    two_engines = "\n".join([
        "# TYPE vllm:generation_tokens_total counter",
        'vllm:generation_tokens_total{engine="0",model_name="m"} 100.0',
        'vllm:generation_tokens_total{engine="1",model_name="m"} 50.0',
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
        "# TYPE vllm:gpu_cache_usage_perc gauge",  # before 0.9
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5',
        'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.25',
        "# TYPE vllm:time_per_output_token_seconds histogram",  # before inter_token_latency
        'vllm:time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 1.0',
        'vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0',
        'vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 2.0',
        'vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.03',
        "",
    ])
    snap = vllm_snapshot(parse(two_engines))
    assert snap.counters.tokens == 150 and snap.requests_running == 3
    assert snap.engines == ["0", "1"] and snap.kv_cache_usage == pytest.approx(0.375)
    assert snap.counters.histograms[ITL] == [(0.01, 1.0), (float("inf"), 2.0)]
    assert snap.k is None and snap.counters.per_pos == []


def test_deltas_rates_and_quantiles_over_two_scrapes() -> None:
    w = CounterWindow(10.0)
    assert w.add(100.0, scrape("scrape_1.txt").counters) is None  # a baseline has no delta
    d = w.add(102.0, scrape("scrape_2.txt").counters)
    assert d is not None and not d.reset
    assert (d.seconds, d.tokens, d.prompt_tokens) == (2.0, 412, 640)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (150, 450, 242)
    assert d.per_pos == [112, 80, 50]
    assert d.steps == 412 - 242
    assert w.rate("tokens") == pytest.approx(206.0)
    # TTFT: 0.09 and 0.11 arrived in the window -> buckets (0.08, 0.1] and (0.1, 0.25].
    assert w.quantile(TTFT, 0.5) == pytest.approx(0.1)
    assert w.quantile(TTFT, 0.95) == pytest.approx(0.1 + 0.15 * 0.9)
    # ITL: 100 x 0.011, 100 x 0.03, 60 x 0.09 -> p50 in (0.025, 0.05], p95 in (0.075, 0.1].
    assert w.quantile(ITL, 0.5) == pytest.approx(0.025 + 0.025 * 30 / 100)
    assert w.quantile(ITL, 0.95) == pytest.approx(0.075 + 0.025 * 47 / 60)
    # The lifetime histogram would say something else: the window is what is shown.
    lifetime = histogram_quantile(0.5, scrape("scrape_2.txt").counters.histograms[ITL])
    assert lifetime is not None and lifetime < 0.025


def test_restart_is_a_reset_never_a_negative_rate() -> None:
    w = CounterWindow(10.0)
    s2, s3 = scrape("scrape_2.txt"), scrape("scrape_3_restarted.txt")
    w.add(0.0, s2.counters, s2.start_marker)
    d = w.add(1.0, s3.counters, s3.start_marker)
    assert d is not None and d.reset and w.resets == 1
    # After a restart the counters started from zero: the delta is the new value.
    assert (d.tokens, d.num_drafts, d.per_pos) == (96, 40, [30, 18, 9])
    assert all(v >= 0 for v in (d.tokens, d.prompt_tokens, d.num_draft_tokens, d.num_accepted_tokens))
    assert all(count >= 0 for _, count in d.histograms[ITL])
    rate = w.rate("tokens")
    assert rate is not None and rate >= 0
    # Same counters again: no second reset.
    w.add(2.0, s3.counters, s3.start_marker)
    assert w.resets == 1


def test_a_counter_going_down_is_a_reset_without_a_marker() -> None:
    w = CounterWindow(10.0)
    w.add(0.0, scrape("scrape_2.txt").counters)
    d = w.add(1.0, scrape("scrape_1.txt").counters)  # lower values, same _created: still a reset
    assert d is not None and d.reset and d.tokens == 18044 and w.resets == 1


def test_once_json_on_a_replayed_vllm(tmp_path) -> None:
    """`attach --once --json` on a server answering vLLM's /metrics: one object, vLLM
    names, rates from two polls."""
    bodies = [(FIXTURES / "vllm" / n).read_text() for n in ("scrape_1.txt", "scrape_2.txt")]
    calls = {"n": 0}

    def metrics(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        body = bodies[min(calls["n"], 1)]
        calls["n"] += 1
        return text(body)

    canned = Canned({"/metrics": metrics, "/v1/models": as_json({"data": [{"id": MODEL}]})})
    with ReplayServer(canned) as srv:
        proc = subprocess.run([sys.executable, "-m", "specdash", "attach", srv.url, "--once", "--json",
                               "--interval", "0.5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    row = json.loads(line)
    assert row["event"] == "server" and row["state"] == "up" and row["backend"] == "vllm"
    assert row["model"] == MODEL and row["url"] == srv.url
    assert row["num_drafts"] == 6650 and row["num_accepted_tokens_per_pos"] == [4922, 3470, 2260]
    assert row["requests_running"] == 3 and row["requests_waiting"] == 1
    assert row["kv_cache_usage"] == 0.1875
    assert row["acceptance_rate"] == pytest.approx(242 / 450)
    assert row["mean_accepted_length"] == pytest.approx(1 + 242 / 150)
    assert row["generation_tokens_per_s"] > 0 and row["ttft_p50_s"] == pytest.approx(0.1)
    assert row["uptime_s"] > 0
