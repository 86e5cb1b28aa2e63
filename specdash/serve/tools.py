"""Tool calls: what a request asks (`tools`, `tool_choice`, `parallel_tool_calls`, the
calls and results in its history) and the calls read back out of the model's text.

The model writes a call in its template's format; Qwen2.5's and Hermes' is
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. `CallReader` turns the
text as it streams into content and OpenAI's tool-call deltas in llama-server's shape:
`id`, `type` and `function.name` once, in a call's first delta, then `function.arguments`
fragments (openai-python and pydantic-ai join every string field of a delta by `index`, so
a repeated name would read `getget`). The whole answer is the same reader run to the end, so
a streamed call joins to exactly the non-streamed one.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from specdash.serve.bad_request import BadRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# The call's head as Qwen2.5 and Hermes write it: the name first, then the arguments.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
# Small models often answer with the call alone, bare or in a ```json fence, without the
# tags; llama.cpp's Hermes parser takes those too, when the name is one of the tools.
_BARE = re.compile(r'\s*(```(?:json)?[ \t]*\n)?\s*(\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)")')
_BARE_FORMS = ('```json{"name":"', '```{"name":"', '{"name":"')


@dataclass(slots=True)
class ToolAsk:
    """The tools a chat request offers and how the model may use them."""

    tools: list[dict[str, Any]]  # OpenAI's [{"type": "function", "function": {...}}], as the template reads them
    choice: str = "auto"  # auto | none | required | a tool's name (a call forced by a grammar)
    parallel: bool = False  # more than one call in an answer

    @property
    def forced(self) -> bool:
        """The answer must be a call (required, or a named function): a grammar makes it one."""
        return self.choice not in ("auto", "none")

    @property
    def reads_calls(self) -> bool:
        return self.choice != "none"

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


def parse_tools(body: dict[str, Any]) -> ToolAsk | None:
    tools = body.get("tools")
    if tools is None or tools == []:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise BadRequest("'tool_choice' names a tool but the request sends no 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise BadRequest(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{...}}}} (function tools only)",
                       f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", fn["name"]):
            raise BadRequest(f"'tools[{i}].function.name' must be 1-64 letters, digits, _ . : or -", f"tools[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"'tools[{i}].function.parameters' must be a JSON schema object", f"tools[{i}].function.parameters")
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):  # {"type": "function", "function": {"name": ...}}
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise BadRequest("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                       "tool_choice")
        if name not in [t["function"]["name"] for t in tools]:
            raise BadRequest(f"'tool_choice' names {name!r}, which is not one of the request's tools", "tool_choice")
        if name in ("auto", "none", "required"):
            raise BadRequest(f"'tool_choice': a tool named {name!r} cannot be told from the word", "tool_choice")
        choice = name
    elif choice not in ("auto", "none", "required"):
        raise BadRequest(f"'tool_choice' must be auto, none, required or {{\"type\": \"function\", ...}}, got {choice!r}",
                   "tool_choice")
    parallel = body.get("parallel_tool_calls", False)
    if not isinstance(parallel, bool):
        raise BadRequest("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    return ToolAsk(tools=tools, choice=choice, parallel=parallel)


def call_grammar(ask: ToolAsk, open_tag: str, close_tag: str) -> str:
    """llguidance Lark for a call in Qwen2.5's / Hermes' format (forced, or under auto held
    lazily from the open tag on: CompiledGrammar.lazy): the tags around
    `{"name": <a tool>, "arguments": <that tool's schema>}` (more than one with
    parallel_tool_calls). `open_tag`/`close_tag`: the tags as Lark terms (a special token
    `<[id]>`, or a quoted string)."""
    from specdash.engine.grammar import JSON_STYLE

    names = ask.names if ask.choice in ("required", "auto") else [ask.choice]
    bodies = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
               "properties": {"name": {"const": t["function"]["name"]},
                              "arguments": t["function"].get("parameters") or {"type": "object"}}}
              for t in ask.tools if t["function"]["name"] in names]
    schema: dict[str, Any] = dict(bodies[0]) if len(bodies) == 1 else {"anyOf": bodies}
    schema["x-guidance"] = JSON_STYLE
    one = f'{open_tag} "\\n" call "\\n" {close_tag}'
    start = f"start: {one}" + (f' ("\\n" {one})*' if ask.parallel else "")
    return f"{start}\ncall: %json {json.dumps(schema)}\n"


def history_calls(value: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls`, as its template reads them: `arguments` as an
    object (Qwen2.5's template writes `arguments | tojson`; llama-server passes objects too)."""
    if not isinstance(value, list):
        raise BadRequest(f"'messages[{i}].tool_calls' must be a list", f"messages[{i}].tool_calls")
    out = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        where = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"'{where}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}",
                       where)
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise BadRequest(f"'{where}.function.arguments' is not JSON", f"{where}.function.arguments") from None
        out.append({"id": str(call.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


# --- reading calls out of the text ---------------------------------------------------------
@dataclass(slots=True)
class CallDelta:
    """One piece of a call for a stream: the head (`id` and `name`) once, then arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def body(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"arguments": self.arguments}
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"], out["type"] = self.id, "function"
            fn = {"name": self.name, **fn}
        out["function"] = fn
        return out


@dataclass(slots=True)
class Call:
    id: str
    name: str
    arguments: str = ""  # the JSON text the model wrote

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _held(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass
class CallReader:
    """Text in, content and call deltas out (see the module's docstring). `done`: a call
    ended and the request allows no other, so generation may stop."""

    parallel: bool = False
    names: tuple[str, ...] = ()  # the tools offered: a bare call must name one
    calls: list[Call] = field(default_factory=list)
    done: bool = False
    _buf: str = ""
    _in_call: bool = False
    _opened: str | None = None  # what began the call: OPEN, a fence, "" (bare); None: no call
    _said: bool = False  # content was sent (a bare call only opens an answer)
    _head_sent: bool = False
    _args_sent: int = 0  # characters of the current call's arguments already sent

    def _bare(self) -> str:
        """At the answer's start: "yes" (a bare call begins), "maybe" (too soon to say), "no"."""
        m = _BARE.match(self._buf)
        if m is not None and m.group(3) in self.names:
            return "yes"
        squeezed = re.sub(r"\s+", "", self._buf)
        for form in _BARE_FORMS:
            if form.startswith(squeezed):
                return "maybe"
            if squeezed.startswith(form):
                said = squeezed[len(form):]
                return "maybe" if '"' not in said and any(n.startswith(said) for n in self.names) else "no"
        return "no"

    def _begin(self, opened: str, rest: str) -> None:
        self._buf, self._in_call, self._opened, self._head_sent, self._args_sent = rest, True, opened, False, 0

    def _bare_end(self) -> int:
        """Where a bare call's JSON object ends in the buffer (-1: not yet)."""
        try:
            return json.JSONDecoder().raw_decode(self._buf, len(self._buf) - len(self._buf.lstrip()))[1]
        except ValueError:
            return -1

    def feed(self, text: str) -> list[str | CallDelta]:
        if self.done:
            return []
        self._buf += text
        out: list[str | CallDelta] = []
        while True:
            if not self._in_call and not self._said and self.names:
                bare = self._bare()
                if bare == "maybe":
                    return out
                if bare == "yes":
                    m = _BARE.match(self._buf)
                    assert m is not None
                    self._begin(self._buf[:m.start(2)], self._buf[m.start(2):])
                    continue
                self._said = True
            if not self._in_call:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _held(self._buf, OPEN)
                    self._content(out, self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                self._content(out, self._buf[:at])
                self._begin(OPEN, self._buf[at + len(OPEN):])
                continue
            tagged = self._opened == OPEN
            end = self._buf.find(CLOSE) if tagged else self._bare_end()
            body = self._buf if end < 0 else self._buf[:end]
            read = self._stream_args(out, body, final=end >= 0)
            if end < 0:
                return out
            rest = self._buf[end + len(CLOSE):] if tagged else self._buf[end:]
            if not tagged and self._opened:  # the fence closing a fenced call
                rest = re.sub(r"^\s*```", "", rest)
            self._buf, self._in_call, self._said = rest, False, True
            if read and not self.parallel:
                self.done, self._buf = True, ""
                return out

    def flush(self) -> list[str | CallDelta]:
        """The end of the answer: what was held back. A call cut off (max_tokens) keeps what it has."""
        out: list[str | CallDelta] = []
        if self._in_call:
            self._stream_args(out, self._buf, final=True, cut=True)
        elif not self.done:
            self._content(out, self._buf)
        self._buf = ""
        return out

    def _content(self, out: list[str | CallDelta], text: str) -> None:
        # Whitespace around calls (the template's newlines) is not content.
        if text and not (self.calls and not text.strip()):
            out.append(text)
            self._said = True

    def _stream_args(self, out: list[str | CallDelta], body: str, *, final: bool, cut: bool = False) -> bool:
        """Send what is sure of the current call; True once it is a call."""
        head = _HEAD.match(body)
        if head is None:
            # Another key order, or not JSON: read whole at the end, or given back as text.
            return self._whole(out, body, cut) if final else False
        if not self._head_sent:
            name = json.loads(f'"{head.group(1)}"')
            self.calls.append(Call(f"call_{secrets.token_hex(12)}", name))
            out.append(CallDelta(len(self.calls) - 1, "", self.calls[-1].id, name))
            self._head_sent = True
        rest = body[head.end():]
        # The arguments end before the object's closing brace and the newline after it;
        # until the call closes, the last `}` and what follows may be that brace.
        if final:
            args = rest.rstrip()
            if args.endswith("}") and not cut:
                args = args[:-1].rstrip()
        else:
            sure = rest[:len(rest) - _held(rest, CLOSE)]
            last = sure.rfind("}")
            args = sure[:last] if last >= 0 and not sure[last + 1:].strip() else sure.rstrip()
        if len(args) > self._args_sent:
            piece = args[self._args_sent:]
            self._args_sent = len(args)
            self.calls[-1].arguments += piece
            out.append(CallDelta(len(self.calls) - 1, piece))
        return True

    def _whole(self, out: list[str | CallDelta], body: str, cut: bool) -> bool:
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            closed = "" if cut or self._opened != OPEN else CLOSE
            out.append(f"{self._opened or ''}{body}{closed}")  # not a call: the model's text, as written
            return False
        self.calls.append(Call(f"call_{secrets.token_hex(12)}", name,
                               args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        c = self.calls[-1]
        out.append(CallDelta(len(self.calls) - 1, c.arguments, c.id, c.name))
        return True
