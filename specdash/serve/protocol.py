"""OpenAI's request and response shapes, checked and built here (no HTTP, no engine).

A request body becomes a `Ask` (what to generate and how) or a `BadRequest` that names
the field, in OpenAI's error format. Every field is in serve/fields.py's table: honoured,
accepted (read, changes nothing: `user`, `store`), or refused by name when it asks for
what specdash cannot do (`n: 2`, `logprobs: true`); a field not in the table is refused
too, never ignored. llama-server's per-request speculative keys (`speculative.n_max`,
...) are read here too, so the openai SDK can send them through `extra_body`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from specdash.contract.limits import K_CAP
from specdash.engine.penalties import Penalties
from specdash.serve.bad_request import BadRequest
from specdash.serve.fields import check_fields
from specdash.serve.logprobs import TOP_CAP, TokenLogprob, chat_logprobs, completion_logprobs
from specdash.serve.tools import CallDelta, ToolAsk, history_calls, parse_tools

MAX_STOPS = 16  # stop strings per request (OpenAI allows 4; llama-server any number)
# A stop string's length: the engine looks for each one at every step, so their length
# is work on the thread every client shares (a 50k-character stop cost ~25 ms a step).
MAX_STOP_CHARS = 256
MAX_TOKENS_CAP = 1 << 20
# llama-server's speculative.types names, and the specdash drafter each asks for.
SPEC_TYPES = {"none": "none", "draft": "draft", "ngram": "lookup", "ngram_simple": "lookup",
              "ngram_cache": "lookup", "lookup": "lookup", "suffix": "suffix", "mtp": "mtp", "auto": "auto"}


@dataclass(slots=True)
class Speculation:
    """What a request asked of speculation (llama-server's `speculative.*`); None: the
    server's settings."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    drafter: str | None = None  # a specdash drafter name, from speculative.types
    grammar: bool = True  # specdash's speculative.grammar: draft the text a grammar fixes

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.n_max, self.n_min, self.p_min, self.drafter))


