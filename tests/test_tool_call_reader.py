"""Tool calls read out of the model's text (serve/tools.CallReader), without a model: the
text cut at every size gives the same calls and content, and a streamed call's deltas join
to the whole one (the real server with the openai SDK: tests/test_serve_tools.py)."""

from __future__ import annotations

import random

import pytest

from specdash.serve.tools import CallDelta, CallReader

NAMES = ("get_weather", "read_file")
CASES = [
    # Qwen2.5 / Hermes tags, text before: the text is content, what follows the call is not sent.
    ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "units": {"c": 1}}}\n'
     '</tool_call>\nignored', "Sure.\n", ['{"city": "Paris", "units": {"c": 1}}']),
    # The call alone in a ```json fence, or bare, naming a tool (small models answer so).
    ('```json\n{\n  "name": "read_file",\n  "arguments": {\n    "path": "a.py"\n  }\n}\n```',
     "", ['{\n    "path": "a.py"\n  }']),
    ('{"name": "get_weather", "arguments": {"city": "Rome"}}', "", ['{"city": "Rome"}']),
    # Keys the other way round: read whole when the call closes.
    ('<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>', "", ['{"city": "Oslo"}']),
    # Not calls: a name no tool has, code, malformed JSON in tags: all content, as written.
    ('{"name": "other", "arguments": {}}', '{"name": "other", "arguments": {}}', []),
    ('```python\nprint(1)\n```', '```python\nprint(1)\n```', []),
    ('a <tool_call> not json </tool_call> b', 'a <tool_call> not json </tool_call> b', []),
    # Cut off by max_tokens mid-arguments: the call keeps what it had.
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "", ['{"city": "Par']),
]


def read(text: str, rng: random.Random, parallel: bool = False) -> tuple[CallReader, list[str | CallDelta]]:
    reader = CallReader(parallel=parallel, names=NAMES)
    out: list[str | CallDelta] = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 6)
        out += reader.feed(text[i:i + n])
        i += n
    return reader, out + reader.flush()


@pytest.mark.parametrize("text,content,arguments", CASES)
def test_the_text_cut_anywhere_reads_the_same(text, content, arguments):
    rng = random.Random(7)
    for _ in range(150):
        reader, out = read(text, rng)
        assert "".join(p for p in out if isinstance(p, str)) == content
        assert [c.arguments for c in reader.calls] == arguments
        deltas = [p for p in out if isinstance(p, CallDelta)]
        for i, call in enumerate(reader.calls):
            mine = [d for d in deltas if d.index == i]
            # The head once (id, name), then fragments that join to the whole arguments.
            assert [d.id for d in mine if d.id] == [call.id] and mine[0].name == call.name
            assert "".join(d.arguments for d in mine) == call.arguments
        assert reader.done == (bool(arguments) and not text.endswith('"Par'))  # a whole call ends it


def test_one_call_ends_the_answer_unless_parallel_calls_are_allowed():
    two = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "read_file", "arguments": {"path": "b"}}\n</tool_call>')
    one, _ = read(two, random.Random(1))
    assert [c.name for c in one.calls] == ["get_weather"] and one.done
    both, out = read(two, random.Random(1), parallel=True)
    assert [c.name for c in both.calls] == ["get_weather", "read_file"] and not both.done
    assert not [p for p in out if isinstance(p, str)]  # the newline between calls is not content
    assert len({c.id for c in both.calls}) == 2
