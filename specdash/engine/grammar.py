"""A grammar over the target's tokens (a JSON schema, a tool call), kept exact under
speculation: llguidance's matcher, one per run.

Why llguidance: it builds its tokenizer from a llama.cpp vocabulary, has no dependencies,
and offers what a speculative verifier needs: the masks for every row of a verify batch
given the draft before it (`fill_next_token_bitmask_par_with_draft_tokens`), how much of a
draft the grammar allows (`validate_tokens`), and forced tokens (`compute_ff_tokens`).
llama.cpp's grammar sampler, through the bindings, has no draft masks and no forced
tokens, and costs a full-vocabulary pass per row. `benchmarks/grammar_mask_cost.py` on
Qwen2.5's 151,936 tokens (a 2-core EPYC): 0.15-0.18 ms per masked row here, this module's
unpacking included, against 13.4 ms for llama.cpp's sampler.

How it stays exact: a step's draft is cut at its first token the grammar forbids (the
masked target gives it probability 0, so it would be rejected there anyway; the cut depends
on the draft alone, so rejection sampling stays exact), each verify row's logits are
masked with the grammar's state after the draft tokens before it, and the committed tokens
advance the grammar. Greedy output with any drafter is then greedy output under the grammar.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from specdash.contract.errors import SpecdashError

# JSON as models write it (`{"name": "Ada", "age": 36}`), one way only: flexible whitespace
# lets a model pad with newlines forever (llguidance #267), and a fixed style is text the
# grammar fixes, which its drafts can take.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarRefused(SpecdashError):
    """A grammar this engine cannot enforce; `param`: the request field it came from."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class GrammarDiverged(RuntimeError):
    """The grammar engine disagreed with its own mask: an engine fault (the request fails
    and a server reloads), not the request's own error."""