@dataclass(slots=True)
class Ask:
    """One request as the engine will run it."""

    kind: str  # "chat" | "completion"
    model: str
    api: str = ""  # "responses": asked through /v1/responses (serve/responses.py writes the answer)
    # /v1/responses: the request's own tools, tool_choice and text format, echoed in its answer as OpenAI does
    echoed: dict[str, Any] = field(default_factory=dict)
    prompt: str = ""  # completion: the text
    # chat: {role, content} as the template reads them (with tool_calls, tool_call_id)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: ToolAsk | None = None  # chat: the tools offered, when the model may call them
    schema: dict[str, Any] | None = None  # chat: the JSON schema the content must validate against
    max_tokens: int | None = None  # None: up to the context
    temperature: float | None = None  # None: the server's (the dashboard's `t`)
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    return_tokens: bool = False  # llama-server's key: the generated token ids as well
    logprobs: int | None = None  # each token's logprob and this many alternatives (None: none)
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    penalties: Penalties | None = None  # repeat_penalty, frequency_penalty, presence_penalty
    min_p: float = 0.0
    speculation: Speculation = field(default_factory=Speculation)

    def overrides(self) -> dict[str, Any]:
        """The engine settings this request's own fields set (a client's fields win)."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.top_k is not None:
            out["top_k"] = self.top_k
        spec = self.speculation
        if spec.n_max is not None:
            out["k_max"] = spec.n_max
        if spec.n_min is not None:
            out["k_min"] = spec.n_min  # adaptive K's floor for this request
        if spec.p_min is not None:
            out["draft_p_min"] = spec.p_min
        return out


def _number(body: dict[str, Any], name: str, lo: float, hi: float, *, integer: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise BadRequest(f"'{name}' must be {kind} {lo:g}..{hi:g}, got {value!r}", name)
    return value


def _seed(body: dict[str, Any]) -> int | None:
    """OpenAI's seed is any 64-bit integer; numpy's generator takes it modulo 2**64."""
    seed = _number(body, "seed", -(1 << 63), (1 << 64) - 1, integer=True)
    return None if seed is None else seed % (1 << 64)


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"'stop' has {len(stops)} strings; at most {MAX_STOPS}", "stop")
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            raise BadRequest(f"'stop' string {i} has {len(s)} characters; at most {MAX_STOP_CHARS}", "stop")
    return [s for s in stops if s]


# llama-server's per-request keys, and specdash's own `speculative.grammar`.
SPEC_KEYS = {"speculative.n_max", "speculative.n_min", "speculative.p_min", "speculative.types",
             "speculative.grammar"}


def _speculation(body: dict[str, Any]) -> Speculation:
    """llama-server's flat `speculative.n_max` keys (or a nested `speculative` object)."""
    nested = body.get("speculative")
    src: dict[str, Any] = {f"speculative.{k}": v for k, v in nested.items()} if isinstance(nested, dict) else {}
    src.update({k: v for k, v in body.items() if k.startswith("speculative.")})
    for name in src:
        if name not in SPEC_KEYS:
            raise BadRequest(f"'{name}' is not a speculative key specdash takes ({', '.join(sorted(SPEC_KEYS))}); "
                             "it is refused rather than ignored", name)
    grammar = src.get("speculative.grammar", True)
    if not isinstance(grammar, bool):
        raise BadRequest(f"'speculative.grammar' must be true or false, got {grammar!r}", "speculative.grammar")
    spec = Speculation(grammar=grammar,
        n_max=_number(src, "speculative.n_max", 0, K_CAP, integer=True),
        n_min=_number(src, "speculative.n_min", 0, K_CAP, integer=True),
        p_min=_number(src, "speculative.p_min", 0.0, 1.0),
    )
    if spec.n_max is not None and spec.n_min is not None and spec.n_min > spec.n_max:
        raise BadRequest("'speculative.n_min' is above 'speculative.n_max'", "speculative.n_min")
    types = src.get("speculative.types")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not isinstance(names, list) or len(names) != 1 or names[0] not in SPEC_TYPES:
            raise BadRequest(f"'speculative.types' must be one of {', '.join(SPEC_TYPES)} (one of them), "
                             f"got {types!r}", "speculative.types")
        spec.drafter = SPEC_TYPES[names[0]]
    return spec


def _common(body: Any, kind: str) -> Ask:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    check_fields(body, kind)
    model = body.get("model", "")
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    n = body.get("n")
    if n not in (None, 1):
        raise BadRequest("'n' must be 1: specdash generates one choice per request", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    for key in options:
        if key != "include_usage":
            raise BadRequest(f"'stream_options.{key}' is not taken (include_usage is); it is refused rather than "
                             "ignored", f"stream_options.{key}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    ask = Ask(
        kind=kind, model=model,
        max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", 1, MAX_TOKENS_CAP, integer=True),
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        top_k=_number(body, "top_k", 0, 1 << 20, integer=True),
        seed=_seed(body),
        stop=_stops(body.get("stop")),
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        return_tokens=body.get("return_tokens") is True,
        speculation=_speculation(body),
    )
    if ask.top_p == 0.0:
        raise BadRequest("'top_p' must be above 0", "top_p")
    ask.logit_bias = _logit_bias(body.get("logit_bias"))
    penalties = Penalties(repeat=_number(body, "repeat_penalty", 0.01, 10.0) or 1.0,
                          frequency=_number(body, "frequency_penalty", -2.0, 2.0) or 0.0,
                          presence=_number(body, "presence_penalty", -2.0, 2.0) or 0.0)
    ask.penalties = penalties if penalties.active else None
    ask.min_p = _number(body, "min_p", 0.0, 1.0) or 0.0
    if kind == "chat":
        top = _number(body, "top_logprobs", 0, TOP_CAP, integer=True)
        wanted = body.get("logprobs", False)
        if not isinstance(wanted, bool):
            raise BadRequest("'logprobs' must be true or false", "logprobs")
        if top and not wanted:
            raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        ask.logprobs = (top or 0) if wanted else None
    else:  # the legacy form: how many alternatives, 0 for the token's own alone
        top = None if body.get("logprobs") is False else _number(body, "logprobs", 0, TOP_CAP, integer=True)
        ask.logprobs = top
    return ask


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's {"token id": bias -100..100}; the ids are checked against the vocabulary
    when the request is tokenized (serve/link.py)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 1024:
        raise BadRequest("'logit_bias' must be an object of at most 1024 {\"token id\": bias}", "logit_bias")
    out = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()) or isinstance(bias, bool) or \
                not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise BadRequest(f"'logit_bias' takes token ids (strings of digits) to numbers -100..100, "
                             f"got {key!r}: {bias!r}", "logit_bias")
        out[int(key)] = float(bias)
    return out


