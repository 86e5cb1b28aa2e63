"""Schema-bound output through `specdash serve`, exact under speculation: with every drafter
(lookup, suffix, the draft model, auto), one request at a time and three batched, greedy
output under a JSON schema is greedy decoding under the same grammar token for token (or
first differs at a near-tie of the masked logits), and the content validates. The reference
is a plain loop here: one token a step, masked by the same llguidance grammar."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_serve import CTX, TIE_GAP, start_server, stop_server  # noqa: E402

from specdash.engine.grammar import Grammars  # noqa: E402
from specdash.engine.llm import LLM  # noqa: E402
from specdash.models.registry import model_path  # noqa: E402
from specdash.serve.chat_template import ChatTemplate  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                         "city": {"enum": ["London", "Paris", "Rome"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
PROMPTS = ["Describe Ada, 36, from London, as JSON.", "Give me a JSON record for a person from Rome.",
           "JSON for Bob who is 50 and likes chess and tea."]
TOKENS = 64


@pytest.fixture(scope="module")
def server(small_draft):
    proc, url, lines = start_server("--target", "smollm2-135m", "--draft", str(small_draft), "--k", "4",
                                    "--parallel", "3")
    yield url
    assert stop_server(proc) == 0, "".join(lines)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def plain():
    """Greedy decoding under the grammar, one token a step: (tokens, top-two gaps)."""
    llm = LLM(model_path("smollm2-135m"), n_ctx=CTX, n_threads=2)
    grammars = Grammars(llm.vocab, llm.n_vocab)
    template = ChatTemplate(llm)
    cache: dict[str, tuple[list[int], list[float]]] = {}

    def run(text: str) -> tuple[list[int], list[float]]:
        if text not in cache:
            prompt = template.tokens([{"role": "user", "content": text}])
            grammar = grammars.json_schema(SCHEMA, "response_format").start()
            llm.clear()
            llm.prefill(prompt[:-1])
            token, n, out, gaps = prompt[-1], len(prompt) - 1, [], []
            for _ in range(TOKENS):
                row = grammar.mask(llm.decode([token], n, logits="all"), [])[0]
                n += 1
                top = np.sort(row[np.isfinite(row)])[-2:]
                gaps.append(float(top[-1] - top[0]) if top.size == 2 else float("inf"))
                token = int(row.argmax())
                if llm.is_eog(token):  # (the server's tokens end before it too)
                    break
                out.append(token)
                grammar.accept([token])
            cache[text] = (out, gaps)
        return cache[text]

    yield run
    llm.close()


def ask(client, text: str, drafter: str | None = None, grammar: bool = True):
    extra = {"return_tokens": True, **({"speculative.types": [drafter]} if drafter else {}),
             **({} if grammar else {"speculative.grammar": False})}
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], temperature=0,
                                          max_tokens=TOKENS, response_format=FORMAT, extra_body=extra)


def assert_plain_under_grammar(reply, want: tuple[list[int], list[float]], what: str) -> None:
    got, (tokens, gaps) = reply.model_extra["tokens"], want
    i = next((i for i, (a, b) in enumerate(zip(got, tokens)) if a != b), None)
    if i is None:
        assert len(got) == len(tokens) or len(got) == TOKENS, (what, got, tokens)
    else:
        assert gaps[i] < TIE_GAP, f"{what}: token {i} is {got[i]}, plain's under the grammar {tokens[i]} (gap {gaps[i]:.3f})"
    if reply.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


@pytest.mark.parametrize("drafter", ["lookup", "suffix", "draft", "auto"])
def test_greedy_under_a_schema_is_plain_decoding_under_it_for_every_drafter(client, plain, drafter):
    drafted = accepted = 0
    for text in PROMPTS[:2]:
        reply = ask(client, text, drafter)
        assert reply.choices[0].finish_reason == "stop", reply  # the schema's object, closed, then the end
        assert_plain_under_grammar(reply, plain(text), f"{drafter}: {text}")
        drafted += reply.model_extra["timings"]["draft_n"]
        accepted += reply.model_extra["timings"]["draft_n_accepted"]
    if drafter == "draft":  # it drafted under the grammar, and its drafts were taken
        assert drafted > 0 and accepted > 0, (drafted, accepted)


@pytest.mark.parametrize("drafter", ["lookup", "suffix", "auto"])
def test_three_batched_requests_each_keep_their_own_grammar(client, plain, drafter):
    """(Batched, every request drafts copies: a draft model has one context.)"""
    replies: dict[str, object] = {}

    def one(text: str) -> None:
        replies[text] = ask(client, text, drafter)

    threads = [threading.Thread(target=one, args=(t,)) for t in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(replies) == set(PROMPTS)
    for text, reply in replies.items():
        assert_plain_under_grammar(reply, plain(text), f"batched, {drafter}: {text}")


def grammar_accepted(server: str) -> float:
    """The server's own count of accepted tokens the grammar drafted (/metrics)."""
    text = httpx.get(server + "/metrics", timeout=30).text
    found = re.search(r'^specdash_source_accepted_tokens_total\{[^}]*drafter="grammar"[^}]*\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def settled(server: str, before: float) -> float:
    """The count once the last answer's steps reached the exporter (they trail the answer)."""
    for _ in range(30):
        now = grammar_accepted(server)
        if now != before:
            return now
        time.sleep(0.1)
    return before


def test_the_grammar_drafts_the_text_it_fixes_and_stays_exact(server, client, plain):
    """The text the schema fixes (keys, quotes, the rest of an enum value) is drafted and
    verified: the same greedy answer as plain decoding under the grammar with it and without
    it (`speculative.grammar: false`), more of it accepted from drafts, and the server counts
    the grammar's tokens apart."""
    text = PROMPTS[0]
    start = grammar_accepted(server)
    off = ask(client, text, "lookup", grammar=False)
    time.sleep(1.0)
    assert grammar_accepted(server) == start  # turned off, it drafted nothing
    on = ask(client, text, "lookup")
    assert settled(server, start) > start
    for reply, what in ((off, "grammar drafts off"), (on, "grammar drafts on")):
        assert reply.choices[0].finish_reason == "stop", reply
        assert_plain_under_grammar(reply, plain(text), what)
    assert on.model_extra["timings"]["draft_n_accepted"] > off.model_extra["timings"]["draft_n_accepted"]


def test_sampled_answers_stay_inside_the_schema(client):
    for seed in range(3):
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPTS[1]}],
                                               temperature=1.0, seed=seed, max_tokens=160, response_format=FORMAT)
        if reply.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
        else:  # cut by max_tokens: what came is still a prefix the grammar allowed
            assert reply.choices[0].message.content.startswith("{")


def test_a_schema_the_grammar_cannot_enforce_is_refused_by_name(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], response_format=bad)
    assert "uniqueItems" in str(err.value) and err.value.body["param"] == "response_format"