class Grammar:
    """One run's grammar state (stateful: a fresh one per run, from `CompiledGrammar.start`).

    A lazy grammar (`trigger`: a token id) holds nothing until the model writes that token:
    free text before it, the grammar from it on (a tool call under tool_choice auto, from
    Qwen2.5's `<tool_call>`: llama-server's lazy grammar). Until then it costs no mask."""

    def __init__(self, matcher: Any, executor: Any, n_vocab: int, tokenizer: Any, trigger: int | None = None):
        self._m, self._exec, self.n_vocab, self._tok = matcher, executor, n_vocab, tokenizer
        self._trigger = trigger
        self._armed = trigger is None

    def _at_trigger(self, tokens: Sequence[int]) -> int | None:
        """Where a lazy grammar not yet armed finds its trigger in `tokens` (None: not there)."""
        return next((i for i, t in enumerate(tokens) if t == self._trigger), None)

    def forced(self, most: int) -> list[int]:
        """The text the grammar fixes next (keys, quotes, braces, the rest of an enum value
        once its first token is in), as the tokenizer writes that text alone, up to `most`
        tokens; [] where the next token is a choice. A draft, never committed unverified:
        the model may write the same text in other tokens (llguidance's own forced tokens
        stop short of such a boundary; the target's verify decides past it)."""
        if most <= 0 or not self._armed or self._m.is_stopped():
            return []
        text = self._m.compute_ff_bytes()
        if not text:
            return []
        ids = [int(t) for t in self._tok.tokenize_bytes(text)[:most]]
        return ids[:self.cut(ids)]

    def cut(self, draft: Sequence[int]) -> int:
        """How many of the draft's tokens the grammar allows, from the front."""
        at = 0 if self._armed else self._at_trigger(draft)
        if at is None:
            return len(draft)  # free text throughout
        rest = list(draft[at:])
        return at + (int(self._m.validate_tokens(rest)) if rest else 0)

    def mask(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
        """`logits` (1 + len(draft), n_vocab) with each row's forbidden tokens at -inf: row i
        after the draft's first i tokens."""
        if self._armed:
            return self._masked(logits, draft)
        at = self._at_trigger(draft[:logits.shape[0] - 1])
        if at is None:
            return logits
        # Lazy, and the draft writes the trigger: the rows after it are the grammar's.
        out = np.array(logits, copy=True)
        out[at + 1:] = self._masked(logits[at:], draft[at:])[1:]
        return out

    def _masked(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
        from llguidance.numpy import (allocate_token_bitmask, fill_next_token_bitmask,
                                      fill_next_token_bitmask_par_with_draft_tokens)

        rows = logits.shape[0]
        if rows == 0:
            return logits
        bits = allocate_token_bitmask(rows, self.n_vocab)
        if rows > 1:
            fill_next_token_bitmask_par_with_draft_tokens(self._exec, [(self._m, 0, list(draft[:rows - 1]))], bits)
        else:  # (the draft form takes no empty draft)
            fill_next_token_bitmask(self._m, bits, 0)
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :logits.shape[1]].astype(bool)
        return np.where(allowed, logits, -np.inf).astype(logits.dtype, copy=False)

    def accept(self, tokens: Sequence[int]) -> None:
        """The committed tokens: the grammar moves past them."""
        if not self._armed:
            at = self._at_trigger(tokens)
            if at is None:
                return
            self._armed = True
            tokens = tokens[at:]
        if tokens and self._m.try_consume_tokens(list(tokens)) < len(tokens):
            # Masked rows commit only allowed tokens: a refusal here is the grammar engine
            # disagreeing with its own mask. Failing the request beats text outside it.
            raise GrammarDiverged(f"the grammar refused a token its mask allowed ({self._m.get_error() or 'no reason'})")


class CompiledGrammar:
    """A checked grammar for one request: what every run of it starts from."""

    def __init__(self, grammars: Grammars, text: str, trigger: int | None = None):
        self._g, self.text, self.trigger = grammars, text, trigger

    def lazy(self, trigger: int) -> CompiledGrammar:
        """The same grammar held only from the token `trigger` on (Grammar says how)."""
        return CompiledGrammar(self._g, self.text, trigger)

    def start(self) -> Grammar:
        from llguidance import LLMatcher

        return Grammar(LLMatcher(self._g.tokenizer, self.text, log_level=0), self._g.executor, self._g.n_vocab,
                       self._g.tokenizer, self.trigger)


class Grammars:
    """Grammars over one vocabulary: its llguidance tokenizer (built once, ~1 s for 152k
    tokens). `vocab` must outlive every grammar made here (the tokenizer calls into it)."""

    def __init__(self, vocab: Any, n_vocab: int):
        from llguidance import LLExecutor
        from llguidance.llamacpp import lltokenizer_from_vocab

        with warnings.catch_warnings():  # it asks llama_token_get_attr, deprecated, once per token
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tokenizer = lltokenizer_from_vocab(vocab, n_vocab=n_vocab)
        self.executor = LLExecutor()
        self.n_vocab = n_vocab

    def json_schema(self, schema: dict[str, Any], param: str) -> CompiledGrammar:
        """A grammar for JSON that validates against `schema`; SpecdashError naming `param` and
        the schema feature the grammar cannot express (never a looser grammar)."""
        from llguidance import LLMatcher

        try:
            text = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_STYLE)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise GrammarRefused(f"{param}: not a JSON schema ({exc})", param) from None
        return self._checked(text, param)

    def term(self, vocab: Any, text: str) -> str:
        """`text` as a Lark term: the one token the model writes it as when llguidance holds
        that token special (Qwen2.5's `<tool_call>`: a quoted string would be matched as
        text, which that token is not), else the quoted text. `vocab`: engine/llm.LLM."""
        ids = vocab.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    def lark(self, text: str, param: str) -> CompiledGrammar:
        """A grammar in llguidance's Lark (a tool call's format around its schema)."""
        from llguidance import LLMatcher

        return self._checked(LLMatcher.grammar_from_lark(text), param)

    def _checked(self, text: str, param: str) -> CompiledGrammar:
        from llguidance import LLMatcher

        failed, said = LLMatcher.validate_grammar_with_warnings(text, self.tokenizer)
        if failed or said:
            # A warning too is a feature dropped (a `format` it does not know...): refused.
            raise GrammarRefused(f"{param}: the grammar engine cannot enforce this schema: {'; '.join(said)}", param)
        return CompiledGrammar(self, text)
