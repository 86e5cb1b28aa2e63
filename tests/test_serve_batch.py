"""`specdash serve --parallel N`: several clients in one target batch, through a real server
on 127.0.0.1 and the real `openai` client, on SmolLM2-135M.

Four clients at once each get their own plain greedy decoding (or differ first at a
near-tie, tests/test_engine_exact.py's rule) while the server's recording shows their steps
sharing target batches; a client that leaves mid-stream ends alone while the others go on;
`--parallel auto` says what it measured and serves that many at once.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from cli_helpers import assert_usage_error, specdash  # noqa: E402
from specdash.contract import events as E  # noqa: E402
from specdash.models.registry import model_path  # noqa: E402
from specdash.records.recording import read_recording  # noqa: E402
from test_serve import CTX, assert_plain, chat_tokens, leave_mid_stream, start_server, stop_server  # noqa: E402

pytestmark = pytest.mark.slow

ASKS = {
    "code": "Rewrite this with a list comprehension:\n\ndef squares(xs):\n    out = []\n    for x in xs:\n"
            "        out.append(x * x)\n    return out\n",
    "list": "Repeat this list twice: red, green, blue, yellow, purple.",
    "json": "Give a JSON object with the keys name, age and city for Ada, 36, London.",
    "story": "Tell a two-sentence story about a lighthouse.",
}


@pytest.fixture(scope="module")
def vocab():
    from specdash.engine.llm import LLM

    llm = LLM(model_path("smollm2-135m"), vocab_only=True)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def reference(greedy_reference):
    return greedy_reference(model_path("smollm2-135m"), ctx=CTX)


def batched_server(*extra: str):
    return start_server("--target", "smollm2-135m", "--draft", "lookup", "--k", "4", "--parallel", "4", *extra)


def test_four_clients_at_once_share_batches_and_each_gets_its_plain_decoding(tmp_path, reference, vocab, near_ties):
    record = tmp_path / "serve.jsonl"
    proc, url, lines = batched_server("--record", str(record))
    try:
        asked = ask_four(url, vocab)
    finally:
        assert stop_server(proc) == 0, "".join(lines)
    for name, text in ASKS.items():
        assert asked[name], name
        assert_plain(reference, chat_tokens(vocab, text), asked[name], f"serve --parallel 4 {name}", near_ties)
    # The server's own record: the four ran in shared batches, each step naming its request.
    steps = [ev for ev in read_recording(record).events if isinstance(ev, E.StepEvent)]
    assert max(ev.batch for ev in steps) >= 3, [ev.batch for ev in steps][:20]
    assert len({ev.request for ev in steps if ev.batch >= 2}) >= 3
    assert sum(ev.drafted for ev in steps) > 0  # a fixed K=4 drafts every copy it finds
    # The log names each request on its own line, not the last one admitted.
    done = [line for line in lines if "prompt tokens" in line]
    assert len({line.split(": ", 2)[0] for line in done}) >= 4, done


def ask_four(url: str, vocab) -> dict[str, list[int]]:
    """The four ASKS at once, greedy, through the openai client: the tokens of each answer."""
    assert httpx.get(url + "/props").json()["total_slots"] == 4
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    got: dict[str, list[int]] = {}
    barrier = threading.Barrier(len(ASKS))

    def ask(name: str) -> None:
        barrier.wait()
        r = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": ASKS[name]}],
                                           temperature=0, max_tokens=48, extra_body={"return_tokens": True})
        got[name] = r.model_extra["tokens"] if r.model_extra and "tokens" in r.model_extra else \
            vocab.tokenize(r.choices[0].message.content or "", add_special=False)

    threads = [threading.Thread(target=ask, args=(name,)) for name in ASKS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert set(got) == set(ASKS)
    return got


@pytest.fixture(scope="module")
def batched():
    proc, url, lines = batched_server()
    yield url, lines
    assert stop_server(proc) == 0, "".join(lines)


def test_a_client_leaving_mid_stream_ends_alone_while_the_others_go_on(batched, reference, vocab, near_ties):
    url = batched[0]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    result: dict[str, str] = {}

    def stay() -> None:
        r = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": ASKS["story"]}],
                                           temperature=0, max_tokens=64)
        result["story"] = r.choices[0].message.content or ""
        result["finish"] = r.choices[0].finish_reason

    staying = threading.Thread(target=stay)
    leave_mid_stream(url, 5, staying.start)
    staying.join(120)
    assert result.get("finish") in ("stop", "length"), result
    got = vocab.tokenize(result["story"], add_special=False)
    assert_plain(reference, chat_tokens(vocab, ASKS["story"]), got[:-1] if len(got) > 1 else got,
                 "stays while another leaves", near_ties)
    deadline = time.monotonic() + 10
    while httpx.get(url + "/slots").json()[0]["is_processing"]:
        assert time.monotonic() < deadline, "the abandoned request never ended"
        time.sleep(0.1)


def test_parallel_auto_says_what_it_measured_and_serves_that_many():
    proc, url, lines = start_server("--target", "smollm2-135m", "--draft", "lookup")
    try:
        said = [line for line in lines if "--parallel auto" in line]
        assert said, "".join(lines)
        width = int(said[0].rsplit("up to ", 1)[1].split()[0])
        assert 1 <= width <= 4
        assert httpx.get(url + "/props").json()["total_slots"] == width
        assert len(httpx.get(url + "/slots").json()) == width
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = client.completions.create(model="smollm2-135m", prompt="def add(a, b):", temperature=0, max_tokens=8)
        assert r.usage.completion_tokens >= 1
    finally:
        assert stop_server(proc) == 0, "".join(lines)


@pytest.mark.parametrize("value", ["0", "17", "many"])
def test_a_bad_parallel_is_one_line_and_exit_2(value):
    assert_usage_error(specdash("serve", "--parallel", value, timeout=60), "--parallel", value)
