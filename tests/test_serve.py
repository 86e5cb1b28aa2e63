"""`specdash serve`: a real server on 127.0.0.1, the real `openai` client, real decoding.

One headless server on SmolLM2-135M drafting with its own Q4_0 copy at a fixed K=4 (so
every step drafts, whatever this CPU's cost curve), one request at a time (--parallel 1: a
batch drafts copies only; tests/test_serve_batch.py serves several at once), is shared by
the module. Greedy output
is checked against plain greedy decoding of the same prompt tokens, token for token but
where the target's top-two logit gap is a near-tie (the exactness tests' TIE_GAP rule);
the server returns the ids it generated when asked (`return_tokens`, llama-server's key).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest

openai = pytest.importorskip("openai")

from cli_helpers import read_url  # noqa: E402
from specdash.engine.llm import LLM  # noqa: E402
from specdash.models.registry import model_path  # noqa: E402

TIE_GAP = 0.5  # logits; tests/test_engine_exact.py's
CTX = 2048
PROMPTS = {
    "code": "Rewrite this function to use a list comprehension:\n\ndef squares(xs):\n    out = []\n"
            "    for x in xs:\n        out.append(x * x)\n    return out\n",
    "summary": "Summarise in two sentences: The quick brown fox jumps over the lazy dog. The dog, "
               "unbothered, keeps sleeping in the afternoon sun while the fox runs into the forest.",
    "json": "Give a JSON object with the keys name, age and city for a person called Ada, 36, from London.",
}


def start_server(*extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, list[str]]:
    """`specdash serve --headless --port 0 ...`; (process, base URL, its stderr lines so far)."""
    cmd = [sys.executable, "-m", "specdash", "serve", "--headless", "--port", "0", "--ctx", str(CTX),
           "--threads", "2", *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})
    url, lines = read_url(proc, r"listening on (http://\S+) ")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, "".join(lines)
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url, lines
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("never healthy:\n" + "".join(lines))


def stop_server(proc: subprocess.Popen) -> int:
    # SIGTERM, as a service manager stops it (SIGINT does nothing where the suite itself
    # was started as a background job: the child inherits SIGINT ignored).
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.fixture(scope="module")
def server(small_draft):
    proc, url, lines = start_server("--target", "smollm2-135m", "--draft", str(small_draft), "--k", "4", "--parallel", "1")
    yield url, lines
    code = stop_server(proc)
    assert code == 0, "".join(lines)
    assert any("stopped after" in line for line in lines), "".join(lines)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vocab():
    llm = LLM(model_path("smollm2-135m"), vocab_only=True)
    yield llm
    llm.close()


def chat_tokens(vocab, text: str) -> list[int]:
    from specdash.serve.chat_template import ChatTemplate

    return ChatTemplate(vocab).tokens([("user", text)])


def assert_plain(reference, prompt: list[int], got: list[int], what: str, near_ties: list[str]) -> None:
    """`got` is the greedy continuation of `prompt`, or differs first at a near-tie."""
    want = reference.plain(prompt, len(got), None)
    if got == want[: len(got)]:
        return
    i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    pos = len(prompt) + i
    verdict = reference.teacher_force(prompt + got, len(prompt), [pos], None)[pos]
    assert verdict[0] == got[i] or verdict[1] < TIE_GAP, \
        f"{what}: token {i} is {got[i]}, plain decoding's {want[i]} (top-two gap {verdict[1]:.3f})"
    near_ties.append(f"serve {what}: token {i} (gap {verdict[1]:.3f})")


@pytest.fixture(scope="module")
def reference(greedy_reference):
    return greedy_reference(model_path("smollm2-135m"), ctx=CTX)


def test_chat_is_plain_decoding_while_every_step_drafts(client, reference, vocab, near_ties):
    for name, text in PROMPTS.items():
        r = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": text}],
                                           temperature=0, max_tokens=40, extra_body={"return_tokens": True})
        got = r.model_extra["tokens"]
        assert r.choices[0].message.content == vocab.detokenize(got) or r.choices[0].finish_reason == "stop"
        assert_plain(reference, chat_tokens(vocab, text), got, name, near_ties)
        timings = r.model_extra["timings"]
        assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"], timings
        assert r.usage.prompt_tokens == len(chat_tokens(vocab, text))
        assert r.usage.completion_tokens == len(got)
        assert r.choices[0].finish_reason in ("stop", "length")


def test_a_chats_next_turn_reuses_the_rows_it_shares_and_stays_plain_decoding(client, reference, vocab, near_ties):
    messages = [{"role": "user", "content": PROMPTS["code"]}]
    first = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=24)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now add a docstring."}]
    second = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=24,
                                            extra_body={"return_tokens": True})
    from specdash.serve.chat_template import ChatTemplate

    prompt = ChatTemplate(vocab).tokens([(m["role"], m["content"]) for m in messages])
    assert second.usage.prompt_tokens == len(prompt)
    # The first turn's prompt and answer are still in the KV cache: not prefilled again.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert second.model_extra["timings"]["prompt_n"] == len(prompt) - second.usage.prompt_tokens_details.cached_tokens
    assert_plain(reference, prompt, second.model_extra["tokens"], "second turn", near_ties)


def test_streaming_matches_the_whole_response_and_reports_usage(client):
    messages = [{"role": "user", "content": PROMPTS["code"]}]
    whole = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=32)
    stream = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=32,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[0].choices[0].delta.role == "assistant"


def test_stop_strings_end_the_text_and_are_never_sent(client):
    messages = [{"role": "user", "content": PROMPTS["code"]}]
    full = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0,
                                          max_tokens=48).choices[0].message.content
    assert len(full) > 20, full
    stop = full[12:16]  # a piece in the middle; its first occurrence ends the text
    cut = full[: full.find(stop)]
    r = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=48,
                                       stop=["never-in-the-text", stop])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0,
                                              max_tokens=48, stop=[stop], stream=True)
    parts = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(parts) == cut
    assert all(stop not in p for p in parts)


def test_logprobs_for_chat_and_completions_whole_and_streamed(client):
    """Each sent token's logprob and its alternatives, from the target's own rows: the greedy
    token is the most likely, the tokens spell the text, and the stream's entries join to
    the whole answer's; a stop string's tokens are not reported."""
    import math

    messages = [{"role": "user", "content": "List three colours."}]
    whole = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=16,
                                           logprobs=True, top_logprobs=3)
    entries = whole.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == whole.choices[0].message.content
    assert len(entries) == whole.usage.completion_tokens
    for e in entries:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and sum(math.exp(t) for t in tops) <= 1 + 1e-6
        assert e.logprob == pytest.approx(tops[0], abs=1e-4)  # greedy: the most likely token
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    streamed = []
    for ch in client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=16,
                                             logprobs=True, top_logprobs=3, stream=True):
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed += ch.choices[0].logprobs.content
    assert [(e.token, round(e.logprob, 3)) for e in streamed] == [(e.token, round(e.logprob, 3)) for e in entries]
    # Completions, the legacy shape; a stop string's tokens are not reported.
    done = client.completions.create(model="m", prompt="1, 2, 3, 4,", temperature=0, max_tokens=12, logprobs=2,
                                     stop=[" 7"])
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens) == done.choices[0].text and " 7" not in done.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and all(len(t) <= 2 for t in lp.top_logprobs)
    plain = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None  # not asked, not sent


def test_logit_bias_bans_and_forces_tokens_under_speculation(client):
    """OpenAI's logit_bias on the target's rows, the verify rule's distribution: -100 bans a
    token from the answer, +100 makes it the answer (the server drafts with K=4 throughout)."""
    body = {"model": "m", "prompt": "1, 2, 3, 4,", "temperature": 0, "max_tokens": 8}
    plain = client.completions.create(**body, extra_body={"return_tokens": True}).model_extra["tokens"]
    banned = client.completions.create(**body, logit_bias={str(plain[0]): -100},
                                       extra_body={"return_tokens": True}).model_extra["tokens"]
    assert plain[0] not in banned and banned != plain
    forced = client.completions.create(**{**body, "max_tokens": 4}, logit_bias={str(plain[1]): 100},
                                       extra_body={"return_tokens": True}).model_extra["tokens"]
    assert forced == [plain[1]] * 4
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**body, logit_bias={"99999999": 1})
    assert err.value.body["param"] == "logit_bias"


def test_repetition_penalties_stay_plain_decoding_under_speculation(client):
    """Greedy with repeat, frequency and presence penalties through the server (drafting at
    K=4) is greedy decoding one token a step with the same penalties, or differs first at a
    near-tie."""
    import numpy as np

    from specdash.engine.penalties import Penalties, penalized

    prompt_text = "1, 2, 3, 1, 2, 3, 1, 2,"
    body = {"model": "m", "prompt": prompt_text, "temperature": 0, "max_tokens": 24, "frequency_penalty": 0.5,
            "presence_penalty": 0.3}
    got = client.completions.create(**body, extra_body={"return_tokens": True, "repeat_penalty": 1.3}
                                    ).model_extra["tokens"]
    unpenalized = client.completions.create(model="m", prompt=prompt_text, temperature=0, max_tokens=24,
                                            extra_body={"return_tokens": True}).model_extra["tokens"]
    assert got != unpenalized  # the penalties changed the answer
    llm = LLM(model_path("smollm2-135m"), n_ctx=CTX, n_threads=2)
    try:
        p = Penalties(repeat=1.3, frequency=0.5, presence=0.3)
        tokens = llm.tokenize(prompt_text)
        llm.prefill(tokens[:-1])
        want, gaps = [], []
        for _ in range(len(got)):
            row = penalized(llm.decode([tokens[-1]], len(tokens) - 1, logits="all"), tokens, [], p)[0]
            top = np.sort(row)[-2:]
            gaps.append(float(top[1] - top[0]))
            tokens.append(int(row.argmax()))
            want.append(tokens[-1])
    finally:
        llm.close()
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert i is None or gaps[i] < TIE_GAP, (i, got, want)


def test_min_p_keeps_only_tokens_near_the_most_likely_while_drafting(client):
    """Sampled at temperature 1 (so the reported logprobs are the sampling distribution's
    before the cut), every token min_p=0.5 lets through is at least half as likely as the
    best; without it, some are not."""
    import math

    def tokens(min_p: float, seed: int) -> list:
        r = client.completions.create(model="m", prompt="Once upon a time", temperature=1.0, top_p=1.0, seed=seed,
                                      max_tokens=24, logprobs=1, extra_body={"min_p": min_p, "top_k": 0})
        lp = r.choices[0].logprobs
        return [(own, next(iter(top.values()))) for own, top in zip(lp.token_logprobs, lp.top_logprobs)]

    for seed in range(3):
        assert all(own >= best + math.log(0.5) - 1e-3 for own, best in tokens(0.5, seed))
    assert any(own < best + math.log(0.5) for seed in range(3) for own, best in tokens(0.0, seed))


def test_completions_and_per_request_speculation(client, reference, vocab, near_ties):
    prompt = "def fibonacci(n):\n    "
    plain = client.completions.create(model="smollm2-135m", prompt=prompt, temperature=0, max_tokens=32,
                                      extra_body={"speculative.n_max": 0, "return_tokens": True})
    assert plain.model_extra["timings"]["draft_n"] == 0  # n_max 0: this request decodes plain
    spec = client.completions.create(model="smollm2-135m", prompt=prompt, temperature=0, max_tokens=32,
                                     extra_body={"speculative.types": ["ngram"], "return_tokens": True})
    tokens = vocab.tokenize(prompt)
    for r, what in ((plain, "n_max=0"), (spec, "types=ngram")):
        assert_plain(reference, tokens, r.model_extra["tokens"], f"completion {what}", near_ties)
        assert r.choices[0].text == vocab.detokenize(r.model_extra["tokens"]) or r.choices[0].finish_reason == "stop"
    # The server's own drafter (the draft model) is back for the next request.
    again = client.completions.create(model="smollm2-135m", prompt=prompt, temperature=0, max_tokens=8)
    assert again.model_extra["timings"]["draft_n"] > 0


def test_three_clients_at_once_run_in_arrival_order(client, reference, vocab, near_ties):
    results: dict[str, tuple[float, list[int], str]] = {}

    def ask(name: str) -> None:
        stream = client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": PROMPTS[name]}], temperature=0,
            max_tokens=24, stream=True, extra_body={"return_tokens": True})
        first, text = 0.0, []
        for c in stream:
            if c.choices and c.choices[0].delta.content and not first:
                first = time.monotonic()
            if c.choices:
                text.append(c.choices[0].delta.content or "")
        results[name] = (first, [], "".join(text))

    threads = []
    for name in PROMPTS:  # arrivals 0.3 s apart: the first is running when the others come
        t = threading.Thread(target=ask, args=(name,))
        t.start()
        threads.append(t)
        time.sleep(0.3)
    for t in threads:
        t.join(120)
    assert set(results) == set(PROMPTS)
    order = sorted(results, key=lambda n: results[n][0])
    assert order == list(PROMPTS), order  # first tokens in arrival order: first in, first out
    for name, text in PROMPTS.items():
        want = reference.plain(chat_tokens(vocab, text), 24, None)
        got = results[name][2]
        if got != vocab.detokenize(want)[: len(got)]:
            # Text differs: judge it by tokens (a near-tie may flip one).
            assert_plain(reference, chat_tokens(vocab, text), vocab.tokenize(got, add_special=False), name, near_ties)


def _post(url: str, path: str, body: object, **kw) -> httpx.Response:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(url + path, content=data, headers={"Content-Type": "application/json"}, timeout=30, **kw)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", "{not json", None),
    ("/v1/chat/completions", {"messages": "hello"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    # Asked for and not done: refused by name, never a 200 that ignored it (docs/serve.md's table).
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 30}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, "frobnicate"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}},
     "response_format"),
    # SmolLM2's template describes no tools: a request with tools is told so.
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/completions", {"prompt": "hi", "echo": False, "stream_options": {"frobnicate": True}},
     "stream_options.frobnicate"),
    ("/v1/completions", {"prompt": "word " * 3000}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "speculative.types": ["eagle"]}, "speculative.types"),
    ("/v1/completions", {"prompt": 42}, "prompt"),
    # A stop string is searched for at every step on the thread all clients share: capped.
    ("/v1/completions", {"prompt": "hi", "stop": ["b" * 50000]}, "stop"),
    # Malformed past the parser's limits: the client's fault (400), not the server's (500).
    ("/v1/chat/completions", "[" * 100000 + "]" * 100000, None),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 1' + "0" * 5000 + "}", None),
])
def test_bad_input_is_a_400_naming_the_field_and_the_server_goes_on(server, client, path, body, param):
    url = server[0]
    r = _post(url, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"], error
    if param:
        assert param.split(".")[0] in error["message"]
    # Any model name is served (clients come configured with one); the answer names ours.
    ok = client.completions.create(model="gpt-4o", prompt="Hello", temperature=0, max_tokens=2)
    assert ok.usage.completion_tokens >= 1


def leave_mid_stream(url: str, chunks: int, once_open=lambda: None) -> None:
    """A long streamed chat that the client leaves after `chunks` chunks (closing the
    connection); `once_open` runs once the stream has started."""
    body = {"messages": [{"role": "user", "content": "Count from 1 to 500, one number per line."}],
            "max_tokens": 600, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        once_open()
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == chunks:
                    break  # leaving closes the connection


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_client_that_leaves_mid_stream_stops_generation(server, client):
    url = server[0]
    aborted = _metric(url, "specdash_request_success_total", 'finished_reason="abort"')
    generated = _metric(url, "specdash_generation_tokens_total")
    leave_mid_stream(url, 3)
    t0 = time.monotonic()
    ok = client.completions.create(model="smollm2-135m", prompt="Hello", temperature=0, max_tokens=2)
    assert ok.usage.completion_tokens >= 1
    assert time.monotonic() - t0 < 30
    deadline = time.monotonic() + 10
    while _metric(url, "specdash_request_success_total", 'finished_reason="abort"') < aborted + 1:
        assert time.monotonic() < deadline, "the abandoned request was never ended as aborted"
        time.sleep(0.1)
    # It stopped within a few steps of the client leaving, far short of its 600 tokens.
    assert _metric(url, "specdash_generation_tokens_total") - generated < 300


def test_models_health_metrics_props_and_slots(server):
    url = server[0]
    models = httpx.get(url + "/v1/models", timeout=10).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "smollm2-135m"
    assert httpx.get(url + "/health", timeout=10).json() == {"status": "ok"}
    text = httpx.get(url + "/metrics", timeout=10).text
    for name in ("specdash_num_requests_waiting", "specdash_num_requests_running",
                 "specdash_spec_decode_num_draft_tokens_total", "specdash_generation_tokens_total"):
        assert name in text, name
    props = httpx.get(url + "/props", timeout=10).json()
    assert props["default_generation_settings"]["n_ctx"] == CTX
    slots = httpx.get(url + "/slots", timeout=10).json()
    assert slots[0]["id"] == 0 and slots[0]["n_ctx"] == CTX


def test_steering_over_http_changes_k_from_this_machine(server, client):
    url = server[0]
    r = _post(url, "/v1/specdash/command", {"command": "k=2"})
    assert r.status_code == 200 and r.json()["sent"] == "k=2", r.text
    deadline = time.monotonic() + 10
    while httpx.get(url + "/props", timeout=10).json()["default_generation_settings"]["speculative"]["k"] != 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    bad = _post(url, "/v1/specdash/command", {"command": "k=lots"})
    assert bad.status_code == 400 and "lots" in bad.json()["error"]["message"]
    _post(url, "/v1/specdash/command", {"command": "k=4"})


def test_steering_takes_only_what_props_lists_each_in_range(server, client, small_draft):
    """Issue 56 (H2): the route obeys the commands /props lists and nothing else of the
    schedule vocabulary (pause would freeze every client, stop cut answers short, experts=
    reload the target); draft= only a kind or a model already loaded (never a file read, a
    fetch); each value in its range. The server serves on after every refusal."""
    url = server[0]
    listed = httpx.get(url + "/props", timeout=10).json()["specdash"]["commands"]
    assert listed == ["k", "draft", "temp", "adaptive"]
    for text in ("pause", "resume", "stop", "forget", "experts=2", "cut=0.5", "pause=2s", "seek=10"):
        r = _post(url, "/v1/specdash/command", {"command": text})
        assert r.status_code == 403, (text, r.text)
        error = r.json()["error"]
        assert error["type"] == "permission_error" and error["param"] == "command", error
        assert repr(text) in error["message"] and all(f"{w}=" in error["message"] for w in listed), error
    for text in ("draft=/etc/hostname", "draft=smollm2-360m", "draft=[/]"):
        r = _post(url, "/v1/specdash/command", {"command": text})
        assert r.status_code == 403 and "loaded" in r.json()["error"]["message"], (text, r.text)
    for text, why in (("k=65", "0..64"), ("k=-1", "0..64"), ("temp=9", "0..5"), ("temp=nan", "0..5")):
        r = _post(url, "/v1/specdash/command", {"command": text})
        assert r.status_code == 400 and why in r.json()["error"]["message"], (text, r.text)
    props = httpx.get(url + "/props", timeout=10).json()["default_generation_settings"]
    assert props["speculative"]["k"] == 4 and props["params"]["temperature"] == 0.0
    # Not paused, not stopped: a request still runs to its length.
    ok = client.completions.create(model="smollm2-135m", prompt="1, 2, 3,", temperature=0, max_tokens=6)
    assert ok.usage.completion_tokens == 6 and ok.choices[0].finish_reason == "length"
    # A kind, then the draft model this server loaded: both taken.
    def drafter() -> str:
        return httpx.get(url + "/props", timeout=10).json()["default_generation_settings"]["speculative"]["drafter"]

    for text, done in (("draft=lookup", lambda d: d == "lookup"), (f"draft={small_draft}", lambda d: d != "lookup")):
        r = _post(url, "/v1/specdash/command", {"command": text})
        assert r.status_code == 200 and r.json()["sent"] == text, r.text
        deadline = time.monotonic() + 10
        while not done(drafter()):
            assert time.monotonic() < deadline, (text, drafter())
            time.sleep(0.1)


def test_the_api_key_rule(tmp_path):
    # Beyond 127.0.0.1 without a key: refused before any model loads, one line, exit 2.
    r = subprocess.run([sys.executable, "-m", "specdash", "serve", "--headless", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "SPECDASH_API_KEY": ""})
    assert r.returncode == 2 and "needs an API key" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    bad = subprocess.run([sys.executable, "-m", "specdash", "serve", "--theme", "nope"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--theme nope" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    proc, url, lines = start_server("--target", "smollm2-135m", "--draft", "none", "--api-key", "sesame",
                                    "--max-tokens", "3")
    try:
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # public, for load balancers
        denied = _post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
        wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="smollm2-135m", prompt="Hi", max_tokens=2)
        # A key that is not UTF-8 is a wrong key (401), not a server error; the scheme's case is free.
        raw = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30)
        raw.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \xff\xfe\r\n"
                    b"Connection: close\r\n\r\n")
        assert raw.recv(64).startswith(b"HTTP/1.1 401"), "a non-UTF-8 bearer"
        raw.close()
        assert httpx.get(url + "/v1/models", headers={"Authorization": "bearer sesame"}, timeout=10).status_code == 200
        right = openai.OpenAI(base_url=url + "/v1", api_key="sesame", max_retries=0)
        assert right.completions.create(model="smollm2-135m", prompt="Hi", max_tokens=2).usage.completion_tokens >= 1
        # --max-tokens caps a request that sends none.
        capped = right.completions.create(model="smollm2-135m", prompt="Count: 1, 2, 3,")
        assert capped.usage.completion_tokens == 3 and capped.choices[0].finish_reason == "length"
    finally:
        assert stop_server(proc) == 0, "".join(lines)


@pytest.mark.tmux
@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="needs tmux")
def test_the_dashboard_in_tmux_shows_a_streaming_client_and_plus_changes_its_k(tmp_path):
    """As a person would: `specdash serve` in a terminal, a client streaming, `+` pressed."""
    import shlex

    from test_dashboard_tmux import EXIT, Tmux

    tmux = Tmux(f"specdash-serve-{os.getpid()}")
    import socket

    with socket.socket() as s:  # a free port (Textual draws on stderr, where the URL is said)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "specdash", "serve", "--port", str(port), "--ctx", str(CTX), "--target", "smollm2-135m",
        "--draft", "lookup", "--k", "2", "--threads", "1", "--screenshots", str(tmp_path)])
    tmux("new-session", "-d", "-s", "e2e", "-x", "100", "-y", "30", f"{command}; echo {EXIT}$?; sleep 60")
    try:
        tmux.wait_for(lambda s: "◦ serving" in s and "0 running, 0 waiting" in s, "the server waiting", 120)
        steps: list[dict] = []
        body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 500, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        steps.append(json.loads(line[6:]))

        client = threading.Thread(target=stream)
        client.start()
        screen = tmux.wait_for(lambda s: "▶ running" in s and "1 running" in s and "K 2 fixed" in s,
                               "the request running on the status line", 60)
        tmux("send-keys", "-t", "e2e", "+")
        tmux.wait_for(lambda s: "K 3 fixed" in s, "K=3 for the request in flight", 30)
        tmux("send-keys", "-t", "e2e", "l")
        screen = tmux.wait_for(lambda s: "running: completion #" in s, "the requests screen shows it", 30)
        client.join(300)
        usage = steps[-1]["usage"]
        screen = tmux.wait_for(lambda s: re.search(rf"completion .*\s{usage['completion_tokens']}\s", s),
                               "its row, with the tokens the client received", 30)
        tmux("send-keys", "-t", "e2e", "l")  # closes it (Escape then q would read as alt+q)
        tmux.wait_for(lambda s: "Generation" in s, "the dashboard again", 30)
        # A model swap from the dashboard (`d`, a GGUF path) while 20 requests wait: none is
        # lost, and each greedy answer is what the one before the swap was.
        answers: list[tuple[int, int, str]] = []

        def ask(tokens: int) -> None:
            r = httpx.post(url + "/v1/completions", timeout=300,
                           json={"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": tokens, "temperature": 0})
            answers.append((tokens, r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text))

        def drafter() -> str:
            return httpx.get(url + "/props").json()["default_generation_settings"]["speculative"]["drafter"]

        assert drafter() == "lookup"
        first = threading.Thread(target=ask, args=(400,))
        first.start()
        tmux.wait_for(lambda s: "1 running" in s, "a long request running", 60)
        tmux("send-keys", "-t", "e2e", "Space")  # paused, so that the line holds while the test types
        tmux.wait_for(lambda s: "paused" in s, "the engine paused", 30)
        waiting = [threading.Thread(target=ask, args=(12,)) for _ in range(20)]
        for t in waiting:
            t.start()
        tmux.wait_for(lambda s: "20 waiting" in s, "20 requests waiting", 60)
        tmux("send-keys", "-t", "e2e", "d")
        tmux.wait_for(lambda s: "Draft source (now:" in s and " found in " in s, "the picker, its scan done", 120)
        draft = str(model_path("smollm2-135m"))
        time.sleep(1)  # the picker mounted and focused before Tab moves the focus to its path field
        tmux("send-keys", "-t", "e2e", "Tab")
        tmux("send-keys", "-t", "e2e", "-l", draft)
        tmux.wait_for(lambda s: draft[-20:] in s, "the path typed", 30)
        tmux("send-keys", "-t", "e2e", "Enter")
        tmux.wait_for(lambda s: "Draft source (now:" not in s, "the picker closed", 30)
        tmux("send-keys", "-t", "e2e", "Space")
        for t in [first, *waiting]:
            t.join(300)
        assert len(answers) == 21 and {code for _, code, _ in answers} == {200}, answers
        assert len({text for tokens, _, text in answers if tokens == 12}) == 1, answers  # greedy, whatever drafted
        assert drafter() != "lookup"  # the swap took: a draft model now
        tmux.wait_for(lambda s: "0 running, 0 waiting" in s, "the line empty again", 60)
        # A service manager's stop mid-stream (SIGTERM), as `q` would: the client in flight
        # gets an error event and [DONE], and the line says what was cut.
        events: list[str] = []
        second = threading.Thread(target=sse_payloads, args=(url, {**body, "max_tokens": 1500}, events))
        second.start()
        tmux.wait_for(lambda s: "1 running" in s, "a second request running", 60)
        while len(events) < 3 and second.is_alive():
            time.sleep(0.05)
        (serve,) = [p for p in psutil.process_iter(["cmdline"])
                    if "serve" in (p.info["cmdline"] or []) and str(port) in (p.info["cmdline"] or [])]
        serve.send_signal(signal.SIGTERM)
        second.join(60)
        assert events[-1] == "[DONE]" and "stopped" in json.loads(events[-2])["error"]["message"], events[-3:]
        screen = tmux.wait_for(lambda s: EXIT in s, "the process exited", 30)
        assert f"{EXIT}0" in screen, screen
        assert "stopped after 23 requests; cancelled 1 (1 running, 0 waiting)" in screen, screen
    finally:
        tmux("kill-server")


def sse_payloads(url: str, body: dict, out: list[str], started: threading.Event | None = None) -> list[str]:
    """A streamed completion's `data:` payloads, appended to `out` as they come;
    `started` is set once three have come (the stream is decoding)."""
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                if started is not None and len(out) >= 3:
                    started.set()
    return out


def test_attach_reads_drives_and_steers_a_specdash_server(server, client):
    """attach on `specdash serve`: its counters are what the clients received, drive mode
    sends prompts over /v1/completions, and K is steered from here (127.0.0.1, no key)."""
    import asyncio

    from specdash.contract import events as E
    from specdash.sources.remote import RemoteSource
    from test_requests import remote_app, rows_reach

    url = server[0]

    def once() -> dict:
        r = subprocess.run([sys.executable, "-m", "specdash", "attach", url, "--once", "--json"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    before = once()
    r = client.completions.create(model="smollm2-135m", prompt="1, 2, 3, 4, 5, 6, 7, 8,", temperature=0,
                                  max_tokens=40)
    after = once()
    assert after["backend"] == "specdash" and after["model"] == "smollm2-135m"
    assert after["num_draft_tokens"] - before["num_draft_tokens"] == r.model_extra["timings"]["draft_n"]
    assert after["num_accepted_tokens"] - before["num_accepted_tokens"] == r.model_extra["timings"]["draft_n_accepted"]

    async def body() -> None:
        source = RemoteSource(url, interval=0.2, max_tokens=12)
        app = remote_app(source)
        async with app.run_test(size=(120, 36)) as pilot:
            while app.state.settings is None or "k" not in app.state.settings.supports:
                await pilot.pause(0.1)
            source.send(E.NewPrompt("def add(a, b):", "driven"))
            await rows_reach(pilot, 1)
            row = list(app.state.requests.rows)[0]
            assert row.title == "driven" and row.n_generated == 12
            await pilot.press("plus")  # K 4 -> 5 on the server, from here
            for _ in range(100):
                if app.state.settings.k == 5:
                    break
                await pilot.pause(0.1)
            assert app.state.settings.k == 5
            assert httpx.get(url + "/props", timeout=10).json()["default_generation_settings"]["speculative"]["k"] == 5
            await pilot.press("minus")
            for _ in range(100):
                if app.state.settings.k == 4:
                    break
                await pilot.pause(0.1)
            assert app.state.settings.k == 4

    asyncio.run(body())
