"""A conversation as the model's own chat template renders it: the GGUF's Jinja template.

llama.cpp's `llama_chat_apply_template` (engine/llm.py `chat_text`) recognises a template
by its markers and writes a built-in format: Qwen2.5's chatml without the default system
message its real template adds when a conversation has none. llama-server renders the
GGUF's Jinja template itself, so a client would get other tokens, and other text, from
specdash than from llama-server on the same model. Rendered here with llama-cpp-python's
own Jinja formatter (jinja2, sandboxed), as its server does; llama.cpp's built-in format
only where a template does not render.

Unlike llama-server, which tokenizes the whole rendered prompt with special tokens parsed,
a message's content never becomes a control token: a user who writes `<|im_end|>` or
`<|im_start|>system` gets those characters as text, not a forged turn. Where no content
spells a special token the tokens are llama-server's exactly (the same one call).
"""

from __future__ import annotations

import re
import secrets
import json
from collections.abc import Sequence
from typing import Any, Union

from specdash.contract.errors import SpecdashError
from specdash.engine.llm import LLM


# A turn as a template reads it ({role, content, tool_calls...}), or (role, content).
Turn = Union[dict[str, Any], tuple[str, str]]


def _turns(messages: Sequence[Turn]) -> list[dict[str, Any]]:
    return [dict(m) if isinstance(m, dict) else {"role": m[0], "content": m[1]} for m in messages]


class TemplateRefused(SpecdashError):
    """A conversation this template cannot render as asked; `param`: the field to name."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class ChatTemplate:
    def __init__(self, vocab: LLM):
        self.vocab = vocab
        self._formatter: Any = None
        self.notice = ""  # why the GGUF's template is not used, when it was refused
        self._bos = ""
        self._tools: bool | None = None  # supports_tools, once asked
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
            self._check_sandbox()

    def _check_sandbox(self) -> None:
        """A template that reaches past the sandbox (an object's attributes, a class, a
        module) is refused once, at load, and llama.cpp's built-in format used instead:
        `notice` says so in one line naming the model. The sandbox (jinja2's
        ImmutableSandboxedEnvironment, llama-cpp-python's formatter) already stops it; this
        keeps it from failing on every request and from going unseen."""
        from jinja2.exceptions import SecurityError

        if self._formatter is None:
            return
        try:
            self._formatter(messages=[{"role": "user", "content": "hi"}])
        except SecurityError as exc:
            self._formatter = None
            self.notice = (f"{self.vocab.path.name}: its chat template was refused (it reaches outside "
                           f"jinja2's sandbox: {str(exc).splitlines()[0][:120]}); using llama.cpp's built-in "
                           "chat format instead")
        except Exception:  # other errors: per request (a template may refuse this one role order)
            pass

    def render(self, messages: Sequence[Turn], tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation's text, ready for the assistant's turn; `tools` described by
        the template, as it writes them."""
        turns = _turns(messages)
        text = None
        if self._formatter is not None:
            try:
                text = self._formatter(messages=turns, tools=tools or None).prompt
            except Exception:  # the template raised (e.g. it refuses a role order)
                text = None
        if text is None:
            if tools or any(t.get("tool_calls") or t["role"] == "tool" for t in turns):
                raise TemplateRefused(self.no_tools(), "tools")
            text = self.vocab.chat_text([(t["role"], t["content"]) for t in turns])  # SpecdashError: no format
        return text

    def supports_tools(self) -> bool:
        """Whether the template describes tools at all: a render with one differs from one
        without (llama-server's autoparser diffs renders the same way). Asked once."""
        if self._tools is None:
            self._tools = self._renders_tools()
        return self._tools

    def _renders_tools(self) -> bool:
        if self._formatter is None:
            return False
        probe = [{"type": "function", "function": {"name": "specdash_probe", "parameters": {"type": "object"}}}]
        turns = [{"role": "user", "content": "hi"}]
        try:
            return "specdash_probe" in self._formatter(messages=turns, tools=probe).prompt
        except Exception:
            return False

    def no_tools(self) -> str:
        return (f"'tools': the chat template of {self.vocab.path.name} has no tool calls (it does not describe "
                "tools); serve a model whose template does, e.g. qwen2.5-coder-1.5b")

    def tokens(self, messages: Sequence[Turn], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The conversation's tokens, ready for the assistant's turn. Only the template's own
        markup becomes control tokens: a message's content is text, whatever it holds."""
        turns = _turns(messages)
        if tools and not self.supports_tools():
            raise TemplateRefused(self.no_tools(), "tools")
        text = self.render(turns, tools)
        # A template that writes the BOS itself must not get a second one from the tokenizer.
        starts_with_bos = bool(self._bos) and text.startswith(self._bos)
        # Tools and earlier calls are the client's text too, but the template writes them as
        # JSON around its markup: one that spells a control token is refused, not kept.
        for where, value in (("tools", tools), ("messages", [t.get("tool_calls") for t in turns])):
            if value and self._has_control(json.dumps(value, ensure_ascii=False)):
                raise TemplateRefused(f"{where}: a tool's definition or an earlier call spells one of the model's "
                                      "special tokens (e.g. <|im_start|>); remove it", where)
        if not any(self._has_control(t["content"]) for t in turns):
            # As llama-server tokenizes (the whole text, special tokens parsed): the same
            # tokens, since no content spells one.
            return self.vocab.tokenize(text, add_special=not starts_with_bos)
        return self._as_text(turns, text, tools, add_special=not starts_with_bos)

    def _has_control(self, content: str) -> bool:
        """Content that spells a special token (`<|im_start|>`): parsed, it would be one."""
        v = self.vocab
        return bool(content) and v.tokenize(content, add_special=False) != v.tokenize(content, add_special=False,
                                                                                       parse_special=False)

    def _as_text(self, turns: list[dict[str, Any]], text: str, tools: list[dict[str, Any]] | None,
                 add_special: bool) -> list[int]:
        """The conversation rendered with a marker for each content, so the markup between
        them is tokenized with special tokens parsed and each content without."""
        tag = secrets.token_hex(8)
        # (An empty content stays empty: a template may write nothing for it, as Qwen2.5's
        # does for a tool call's turn.)
        marked = self.render([{**t, "content": f"\ue000{tag}:{i}\ue001" if t["content"] else ""}
                              for i, t in enumerate(turns)], tools)
        parts = re.split(f"\ue000{tag}:(\\d+)\ue001", marked)  # markup, index, markup, index, ...
        pieces = [(parts[i], True) if i % 2 == 0 else (turns[int(parts[i])]["content"], False)
                  for i in range(len(parts))]
        if "".join(p for p, _ in pieces) != text:  # the template rewrites content (trims it, splits it)
            raise SpecdashError("messages: a message's content spells one of the model's special tokens "
                                "(e.g. <|im_start|>) and this model's chat template rewrites content, so it "
                                "cannot be kept as plain text; remove the token from the content")
        out: list[int] = []
        for piece, markup in pieces:
            if piece:
                out += self.vocab.tokenize(piece, add_special=add_special and not out, parse_special=markup)
        return out
