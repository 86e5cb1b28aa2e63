"""Every request field specdash knows, and what it does with each: the table docs/serve.md
prints. A field not listed is a 400 naming it: a client that asks for something must learn
it was not done, never get a 200 that ignored it (an agent would take the answer as done).

`neutral`: the values of a field specdash cannot honour that ask for nothing (`n: 1`,
`logprobs: false`), so clients that send the default are served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdash.serve.bad_request import BadRequest

HONOURED, ACCEPTED, REFUSED = "honoured", "accepted", "refused"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    routes: str  # "chat", "completion" or "both"
    does: str  # HONOURED | ACCEPTED (read, changes nothing) | REFUSED (unless neutral)
    note: str
    neutral: tuple[Any, ...] = (None,)


_BOTH, _CHAT, _COMP = "both", "chat", "completion"
FIELDS: tuple[Field, ...] = (
    Field("model", _BOTH, HONOURED, "any name is served when one model is loaded (as llama-server); "
                                    "/v1/models names the real one"),
    Field("messages", _CHAT, HONOURED, "rendered by the GGUF's own chat template; tool calls and tool results too"),
    Field("prompt", _COMP, HONOURED, "one string (or a list of one)"),
    Field("max_tokens", _BOTH, HONOURED, "default: up to the context, or serve --max-tokens"),
    Field("max_completion_tokens", _BOTH, HONOURED, "as max_tokens (it wins when both are sent)"),
    Field("temperature", _BOTH, HONOURED, "0..2; speculation stays exact"),
    Field("top_p", _BOTH, HONOURED, "(0, 1]"),
    Field("top_k", _BOTH, HONOURED, "0 (off) or more"),
    Field("seed", _BOTH, HONOURED, "the sampling stream's seed"),
    Field("stop", _BOTH, HONOURED, "up to 16 strings of 256 characters, never sent"),
    Field("stream", _BOTH, HONOURED, "SSE chunks, then data: [DONE]"),
    Field("stream_options", _BOTH, HONOURED, "include_usage"),
    Field("echo", _COMP, HONOURED, "the prompt before the text"),
    Field("return_tokens", _BOTH, HONOURED, "llama-server's: the generated token ids"),
    Field("speculative", _BOTH, HONOURED, "llama-server's speculative.n_max, n_min, p_min, types (also as flat keys); specdash's "
          "speculative.grammar (false: the grammar's fixed text is not drafted); any other key is refused"),
    Field("tools", _CHAT, HONOURED, "function tools, described by the model's chat template; "
                                    "a template without tools is a 400"),
    Field("tool_choice", _CHAT, HONOURED, "auto, none, required and a named function; required and a "
                                          "name are enforced by a grammar (the call parses, its arguments "
                                          "match the tool's schema)"),
    Field("parallel_tool_calls", _CHAT, HONOURED, "default false: one call, generation ends after it"),
    Field("n", _BOTH, REFUSED, "one choice per request", neutral=(None, 1)),
    Field("response_format", _CHAT, HONOURED, "text, json_object and json_schema (strict or not), enforced "
                                              "by a grammar; a schema feature it cannot express is a 400 naming "
                                              "it, never a looser grammar"),
    Field("logprobs", _BOTH, HONOURED, "chat: true; completions: how many alternatives (0-20); the target's "
                                       "own distribution, before any grammar; not with tools"),
    Field("top_logprobs", _CHAT, HONOURED, "0-20 alternatives per token"),
    Field("min_p", _BOTH, HONOURED, "0..1: sampling keeps the tokens at least min_p times the most likely "
                                    "one (after temperature, top-k, top-p); speculation stays exact"),
    Field("repeat_penalty", _BOTH, HONOURED, "llama-server's, 0.01-10, over the last 64 tokens of the context "
                                             "(llama.cpp's penalties sampler); speculation stays exact"),
    Field("presence_penalty", _BOTH, HONOURED, "-2..2, over the same window"),
    Field("frequency_penalty", _BOTH, HONOURED, "-2..2, per occurrence in the same window"),
    Field("logit_bias", _BOTH, HONOURED, "token id -> -100..100 added to the target's logit at every row; "
                                         "speculation stays exact"),
    Field("suffix", _COMP, REFUSED, "no fill-in-the-middle", neutral=(None, "")),
    Field("best_of", _COMP, REFUSED, "one choice per request", neutral=(None, 1)),
    Field("modalities", _CHAT, REFUSED, "text only", neutral=(None, ["text"])),
    Field("audio", _CHAT, REFUSED, "text only"),
    Field("prediction", _CHAT, REFUSED, "predicted outputs are not taken"),
    Field("web_search_options", _CHAT, REFUSED, "no web search"),
    Field("functions", _CHAT, REFUSED, "the deprecated form: send tools"),
    Field("function_call", _CHAT, REFUSED, "the deprecated form: send tool_choice"),
    Field("reasoning_effort", _CHAT, ACCEPTED, "these models do not reason: no effect"),
    Field("store", _BOTH, ACCEPTED, "nothing is stored"),
    Field("user", _BOTH, ACCEPTED, "not kept"),
    Field("metadata", _BOTH, ACCEPTED, "not kept"),
    Field("service_tier", _BOTH, ACCEPTED, "one tier"),
    Field("cache_prompt", _BOTH, ACCEPTED, "llama-server's: the KV rows are always reused"),
)
BY_NAME = {f.name: f for f in FIELDS}


def check_fields(body: dict[str, Any], route: str) -> None:
    """Refuse, by name, a field that is not in the table for `route` or one asked of
    specdash that it cannot do (`n: 2`). `route`: "chat" or "completion"."""
    for name, value in body.items():
        if name.startswith("speculative."):
            continue  # llama-server's flat keys, read by protocol._speculation
        f = BY_NAME.get(name)
        if f is None or f.routes not in ("both", route):
            where = "" if f is None else f" on /v1/{'chat/completions' if route == 'chat' else 'completions'}"
            raise BadRequest(f"'{name}' is not a field specdash takes{where}; it is refused rather than ignored "
                             "(docs/serve.md lists every field)", name)
        if f.does == REFUSED and value not in f.neutral:
            raise BadRequest(f"'{name}' is not supported by specdash: {f.note}; it is refused rather than ignored",
                             name)
