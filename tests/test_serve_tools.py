"""Tool calls through `specdash serve` with the openai SDK, on the model the issue names for
tools (Qwen2.5-Coder-0.5B, whose chat template describes them): whole and streamed calls
agree, the deltas have llama-server's shape, `tool_choice: none` answers in text, and a
second turn with the call and its result is rendered by the template and reuses the rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_serve import start_server, stop_server  # noqa: E402

from specdash.engine.llm import LLM  # noqa: E402
from specdash.models.registry import model_path  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    proc, url, lines = start_server("--target", "qwen2.5-coder-0.5b", "--draft", "lookup", "--parallel", "1")
    yield url
    assert stop_server(proc) == 0, "".join(lines)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_a_tool_call_whole_and_streamed_joined_by_the_sdk_are_the_same_call(server, client):
    whole = client.chat.completions.create(model="gpt-4o", messages=ASK, tools=TOOLS, temperature=0)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert whole.model == "qwen2.5-coder-0.5b"  # any name is served; the answer names the model

    with client.chat.completions.stream(model="gpt-4o", messages=ASK, tools=TOOLS, temperature=0) as stream:
        for _ in stream:
            pass
        joined = stream.get_final_completion().choices[0]
    assert joined.finish_reason == "tool_calls"
    (streamed,) = joined.message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == (call.function.name, call.function.arguments)

    # The raw deltas: id, type and name once, in the call's first delta; then arguments only.
    deltas = []
    body = {"messages": ASK, "tools": TOOLS, "temperature": 0, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                deltas.append(json.loads(line[6:])["choices"][0])
    parts = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert "id" in parts[0] and parts[0]["function"]["name"] == "get_weather" and parts[0]["type"] == "function"
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in parts[1:])
    assert len(parts) > 2  # the arguments came as they were written, not at the end
    assert "".join(p["function"]["arguments"] for p in parts) == call.function.arguments
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert not any(d["delta"].get("content") for d in deltas)


def test_tool_choice_none_answers_in_text(client):
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                       max_tokens=24)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def test_the_next_turn_carries_the_call_and_its_result_through_the_template(client):
    from specdash.serve.chat_template import ChatTemplate
    from specdash.serve.tools import history_calls

    first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0)
    message = first.choices[0].message
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "Paris: 14 C, light rain."}
    turn = ASK + [message.model_dump(exclude_none=True), result]  # content null, as agents send it
    second = client.chat.completions.create(model="m", messages=turn, tools=TOOLS, temperature=0, max_tokens=32)
    assert second.choices[0].finish_reason in ("tool_calls", "stop", "length")
    # The prompt is the template's rendering of the whole history (the call, then the result).
    vocab = LLM(model_path("qwen2.5-coder-0.5b"), vocab_only=True)
    try:
        template = ChatTemplate(vocab)
        calls = history_calls([c.model_dump() for c in message.tool_calls], 1)
        history = [ASK[0], {"role": "assistant", "content": "", "tool_calls": calls},
                   {"role": "tool", "tool_call_id": result["tool_call_id"], "content": result["content"]}]
        text = template.render(history, TOOLS)
        assert '<tool_response>\nParis: 14 C, light rain.\n</tool_response>' in text
        assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
        assert second.usage.prompt_tokens == len(template.tokens(history, TOOLS))
    finally:
        vocab.close()
    # The rows the first turn left (its prompt) are reused.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


TWO = TOOLS + [{"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"],
                   "additionalProperties": False}}}]


@pytest.mark.parametrize("choice,name", [("required", None), ({"type": "function", "function": {"name": "get_time"}},
                                                              "get_time")])
def test_a_required_or_named_call_is_enforced_whole_and_streamed(client, choice, name):
    """A grammar makes the answer a call: it parses, names a tool (the one named), and its
    arguments validate against that tool's schema; streamed, the SDK joins the same call."""
    import jsonschema

    whole = client.chat.completions.create(model="m", messages=ASK, tools=TWO, tool_choice=choice, temperature=0)
    assert whole.choices[0].finish_reason == "tool_calls"
    (call,) = whole.choices[0].message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TWO}
    assert call.function.name == (name or call.function.name) and call.function.name in schemas
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    with client.chat.completions.stream(model="m", messages=ASK, tools=TWO, tool_choice=choice,
                                        temperature=0) as stream:
        for _ in stream:
            pass
        (streamed,) = stream.get_final_completion().choices[0].message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == (call.function.name, call.function.arguments)
