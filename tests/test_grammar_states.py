"""engine/grammar.py on Qwen2.5's real vocabulary (vocab only: no weights loaded): the text a
schema fixes is drafted as the tokenizer writes it, and a lazy grammar (a call under
tool_choice auto) holds nothing before its trigger token and everything after it."""

from __future__ import annotations

import numpy as np
import pytest

from specdash.engine.grammar import Grammars
from specdash.engine.llm import LLM
from specdash.models.registry import model_path
from specdash.serve.tools import CLOSE, OPEN, ToolAsk, call_grammar

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["customer_full_name", "priority"],
          "properties": {"customer_full_name": {"type": "string"}, "priority": {"enum": ["low", "medium", "high"]}}}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_command", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


@pytest.fixture(scope="module")
def qwen():
    llm = LLM(model_path("qwen2.5-coder-0.5b"), vocab_only=True)
    yield llm, Grammars(llm.vocab, llm.n_vocab)
    llm.close()


def text_of(llm: LLM, ids: list[int]) -> str:
    return b"".join(llm.piece(t) for t in ids).decode("utf-8")


def tok(llm: LLM, text: str) -> list[int]:
    return llm.tokenize(text, add_special=False, parse_special=True)


def test_the_fixed_text_of_a_schema_is_drafted_where_there_is_no_choice(qwen):
    llm, grammars = qwen
    g = grammars.json_schema(SCHEMA, "response_format").start()
    assert text_of(llm, g.forced(16)) == '{"customer_full_name": "'  # the key, and the quote of its value
    g.accept(tok(llm, '{"customer_full_name": "Ada Lovelace"'))
    assert text_of(llm, g.forced(16)) == ', "priority": "'
    assert len(g.forced(2)) == 2  # never more than asked
    g.accept(tok(llm, ', "priority": "med'))
    assert text_of(llm, g.forced(16)) == 'ium"}'  # an enum value once its first token is in
    g.accept(g.forced(16))
    assert g.forced(16) == []  # done: only the end is left


def test_a_lazy_call_grammar_holds_nothing_before_its_tag_and_all_after(qwen):
    llm, grammars = qwen
    tag = grammars.term(llm, OPEN)
    assert tag == "<[151657]>"  # Qwen2.5's <tool_call>: one special token
    lark = call_grammar(ToolAsk(TOOLS, "auto"), tag, grammars.term(llm, CLOSE))
    g = grammars.lark(lark, "tools").lazy(151657).start()
    prose = tok(llm, "Let me look at the file first.")
    logits = np.zeros((len(prose) + 1, llm.n_vocab), dtype=np.float32)
    assert g.cut(prose) == len(prose) and g.forced(8) == []
    assert g.mask(logits, prose) is logits  # free text: no mask, at no cost
    # A draft that opens a call: the rows after the tag are the call's grammar.
    draft = [*prose[:3], 151657, *tok(llm, "\nhello")]
    rows = g.mask(np.zeros((len(draft) + 1, llm.n_vocab), dtype=np.float32), draft)
    assert np.isfinite(rows[:4]).all()  # up to the row that chose the tag: free
    assert np.isfinite(rows[4]).sum() == 1 and np.isfinite(rows[4][tok(llm, "\n")[0]])  # then only "\n"
    assert g.cut(draft) == 5  # "hello" is no call
    g.accept([*prose, 151657])
    assert text_of(llm, g.forced(16)) == '\n{"name": "r'  # both tools' names start with r
    g.accept(tok(llm, '\n{"name": "read'))
    assert text_of(llm, g.forced(16)) == '_file", "arguments": {"path": "'


def test_a_grammar_that_forces_nothing_drafts_nothing(qwen):
    llm, grammars = qwen
    g = grammars.lark('start: /[a-z]+/ | /[0-9]+/', "response_format").start()
    assert g.forced(16) == []
    g.accept(tok(llm, "hello"))
    assert g.forced(16) == []  # more letters, or the end: still a choice