def parse_completion(body: Any) -> Ask:
    ask = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # the SDK's list form, one prompt
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string (one prompt per request)", "prompt")
    ask.prompt = prompt
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest("'echo' must be true or false", "echo")
    ask.echo = echo
    return ask


def text_parts(value: Any, where: str, kinds: tuple[str, ...] = ("text",), *, none: bool = True) -> str:
    """A message's content: a string, or a list of text parts of these `kinds` (chat's
    `text`; the Responses API's `input_text`/`output_text`); None is "" where `none`."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") in kinds and isinstance(part.get("text"), str)):
                raise BadRequest(f"'{where}' parts must be text ({' or '.join(kinds)} parts: "
                                 f"{{\"type\": \"{kinds[0]}\", \"text\": ...}})", where)
            parts.append(part["text"])
        return "".join(parts)
    if value is None and none:
        return ""
    raise BadRequest(f"'{where}' must be a string or a list of text parts", where)


def parse_chat(body: Any) -> Ask:
    ask = _common(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
        role = "system" if m["role"] == "developer" else m["role"]
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"'messages[{i}].role' must be system, developer, user, assistant or tool, "
                             f"got {m['role']!r}", f"messages[{i}].role")
        turn: dict[str, Any] = {"role": role, "content": text_parts(m.get("content"), f"messages[{i}].content")}
        if role == "assistant" and m.get("tool_calls"):
            turn["tool_calls"] = history_calls(m["tool_calls"], i)
        if role == "tool":
            turn["tool_call_id"] = str(m.get("tool_call_id", ""))
            if isinstance(m.get("name"), str):
                turn["name"] = m["name"]
        ask.messages.append(turn)
    ask.tools = parse_tools(body)
    if ask.logprobs is not None and ask.tools is not None and ask.tools.reads_calls:
        # (llama-server refuses it too: a call's tokens are not text the client is sent)
        raise BadRequest("'logprobs' with 'tools' is not supported; send one, or tool_choice \"none\"", "logprobs")
    ask.schema = _response_format(body.get("response_format"))
    if ask.schema is not None and ask.tools is not None and ask.tools.reads_calls:
        raise BadRequest("'response_format' with 'tools' is not supported yet (the answer would be a call or "
                         "schema-bound content, two grammars); send one, or tool_choice \"none\"", "response_format")
    return ask


def _response_format(value: Any) -> dict[str, Any] | None:
    """The JSON schema `response_format` binds the content to (None: free text). OpenAI's
    `json_schema.schema`, llama-server's top-level `schema` too; `json_object`: any object."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema", {"type": "object"})
    elif kind == "json_schema":
        inner = value.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else value.get("schema")
        if schema is None and isinstance(inner, dict) and "schema" not in inner:
            raise BadRequest("'response_format.json_schema.schema' is missing", "response_format.json_schema.schema")
    else:
        raise BadRequest(f"'response_format.type' must be text, json_object or json_schema, got {kind!r}",
                         "response_format.type")
    if not isinstance(schema, dict):
        raise BadRequest("'response_format' schema must be a JSON schema object", "response_format")
    return schema


