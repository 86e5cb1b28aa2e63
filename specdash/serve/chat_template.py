"""A conversation as the model's own chat template renders it: the GGUF's Jinja template.

llama.cpp's `llama_chat_apply_template` (engine/llm.py `chat_text`) recognises a template
by its markers and writes a built-in format: Qwen2.5's chatml without the default system
message its real template adds when a conversation has none. llama-server renders the
GGUF's Jinja template itself, so a client would get other tokens, and other text, from
specdash than from llama-server on the same model. Rendered here with llama-cpp-python's
own Jinja formatter (jinja2, sandboxed), as its server does; llama.cpp's built-in format
only where a template does not render.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdash.engine.llm import LLM


class ChatTemplate:
    def __init__(self, vocab: LLM):
        self.vocab = vocab
        self._formatter: Any = None
        self._bos = ""
        template = vocab.meta("tokenizer.chat_template")
        if template:
            from llama_cpp import llama_cpp as ll
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def text(token: int) -> str:
                return vocab.piece(token).decode("utf-8", "replace") if token >= 0 else ""

            self._bos = text(vocab.bos)
            eos = text(ll.llama_vocab_eos(vocab.vocab))
            try:
                self._formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=self._bos)
            except Exception:  # a template jinja2 cannot compile: llama.cpp's built-in format
                self._formatter = None

    def tokens(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """The conversation's tokens, ready for the assistant's turn."""
        text = None
        if self._formatter is not None:
            try:
                text = self._formatter(messages=[{"role": r, "content": c} for r, c in messages]).prompt
            except Exception:  # the template raised (e.g. it refuses a role order)
                text = None
        if text is None:
            text = self.vocab.chat_text(messages)  # SpecdashError: llama.cpp knows no format either
        # A template that writes the BOS itself must not get a second one from the tokenizer.
        starts_with_bos = bool(self._bos) and text.startswith(self._bos)
        return self.vocab.tokenize(text, add_special=not starts_with_bos)
