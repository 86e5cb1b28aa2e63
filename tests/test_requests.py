"""The requests table (specdash/monitor/request_rows.py, `l` in the dashboard): one row per request with
its own numbers, and the selected one's acceptance-length histogram.

- a real llama-server in drive mode (SmolLM2 drafting for itself, K=4): each row's
  drafted / accepted / generated equal the server's own counts for that request, read
  here from its /metrics around each request with a regex (not specdash's parser);
- a vLLM response scripted in vLLM's documented per-request format (vLLM PR #48915,
  `--per-request-spec-decode-metrics`: a top-level `metrics.speculative_decoding` object
  in the final usage chunk, `acceptance_histogram[j]` = verify steps that accepted exactly
  j draft tokens). vLLM cannot run here, so this is a test against its documented format,
  not against a live vLLM;
- the embedded engine's recorded run: the histogram built from its own steps."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

from conftest_remote import Canned, LlamaServer, ReplayServer, llama_server, text  # noqa: F401
from specdash.contract import events as E
from specdash.monitor.request_rows import RequestLog, histogram_of
from specdash.sources.remote import RemoteSource, request_spec
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.app_base import first_then_new
from specdash.tui.screens.requests import RequestsScreen
from test_remote_llamacpp import raw_metrics
from test_tui_support import load_replay

# vLLM's documented example (PR #48915's description), as the final usage chunk carries it.
VLLM_SPEC = {"mean_acceptance_length": 1.2325581395348837, "draft_acceptance_rate": 0.07751937984496124,
             "acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43, "num_accepted_draft_tokens": 10,
             "num_draft_tokens": 129, "num_spec_tokens": 3}


def remote_app(source: RemoteSource) -> SpecdashApp:
    return SpecdashApp(DashboardOptions(screenshots_dir="/tmp"), local_telemetry=False,
                       source_factory=first_then_new(source, lambda prompts: source.again()))


async def rows_reach(pilot: Any, n: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while len(pilot.app.state.requests) < n and time.monotonic() < deadline:
        await pilot.pause(0.1)
    assert len(pilot.app.state.requests) >= n, "no request finished"


def shown_row(screen: RequestsScreen, i: int) -> list[str]:
    return [str(cell) for cell in screen.table.get_row_at(i)]


def test_requests_from_a_real_llama_server_in_drive_mode(llama_server: LlamaServer) -> None:
    prompts = ["def fibonacci(n):\n", "The capital of France is"]

    async def body() -> None:
        source = RemoteSource(llama_server.url, interval=0.5, max_tokens=40)
        app = remote_app(source)
        async with app.run_test(size=(120, 36)) as pilot:
            while app.state.settings is None:
                await pilot.pause(0.1)
            deltas = []
            for i, prompt in enumerate(prompts):
                before = raw_metrics(llama_server.url)
                source.send(E.NewPrompt(prompt, f"p{i}"))
                await rows_reach(pilot, i + 1)
                after = raw_metrics(llama_server.url)
                deltas.append({k: after[k] - before.get(k, 0.0) for k in after if k.startswith("llamacpp:")})
            await pilot.press("l")
            await pilot.pause(0.8)
            screen = app.screen
            assert isinstance(screen, RequestsScreen)
            rows = list(app.state.requests.rows)
            assert [r.title for r in rows] == ["p0", "p1"]
            for row, d in zip(rows, deltas):
                # The request's own timings, as the server counted this request.
                assert row.drafted == d["llamacpp:spec_decode_num_draft_tokens_total"] > 0
                assert row.accepted == d["llamacpp:spec_decode_num_accepted_tokens_total"]
                assert row.num_drafts == d["llamacpp:spec_decode_num_drafts_total"]
                assert row.n_generated == d["llamacpp:tokens_predicted_total"]
                assert row.n_prompt > 0 and row.tokens_per_s > 0 and row.drafter == "draft-simple"
                assert row.acceptance_length == pytest.approx(1 + row.accepted / row.num_drafts)
                # The histogram is built from the request's steps and adds up to its counts.
                assert row.histogram_from == "steps"
                assert sum(row.histogram) == row.num_drafts
                assert sum(j * n for j, n in enumerate(row.histogram)) == row.accepted
            cells = shown_row(screen, 0)
            assert cells[1:6] == ["p0", str(rows[0].n_prompt), str(rows[0].n_generated), str(rows[0].drafted),
                                  str(rows[0].accepted)]
            screen.table.move_cursor(row=0)
            await pilot.pause(0.2)
            title = str(screen.query_one("#histogram").border_title)
            assert title.startswith(f"Acceptance length · p0: {rows[0].num_drafts} drafting steps")
            bars = [re.sub(r"\[/?[^\]]*\]", "", line) for line in screen.bar_text.splitlines()]
            assert len(bars) == len(rows[0].histogram)
            assert [int(line.rsplit(" ", 1)[1]) for line in bars] == rows[0].histogram
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, RequestsScreen)

    asyncio.run(body())


def vllm_server(spec: dict[str, Any] | None) -> ReplayServer:
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "vllm"
    scrapes = [(fixtures / n).read_text() for n in ("scrape_1.txt", "scrape_2.txt")]
    state = {"streamed": False}

    def metrics(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        return text(scrapes[1] if state["streamed"] else scrapes[0])

    def completions(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        state["streamed"] = True
        chunks: list[dict[str, Any]] = [{"choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                                        for piece in ("def", " f", "(x", "):")]
        chunks.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        final: dict[str, Any] = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 53,
                                                          "total_tokens": 60}}
        if spec is not None:
            final["metrics"] = {"speculative_decoding": spec}
        chunks.append(final)
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return 200, "text/event-stream", sse.encode()

    return ReplayServer(Canned({"/metrics": metrics, "/v1/completions": completions}))


def test_requests_from_a_scripted_vllm_response_with_its_histogram() -> None:
    async def body() -> None:
        with vllm_server(VLLM_SPEC) as srv:
            source = RemoteSource(srv.url, interval=5.0, max_tokens=53, prompt="def f(x):", prompt_title="vllm")
            app = remote_app(source)
            async with app.run_test(size=(100, 30)) as pilot:
                await rows_reach(pilot, 1, timeout=30)
                row = app.state.requests.rows[0]
                # The request's own numbers, not the /metrics deltas (450 draft tokens there).
                assert (row.num_drafts, row.drafted, row.accepted) == (43, 129, 10)
                assert row.acceptance_length == pytest.approx(1.2325581395348837)
                assert row.histogram == [39, 1, 0, 3] and row.histogram_from == "server"
                assert (row.n_prompt, row.n_generated, row.title) == (7, 53, "vllm")
                summary = app.state.stats.last_summary
                assert summary is not None and summary.acceptance_histogram == [39, 1, 0, 3]
                assert summary.num_accepted_tokens_per_pos == [4, 3, 3]  # steps that accepted > i
                assert summary.acceptance_rate == pytest.approx(10 / 129)
                await pilot.press("l")
                await pilot.pause(0.8)
                screen = app.screen
                assert isinstance(screen, RequestsScreen)
                assert shown_row(screen, 0)[1:8] == ["vllm", "7", "53", "129", "10", "1.23", f"{row.tokens_per_s:.1f}"]
                title = str(screen.query_one("#histogram").border_title)
                assert title == ("Acceptance length · vllm: 43 drafting steps, bar j = steps that accepted j draft "
                                 "tokens (the server's histogram)")
                bars = [re.sub(r"\[/?[^\]]*\]", "", line) for line in screen.bar_text.splitlines()]
                assert [line.split(" │ ")[0] for line in bars] == ["0", "1", "2", "3"]
                assert [int(line.rsplit(" ", 1)[1]) for line in bars] == [39, 1, 0, 3]
                assert bars[0].count("█") > bars[3].count("█") > 0 and "█" not in bars[2]

    asyncio.run(body())


def test_without_per_request_metrics_the_deltas_stand_in() -> None:
    """A vLLM started without --per-request-spec-decode-metrics: the /metrics deltas around
    the request, as before, and no histogram."""

    async def body() -> None:
        with vllm_server(None) as srv:
            source = RemoteSource(srv.url, interval=5.0, max_tokens=53, prompt="def f(x):")
            app = remote_app(source)
            async with app.run_test(size=(100, 30)) as pilot:
                await rows_reach(pilot, 1, timeout=30)
                row = app.state.requests.rows[0]
                assert (row.num_drafts, row.drafted, row.accepted) == (150, 450, 242)
                assert row.histogram == [] and row.histogram_from == ""

    asyncio.run(body())


@pytest.mark.parametrize("spec, ok", [
    (VLLM_SPEC, True),
    ({**VLLM_SPEC, "acceptance_histogram": {"0": 39, "1": 1, "3": 3}}, True),  # sparse, as some clients show it
    ({**VLLM_SPEC, "acceptance_histogram": [39, -1]}, False),
    ({**VLLM_SPEC, "num_accepted_draft_tokens": 500}, False),  # more accepted than drafted
    ({**VLLM_SPEC, "acceptance_histogram": [1] * 70}, False),  # beyond any K
    ({"num_spec_steps": 1}, False),
])
def test_request_spec_reads_what_vllm_documents_and_nothing_else(spec: dict[str, Any], ok: bool) -> None:
    parsed = request_spec({"metrics": {"speculative_decoding": spec}})
    assert (parsed is not None) == ok
    if ok:
        assert parsed is not None and parsed.acceptance_histogram == [39, 1, 0, 3]


def test_the_engines_requests_build_their_histogram_from_steps() -> None:
    events = load_replay()
    log = RequestLog()
    for ev in events:
        log.feed(ev)
    summaries = [ev for ev in events if isinstance(ev, E.Summary)]
    assert len(log) == len(summaries) > 0
    steps: list[list[E.StepEvent]] = [[]]
    for ev in events:
        if isinstance(ev, E.StepEvent):
            steps[-1].append(ev)
        elif isinstance(ev, E.Summary):
            steps.append([])
    for row, summary, own in zip(log.rows, summaries, steps):
        assert row.histogram == histogram_of(own) and row.histogram_from == "steps"
        assert sum(row.histogram) == summary.num_drafts
        assert sum(j * n for j, n in enumerate(row.histogram)) == summary.num_accepted_tokens
        assert row.drafter == "lookup" and row.tokens_per_s == summary.tokens_per_s


def _summary(request: str, calls: list[str]) -> E.Summary:
    return E.Summary("{}", "eos", 10, 9, 2, 6, 5, [2, 2, 1], 5 / 6, 2.5, 30.0, 100.0, 5.0, 0.3, 1.0, 20.0, 1.0, 4,
                     request=request, calls=calls)


def test_a_row_names_the_tool_called_and_the_grammars_share() -> None:
    """A served request's Summary names the calls its answer made (EmbeddedSource sets them
    from the request); its steps drafted by the grammar are counted apart."""
    log = RequestLog()
    tag = "chat+tools #7 from 127.0.0.1"
    steps = [E.StepEvent(step=i + 1, k=4, drafter=d, drafted=n, accepted=a, tokens=[1] * (a + 1), pieces=["x"] * (a + 1),
                         from_draft=[True] * a + [False], draft_ms=0.1, verify_ms=10.0, other_ms=0.1, n_past=10 + i,
                         n_generated=i, t=float(i + 1), request=tag)
             for i, (d, n, a) in enumerate((("grammar", 4, 4), ("lookup", 2, 1), ("grammar", 3, 2), ("none", 0, 0)))]
    for ev in [E.PromptEvent(tag, "What is the weather?", request=tag, t=0.5), *steps,
               _summary(tag, ["get_weather"])]:
        log.feed(ev)
    (row,) = log.rows
    assert row.calls == ["get_weather"] and row.label == "get_weather() #7"
    assert (row.grammar_drafted, row.grammar_accepted) == (7, 6)
    from specdash.tui.screens.requests import cells, histogram_title

    # 12 cells at 80 columns: the tool's name cut, its number kept (rows of one tool differ
    # there); a wider terminal shows it whole.
    assert str(cells(row)[1]) == "get_weat… #7"
    assert str(cells(row, 20)[1]) == "get_weather() #7"
    title = histogram_title(row)
    assert "called get_weather()" in title and "its grammar drafted 7 tokens (6 accepted)" in title
    log.feed(_summary("", []))  # an answer without calls keeps its title
    assert log.rows[-1].label == log.rows[-1].title