# --- responses ------------------------------------------------------------------------
@dataclass(slots=True)
class Outcome:
    """What the engine did for one request, for `usage` and llama-server's `timings`."""

    n_prompt: int = 0
    n_generated: int = 0
    finish_reason: str = "stop"  # stop | length | abort (cut short: `error` says why)
    error: str = ""  # why an aborted answer ended, for the client (request.FINISH)
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    draft_n: int = 0
    draft_n_accepted: int = 0
    cached: int = 0  # prompt tokens reused from the previous request's rows

    def error_body(self) -> dict[str, Any]:
        """OpenAI's error object for an answer cut short (readable beside its text)."""
        return {"message": self.error, "type": "server_error", "param": None, "code": "aborted"}

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.n_prompt, "completion_tokens": self.n_generated,
                "total_tokens": self.n_prompt + self.n_generated,
                "prompt_tokens_details": {"cached_tokens": self.cached}}

    def timings(self) -> dict[str, Any]:
        """llama-server's per-response `timings` (tools that read it read ours)."""
        n_eval = self.n_prompt - self.cached
        return {
            "cache_n": self.cached,
            "prompt_n": n_eval, "prompt_ms": self.prefill_ms,
            "prompt_per_token_ms": self.prefill_ms / n_eval if n_eval else 0.0,
            "prompt_per_second": n_eval / (self.prefill_ms / 1e3) if self.prefill_ms else 0.0,
            "predicted_n": self.n_generated, "predicted_ms": self.decode_ms,
            "predicted_per_token_ms": self.decode_ms / self.n_generated if self.n_generated else 0.0,
            "predicted_per_second": self.n_generated / (self.decode_ms / 1e3) if self.decode_ms else 0.0,
            "draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted,
        }


def response(ask: Ask, rid: str, text: str, out: Outcome, tokens: list[int] | None = None,
             calls: list[Any] | None = None, logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
    """The whole (non-streamed) response; `tokens` with `return_tokens`; `calls`: the tool
    calls read from the text (serve/tools.Call)."""
    created = int(time.time())
    if ask.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            # OpenAI's shape: content null when the answer is only calls.
            message = {"role": "assistant", "content": text or None, "tool_calls": [c.body() for c in calls]}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": out.finish_reason,
                                  "logprobs": chat_logprobs(logprobs or []) if ask.logprobs is not None else None}
        obj = "chat.completion"
    else:
        head = ask.prompt if ask.echo else ""
        choice = {"index": 0, "text": head + text, "finish_reason": out.finish_reason,
                  "logprobs": completion_logprobs(logprobs or [], len(head)) if ask.logprobs is not None else None}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": ask.model, "choices": [choice],
            "usage": out.usage(), "timings": out.timings()}
    if ask.return_tokens:
        body["tokens"] = list(tokens or [])
    if out.error:
        body["error"] = out.error_body()
    return body


def finish_chunk(ask: Ask, rid: str, created: int, out: Outcome) -> dict[str, Any]:
    """The streamed chunk with the finish reason; an answer cut short carries its error too
    (the openai SDK raises it: the client cannot take the cut text for a whole answer)."""
    body = chunk(ask, rid, created, None if ask.kind == "chat" else "", out.finish_reason)
    if out.error:
        body["error"] = out.error_body()
    return body


def chunk(ask: Ask, rid: str, created: int, text: str | None, finish: str | None = None,
          *, first: bool = False, logprobs: list[TokenLogprob] | None = None, offset: int = 0) -> dict[str, Any]:
    """One streamed chunk: text (None: no choice delta), or the finish reason; `logprobs`:
    the entries of the tokens this chunk completes (`offset`: where its text starts)."""
    if ask.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish,
                                  "logprobs": chat_logprobs(logprobs) if logprobs else None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish,
                  "logprobs": completion_logprobs(logprobs, offset) if logprobs else None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": ask.model, "choices": [choice]}


def call_chunk(ask: Ask, rid: str, created: int, delta: CallDelta, *, first: bool = False) -> dict[str, Any]:
    """A streamed tool call's head or arguments fragment (`delta.tool_calls`)."""
    body = chunk(ask, rid, created, None, first=first)
    body["choices"][0]["delta"]["tool_calls"] = [delta.body()]
    return body


def usage_chunk(ask: Ask, rid: str, created: int, out: Outcome) -> dict[str, Any]:
    """The last chunk under `stream_options.include_usage`: no choices, the usage."""
    obj = "chat.completion.chunk" if ask.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": ask.model, "choices": [],
            "usage": out.usage(), "timings": out.timings()}
