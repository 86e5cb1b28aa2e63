"""The request-field table (serve/fields.py): docs/serve.md prints it as it is, a value that
asks for nothing passes, and anything else not done is refused by name (the real server's
400s: tests/test_serve.py's bad-input cases)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdash.serve.fields import FIELDS, check_fields
from specdash.serve.protocol import BadRequest, parse_chat, parse_completion

DOCS = Path(__file__).parent.parent / "docs" / "serve.md"
HI = [{"role": "user", "content": "hi"}]


def test_the_docs_table_is_the_table_the_server_checks():
    rows = re.findall(r"^\| `([^`]+)` \| (\w+) \| (\w+) \| (.*) \|$", DOCS.read_text(encoding="utf-8"), re.M)
    assert [(n, r, d) for n, r, d, _ in rows] == [(f.name, f.routes, f.does) for f in FIELDS]


@pytest.mark.parametrize("extra", [{"n": 1}, {"logprobs": False}, {"response_format": {"type": "text"}},
                                   {"user": "u", "store": False, "metadata": {"a": "b"}, "reasoning_effort": "low"},
                                   {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}},
                                   {"max_completion_tokens": 5, "stream_options": {"include_usage": True}},
                                   {"speculative.n_max": 2}])
def test_what_asks_for_nothing_is_served(extra):
    ask = parse_chat({"messages": HI, **extra})
    assert ask.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body,param", [
    ({"n": 3}, "n"), ({"logprobs": 1}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "tools": [{"type": "function", "function": {"name": "f"}}]}, "logprobs"),
    ({"frequency_penalty": 3}, "frequency_penalty"), ({"min_p": 2}, "min_p"), ({"suffix": "x"}, "suffix"), ({"logit_bias": {"one": 5}}, "logit_bias"), ({"logit_bias": {"1": 500}}, "logit_bias"),
    ({"response_format": {"type": "xml"}}, "response_format.type"), ({"audio": {}}, "audio"),
    ({"echo": True}, "echo"),  # a completions field, on chat
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"whatever": 1}, "whatever"),
    ({"speculative.n_mux": 2}, "speculative.n_mux"), ({"speculative": {"grammar": "yes"}}, "speculative.grammar"),
])
def test_anything_else_is_refused_by_name(body, param):
    with pytest.raises(BadRequest) as err:
        parse_chat({"messages": HI, **body})
    assert err.value.param == param and param.split("[")[0].split(".")[0] in err.value.message


def test_completions_take_their_own_fields_and_refuse_chats():
    assert parse_completion({"prompt": "a", "echo": True, "best_of": 1}).echo
    for body, param in (({"tools": []}, "tools"), ({"suffix": "x"}, "suffix")):
        with pytest.raises(BadRequest) as err:
            parse_completion({"prompt": "a", **body})
        assert err.value.param == param


def test_a_history_call_reaches_the_template_with_object_arguments():
    ask = parse_chat({"messages": HI + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"}]})
    assert ask.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}
    assert ask.messages[2] == {"role": "tool", "content": "done", "tool_call_id": "c1"}
    with pytest.raises(BadRequest) as err:
        check_fields({"messages": HI, "functions": []}, "chat")
    assert err.value.param == "functions"


def test_the_dashboard_names_a_chat_that_offers_tools():
    import asyncio

    from specdash.serve.request import ServedRequest

    loop = asyncio.new_event_loop()
    tools = [{"type": "function", "function": {"name": "f"}}]
    try:
        titles = [ServedRequest(parse_chat({"messages": HI, **extra}), [1], loop).title.split(" #")[0]
                  for extra in ({}, {"tools": tools}, {"tools": tools, "tool_choice": "none"})]
    finally:
        loop.close()
    assert titles == ["chat", "chat+tools", "chat"]


def test_the_speculative_keys_reach_the_engine():
    ask = parse_chat({"messages": HI, "speculative.n_min": 2, "speculative": {"grammar": False}})
    assert ask.overrides()["k_min"] == 2 and ask.speculation.grammar is False
    assert parse_chat({"messages": HI}).speculation.grammar is True
