"""The remote pieces on their own: the window, the poller's timing, RemoteSource's events
and refusals against a canned server, drive-mode step reconstruction, and the
--metrics-port exporter read back by attach."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from conftest_remote import Canned, ReplayServer, as_json, text
from specdash.contract import events as E
from specdash.monitor.metrics_exporter import MetricsExporter
from specdash.monitor.remote.backends import Counters, llamacpp_snapshot, parse_slots
from specdash.monitor.remote.client import Client
from specdash.monitor.remote.metrics import NotMetricsError, parse
from specdash.monitor.remote.poller import Poller, ServerWatch
from specdash.monitor.remote.window import CounterWindow
from specdash.sources.remote import RemoteSource, _Drive

LLAMA_METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {predicted}
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total {decode}
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 300
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {draft_tokens}
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted}
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total {drafts}
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 999
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 999
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {processing}
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {p0}
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {p1}
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="2"}} {p2}
"""


def llama_metrics(**kw: int) -> str:
    values = dict(prompt=100, predicted=200, decode=150, draft_tokens=300, accepted=120, drafts=100,
                  processing=0, p0=60, p1=40, p2=20)
    values.update(kw)
    return LLAMA_METRICS.format(**values)


def slots(n_decoded: int, busy: bool, task: int = 7) -> list[dict[str, Any]]:
    return [{"id": 0, "n_ctx": 512, "speculative": True, "is_processing": busy, "id_task": task,
             "params": {"speculative.types": "draft-simple"},
             "next_token": [{"has_next_token": busy, "n_remain": 10, "n_decoded": n_decoded}]}]


PROPS = {"model_alias": "smollm2-135m.gguf", "model_path": "/cache/smollm2-135m.gguf", "total_slots": 1,
         "default_generation_settings": {"n_ctx": 512, "params": {"temperature": 0.8, "top_k": 40, "top_p": 0.95,
                                                                   "seed": 4294967295, "n_predict": -1}}}


def test_llamacpp_snapshot_live_tokens_and_never_the_seconds_gauges() -> None:
    snap = llamacpp_snapshot(parse(llama_metrics()), parse_slots(slots(17, True)), PROPS)
    c = snap.counters
    assert snap.model == "smollm2-135m" and snap.k == 3
    assert c.tokens == 200 + 17 and snap.in_flight_tokens == 17  # the counters move at request end
    assert c.steps == 150 and c.per_pos == [60, 40, 20]
    assert "n_tokens_max" not in c.raw and 999.0 not in c.raw.values()
    assert snap.slots[0].spec_types == "draft-simple"
    idle = llamacpp_snapshot(parse(llama_metrics()), parse_slots(slots(17, False)), PROPS)
    assert idle.counters.tokens == 200  # a finished task's n_decoded is in the counter already


def test_window_drops_old_polls_and_sums() -> None:
    w = CounterWindow(seconds=2.0)
    for t in range(6):
        w.add(float(t), Counters(tokens=10.0 * t, steps=5.0 * t))
    tot = w.total()
    assert tot is not None and tot.seconds == 2.0 and tot.tokens == 20 and tot.steps == 10
    assert w.rate("tokens") == pytest.approx(10.0)


def test_not_metrics() -> None:
    for bad in ("<!doctype html><html></html>", '{"error": "x"}', "this is not metrics at all {"):
        with pytest.raises(NotMetricsError):
            parse(bad)


