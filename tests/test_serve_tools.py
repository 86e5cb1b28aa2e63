"""Tool calls through `specdash serve` with the openai SDK, on the model the issue names for
tools (Qwen2.5-Coder-0.5B, whose chat template describes them): whole and streamed calls
agree, the deltas have llama-server's shape, `tool_choice: none` answers in text, and a
second turn with the call and its result is rendered by the template and reuses the rows."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_serve import start_server, stop_server  # noqa: E402

from specdash.engine.llm import LLM  # noqa: E402
from specdash.monitor.request_rows import RequestLog  # noqa: E402
from specdash.records.recording import read_recording  # noqa: E402
from specdash.tui.screens.requests import histogram_title  # noqa: E402
from specdash.models.registry import model_path  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
LLM_TAG = 151657  # Qwen2.5's <tool_call>, one special token


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return tmp_path_factory.mktemp("tools") / "serve.jsonl"


@pytest.fixture(scope="module")
def server(recording):
    proc, url, lines = start_server("--target", "qwen2.5-coder-0.5b", "--draft", "lookup", "--parallel", "1",
                                    "--record", str(recording))
    yield url
    assert stop_server(proc) == 0, "".join(lines)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_a_tool_call_whole_and_streamed_joined_by_the_sdk_are_the_same_call(server, client, recording):
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

    # The requests screen names the tool each answer called (from the server's own events).
    for _ in range(50):  # the Summary is recorded just after the answer is sent
        log = RequestLog()
        for ev in read_recording(recording).events:
            log.feed(ev)
        rows = [r for r in log.rows if r.title.startswith("chat+tools")]
        if len(rows) >= 2:
            break
        time.sleep(0.1)
    assert [r.calls for r in rows[-2:]] == [["get_weather"]] * 2
    assert rows[-1].label.startswith("get_weather() #") and "called get_weather()" in histogram_title(rows[-1])

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


def test_under_auto_a_tagged_call_is_held_by_the_grammar_from_its_tag_on(server, client, recording):
    """tool_choice auto: free text until the model writes <tool_call>, then the call's
    grammar (llama-server's lazy grammar), whose fixed text is drafted. Qwen2.5-Coder-0.5B
    writes its calls fenced; a logit_bias on the tag's token makes it open one with the tag,
    and from there the mask holds it (the tag is no JSON): a call that parses and fits."""
    tag = str(LLM_TAG)
    whole = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0,
                                           logit_bias={tag: 100}, max_tokens=64)
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    for _ in range(50):
        log = RequestLog()
        for ev in read_recording(recording).events:
            log.feed(ev)
        if log.rows and log.rows[-1].calls == ["get_weather"] and log.rows[-1].n_generated == \
                whole.usage.completion_tokens:
            break
        time.sleep(0.1)
    row = log.rows[-1]
    assert row.grammar_accepted > 0, (row.grammar_drafted, row.grammar_accepted)


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


# --- /v1/responses (the Responses API: Codex CLI, the Agents SDK's default path) ----------
FLAT = [{"type": "function", **TOOLS[0]["function"]}]


def test_the_responses_api_answers_text_and_calls_whole_and_streamed(client):
    said = client.responses.create(model="gpt-4o", input="Say hello in five words.", max_output_tokens=20,
                                   temperature=0)
    assert said.status in ("completed", "incomplete") and said.output_text
    assert said.usage.output_tokens > 0 and said.usage.input_tokens > 0
    with client.responses.stream(model="gpt-4o", input="Say hello in five words.", max_output_tokens=20,
                                 temperature=0) as stream:
        kinds = [ev.type for ev in stream]
        assert stream.get_final_response().output_text == said.output_text
    assert kinds[:2] == ["response.created", "response.in_progress"] and "response.output_text.delta" in kinds

    called = client.responses.create(model="gpt-4o", input="What is the weather in Paris?", tools=FLAT,
                                     temperature=0)
    (call,) = [o for o in called.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    with client.responses.stream(model="gpt-4o", input="What is the weather in Paris?", tools=FLAT,
                                 temperature=0) as stream:
        kinds = [ev.type for ev in stream]
        (streamed,) = [o for o in stream.get_final_response().output if o.type == "function_call"]
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)
    assert kinds.count("response.function_call_arguments.delta") > 1 and kinds[-1] == "response.completed"

    # The call and its output in the next turn's input, as the Agents SDK sends them.
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "14 C, light rain"}]
    after = client.responses.create(model="m", input=history, tools=FLAT, tool_choice="none", temperature=0,
                                    max_output_tokens=24)
    assert after.output_text and after.usage.input_tokens_details.cached_tokens > 0
    # A forced call through the Responses shape of tool_choice.
    forced = client.responses.create(model="m", input="Hello", tools=FLAT, temperature=0,
                                     tool_choice={"type": "function", "name": "get_weather"})
    assert [o.type for o in forced.output] == ["function_call"]
    # The answer echoes what was asked, in the Responses shapes (the SDK's types parse them).
    assert (forced.tool_choice.type, forced.tool_choice.name) == ("function", "get_weather")
    assert [t.name for t in forced.tools] == ["get_weather"] and after.tool_choice == "none"


def test_the_responses_api_refuses_what_it_cannot_do_by_name(client):
    for extra, param in (({"previous_response_id": "resp_x"}, "previous_response_id"),
                         ({"tools": [{"type": "web_search"}]}, "tools"), ({"frobnicate": 1}, "frobnicate")):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="m", input="hi", **extra) if "frobnicate" not in extra else \
                client.responses.create(model="m", input="hi", extra_body=extra)
        assert err.value.body["param"] == param, err.value.body


# --- agent libraries, as their users run them --------------------------------------------
def test_instructor_extracts_a_model_in_its_tools_and_json_schema_modes(server):
    import instructor
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        city: str

    base = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):  # a named tool call; response_format
        person = instructor.from_openai(base, mode=mode).chat.completions.create(
            model="gpt-4o", response_model=Person, max_retries=0, temperature=0,
            messages=[{"role": "user", "content": "Ada is 36 and lives in London. Extract the person."}])
        assert (person.name, person.age, person.city) == ("Ada", 36, "London"), mode


def test_a_pydantic_ai_agent_calls_its_tool_then_answers(server):
    from pydantic import BaseModel
    from pydantic_ai import Agent, UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Report(BaseModel):
        city: str
        temperature_c: int

    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(base_url=server + "/v1", api_key="unused"))
    agent = Agent(model, output_type=Report, model_settings={"temperature": 0})
    asked: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        asked.append(city)
        return f"It is 14 degrees and raining in {city}."

    result = agent.run_sync("What is the weather in Paris?", usage_limits=UsageLimits(request_limit=5))
    assert asked == ["Paris"]  # the tool was called, once, with what the user asked
    assert result.output == Report(city="Paris", temperature_c=14)  # then the answer, from the tool's result