def test_polls_never_overlap_and_a_slow_server_blocks_no_other() -> None:
    in_flight = {"now": 0, "max": 0, "calls": 0}
    lock = threading.Lock()

    def slow_metrics(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        with lock:
            in_flight["now"] += 1
            in_flight["calls"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
        time.sleep(0.4)
        with lock:
            in_flight["now"] -= 1
        return text(llama_metrics())

    slow = ReplayServer(Canned({"/metrics": slow_metrics}))
    fast = ReplayServer(Canned({"/metrics": text(llama_metrics())}))
    try:
        results: dict[str, list[Any]] = {"slow": [], "fast": []}
        pollers = [Poller(ServerWatch(Client(srv.url)), results[name].append, interval=0.1)
                   for name, srv in (("slow", slow), ("fast", fast))]
        for p in pollers:
            p.start()
        time.sleep(1.6)
        for p in pollers:
            p.stop(join=2.0)
        assert in_flight["max"] == 1  # one poll at a time, whatever the interval
        assert len(results["slow"]) <= 4 and len(results["fast"]) >= 8
        assert all(r.ok for r in results["fast"])
    finally:
        slow.close()
        fast.close()


def collect(source: RemoteSource) -> list[Any]:
    events: list[Any] = []
    source.start(events.append)
    return events


def wait_for(events: list[Any], pred: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in list(events):
            if pred(ev):
                return ev
        time.sleep(0.02)
    raise AssertionError(f"no matching event in {[type(e).__name__ for e in events]}")


def test_remote_source_events_down_up_and_refusals() -> None:
    state = {"n": 0, "down": False}

    def metrics(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        state["n"] += 1
        if state["down"]:
            return as_json({"error": {"code": 503, "message": "Loading model"}}, 500)
        return text(llama_metrics(predicted=200 + 10 * state["n"], decode=150 + 8 * state["n"]))

    canned = Canned({"/metrics": metrics, "/slots": as_json(slots(0, False)), "/props": as_json(PROPS)})
    with ReplayServer(canned) as srv:
        source = RemoteSource(srv.url, interval=0.1)
        events = collect(source)
        try:
            settings = wait_for(events, lambda e: isinstance(e, E.SettingsEvent))
            assert settings.source == "remote" and settings.target == "smollm2-135m" and settings.k == 3
            assert settings.drafter == "draft-simple" and settings.ctx == 512 and settings.temperature == 0.8
            assert settings.seed is None and settings.max_tokens is None  # the "unset" values
            assert "--spec-draft-n-max" in settings.unavailable["k"] and "router" in settings.unavailable["draft"]
            assert isinstance(events[0], E.StatusEvent) and events[0].state == "loading"
            wait_for(events, lambda e: isinstance(e, E.StatusEvent) and e.state == "running")
            counters = wait_for(events, lambda e: isinstance(e, E.CountersEvent))
            assert counters.tokens == 10 and counters.steps == 8 and counters.k == 3
            row = wait_for(events, lambda e: isinstance(e, E.ServerEvent) and e.generation_tokens_per_s)
            assert row.state == "up" and row.backend == "llamacpp" and row.num_drafts == 100
            assert row.acceptance_rate == pytest.approx(120 / 300)  # lifetime: no drafts in the window
            assert row.tokens_per_step == pytest.approx(10 / 8)

            source.send(E.SetK(5))
            refused = wait_for(events, lambda e: isinstance(e, E.NoticeEvent) and "k=5" in e.message)
            assert "refused" in refused.message and "--spec-draft-n-max" in refused.message
            source.send(E.SetDrafter("ngram"))
            wait_for(events, lambda e: isinstance(e, E.NoticeEvent) and "draft=ngram refused" in e.message)
            source.send(E.Pause())
            wait_for(events, lambda e: isinstance(e, E.NoticeEvent) and "pause refused" in e.message)

            state["down"] = True
            down = wait_for(events, lambda e: isinstance(e, E.StatusEvent) and e.state == "down")
            assert srv.url in down.message and "HTTP 500" in down.message
            row = wait_for(events, lambda e: isinstance(e, E.ServerEvent) and e.state == "down")
            assert row.last_seen is not None and row.errors >= 1 and row.generation_tokens_per_s is None
            state["down"], state["n"] = False, 0  # back, counters restarted: a reset
            wait_for(events, lambda e: isinstance(e, E.NoticeEvent) and "restarted" in e.message)
            assert source.server.resets == 1 or source.watch.window.resets == 1
            running = [e for e in events if isinstance(e, E.StatusEvent) and e.state == "running"]
            assert len(running) == 2
        finally:
            source.close()
        n = len(events)
        time.sleep(0.3)
        assert len(events) == n  # closed: nothing more
        source.close()  # idempotent


def test_vllm_is_read_only() -> None:
    body = (pytest.importorskip("pathlib").Path(__file__).parent / "fixtures" / "vllm" / "scrape_1.txt").read_text()
    with ReplayServer(Canned({"/metrics": text(body)})) as srv:
        source = RemoteSource(srv.url, interval=0.2)
        events = collect(source)
        try:
            settings = wait_for(events, lambda e: isinstance(e, E.SettingsEvent))
            assert settings.target == "Qwen/Qwen2.5-Coder-7B-Instruct" and settings.k == 3
            assert set(settings.unavailable) >= {"k", "draft", "temp", "pause"}
            assert all("vLLM is read-only" in why for why in settings.unavailable.values())
            source.send(E.SetDrafter("ngram"))
            note = wait_for(events, lambda e: isinstance(e, E.NoticeEvent))
            assert "vLLM is read-only" in note.message
        finally:
            source.close()


def test_drive_reconstructs_steps_from_running_timings() -> None:
    """llama-server's per-token chunks with timings_per_token: draft_n / draft_n_accepted
    change at the first token of each verified step, which commits accepted + 1 tokens."""
    d = _Drive(k=4, drafter="draft-simple")
    chunks = [  # (text, draft_n, draft_n_accepted)
        ("A", 0, 0),                               # first token: from the prompt's logits
        ("b", 4, 2), ("c", 4, 2), ("d", 4, 2),     # step: 4 drafted, 2 accepted, + 1
        ("e", 8, 2),                               # step: 4 drafted, 0 accepted: the correction
        ("f", 12, 6), ("g", 12, 6), ("h", 12, 6), ("i", 12, 6), ("j", 12, 6),  # all 4 + bonus
    ]
    steps = [s for text_, dn, da in chunks for s in d.feed(text_, None, {"draft_n": dn, "draft_n_accepted": da})]
    steps += list(d.flush())
    assert [s.text for s in steps] == ["A", "bcd", "e", "fghij"]
    assert [(s.drafted, s.accepted) for s in steps] == [(0, 0), (4, 2), (4, 0), (4, 4)]
    assert steps[1].from_draft == [True, True, False] and steps[0].drafter == "none"
    assert d.num_drafts == 3 and d.per_pos == [2, 2, 1, 1] and steps[-1].n_generated == 10
    # A last verification cut by the end of generation shows only in the final timings.
    tail = list(d.finish({"draft_n": 16, "draft_n_accepted": 9}))
    assert [(s.drafted, s.accepted, s.pieces) for s in tail] == [(4, 3, [])]
    assert d.num_drafts == 4 and d.per_pos == [3, 3, 2, 1] and tail[0].n_generated == 10
    assert list(d.finish({"draft_n": 16, "draft_n_accepted": 9})) == []


def test_exporter_is_read_back_by_attach() -> None:
    exporter = MetricsExporter(0)
    try:
        exporter.feed(E.SettingsEvent(source="engine", target="qwen2.5-coder-1.5b", drafter="qwen2.5-coder-0.5b", k=4))
        exporter.feed(E.PrefillEvent(n_tokens=30, ms=12.0))
        for step, (drafted, accepted) in enumerate([(4, 4), (4, 1), (0, 0), (4, 2)], 1):
            exporter.feed(E.StepEvent(step=step, k=4, drafter="x", drafted=drafted, accepted=accepted,
                                      tokens=list(range(accepted + 1)), pieces=["t"] * (accepted + 1),
                                      from_draft=[True] * accepted + [False], draft_ms=1, verify_ms=1, other_ms=0,
                                      n_past=0, n_generated=0, t=0.0))
        exporter.feed(E.Summary(text="", stop_reason="max_tokens", n_prompt=30, n_generated=10, num_drafts=3,
                                num_draft_tokens=12, num_accepted_tokens=7, num_accepted_tokens_per_pos=[3, 2, 1, 1],
                                acceptance_rate=7 / 12, mean_accepted_length=1 + 7 / 3, tokens_per_s=1, prefill_tokens_per_s=1,
                                prefill_ms=1, decode_s=1, draft_ms=1, verify_ms=1, other_ms=0, steps=4))
        body = httpx.get(exporter.url + "/metrics").text
        assert 'specdash_spec_decode_num_drafts_total{engine="0",model_name="qwen2.5-coder-1.5b"} 3.0' in body
        assert 'specdash_request_success_total{engine="0",finished_reason="length",model_name="qwen2.5-coder-1.5b"} 1.0' in body
        assert 'model_name="specdash"' not in body  # the placeholder before the first settings is gone

        source = RemoteSource(exporter.url)
        row = source.poll_now()
        source.close()
        assert row.state == "up" and row.backend == "specdash" and row.model == "qwen2.5-coder-1.5b"
        assert (row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens) == (3, 12, 7)
        assert row.num_accepted_tokens_per_pos == [3, 2, 1, 1]
        assert row.acceptance_rate == pytest.approx(7 / 12) and row.mean_accepted_length == pytest.approx(1 + 7 / 3)
        assert row.requests_running == 0 and row.tokens_per_step == pytest.approx(11 / 4)  # 5+2+1+3 tokens, 4 steps
        assert source.settings is not None and source.settings.drafter == "qwen2.5-coder-0.5b"
        assert "prompt" in source.settings.unavailable
    finally:
        exporter.close()
        exporter.close()
    with pytest.raises(httpx.HTTPError):
        httpx.get(exporter.url + "/metrics", timeout=1.0)


def test_exporter_port_in_use_is_one_line() -> None:
    from specdash.contract.errors import SpecdashError

    first = MetricsExporter(0)
    try:
        with pytest.raises(SpecdashError) as info:
            MetricsExporter(first.port)
        assert f"--metrics-port {first.port}" in str(info.value) and "pick a free port" in str(info.value)
    finally:
        first.close()


def test_watch_json_prints_one_line_per_server_per_interval() -> None:
    import subprocess
    import sys

    with ReplayServer(Canned({"/metrics": text(llama_metrics())})) as a, \
            ReplayServer(Canned({"/metrics": text(llama_metrics(drafts=7))})) as b:
        proc = subprocess.run([sys.executable, "-m", "specdash", "attach", a.url, b.url, "--watch", "--json",
                               "--interval", "0.3", "--count", "3"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["url"] for r in rows] == [a.url, b.url] * 3
    assert rows[-1]["num_drafts"] == 7 and rows[-1]["state"] == "up"


def test_vllm_drive_mode_on_a_canned_openai_stream() -> None:
    """vLLM's /v1/completions stream (OpenAI format, usage in the last chunk, [DONE]); the
    summary's speculative numbers are the /metrics deltas around the request."""
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "vllm"
    scrapes = [(fixtures / n).read_text() for n in ("scrape_1.txt", "scrape_2.txt")]
    state = {"streamed": False}

    def metrics(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        return text(scrapes[1] if state["streamed"] else scrapes[0])

    def completions(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        state["streamed"] = True
        chunks: list[dict[str, Any]] = [{"choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                                        for piece in ("Hello", ",", " world")]
        chunks.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return 200, "text/event-stream", sse.encode()

    canned = Canned({"/metrics": metrics, "/v1/completions": completions})
    with ReplayServer(canned) as srv:
        source = RemoteSource(srv.url, interval=5.0, max_tokens=3)
        events = collect(source)
        try:
            wait_for(events, lambda e: isinstance(e, E.SettingsEvent))
            source.send(E.NewPrompt("Say hello", "hello"))
            summary = wait_for(events, lambda e: isinstance(e, E.Summary))
        finally:
            source.close()
        posts = [(m, p) for m, p, _ in canned.seen if m == "POST"]
    assert posts == [("POST", "/v1/completions")]
    steps = [e for e in events if isinstance(e, E.StepEvent)]
    assert [s.text for s in steps] == ["Hello", ",", " world"] and summary.text == "Hello, world"
    assert summary.stop_reason == "max_tokens" and (summary.n_prompt, summary.n_generated) == (5, 3)
    # Between the two scrapes: 150 drafts, 450 draft tokens, 242 accepted.
    assert (summary.num_drafts, summary.num_draft_tokens, summary.num_accepted_tokens) == (150, 450, 242)
    assert summary.num_accepted_tokens_per_pos == [112, 80, 50]
    assert summary.acceptance_rate == pytest.approx(242 / 450)


def test_a_poll_cut_short_by_stop_ends_the_poller_quietly():
    """The source's close() stops the poller and closes its HTTP client at once; a poll in
    flight then fails on the closed client. That ends the thread, with no exception (CI saw
    one as a thread-exception warning)."""
    import threading

    started, release = threading.Event(), threading.Event()

    class ClosedUnderIt:
        url = "http://127.0.0.1:1"

        def poll(self):
            started.set()
            release.wait(10)
            raise RuntimeError("Cannot send a request, as the client has been closed.")

    seen: list[BaseException] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    try:
        poller = Poller(ClosedUnderIt(), lambda result: None, interval=0.1)  # type: ignore[arg-type]
        poller.start()
        assert started.wait(10)
        poller.stop()
        release.set()
        poller._thread.join(10)
        assert not poller.alive
    finally:
        threading.excepthook = old_hook
    assert seen == []
