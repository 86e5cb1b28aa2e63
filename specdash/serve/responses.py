"""OpenAI's Responses API (`POST /v1/responses`, what Codex CLI and the Agents SDK's default
path speak), converted to the same engine request as a chat (llama-server converts it the
same way) and its answer written back in the Responses shapes, whole or as events.

Input items: messages (text parts), `function_call` and `function_call_output` (a call and
its result in the history), `instructions` as the system message; function tools; text
format json_schema/json_object. A field it does not take is a 400 naming it, as on chat.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from specdash.serve.protocol import Ask, BadRequest, Outcome, parse_chat, text_parts
from specdash.serve.tools import Call, CallDelta

# Responses fields and what they become on chat (None: read here, not passed on).
_TAKEN = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
          "temperature", "top_p", "stream", "text", "store", "metadata", "user", "reasoning", "truncation",
          "service_tier", "include", "seed", "top_k", "stop", "speculative"}
_NEUTRAL = {"truncation": (None, "disabled"), "include": (None, []), "previous_response_id": (None,),
            "background": (None, False), "conversation": (None,), "prompt": (None,)}


_PARTS = ("input_text", "output_text", "text")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' must be a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": text_parts(item.get("content"), f"{where}.content", _PARTS, none=False)})
        elif kind == "function_call":
            call = {"id": item.get("call_id", ""), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)  # calls in a row are one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id", ""),
                             "content": output if isinstance(output, str) else text_parts(output, f"{where}.output", _PARTS, none=False)})
        elif kind == "reasoning":
            continue  # a reasoning model's notes: these models write none, and none are kept
        else:
            raise BadRequest(f"'{where}.type' {kind!r} is not taken (message, function_call, "
                             "function_call_output)", f"{where}.type")
    return messages


def parse_responses(body: Any) -> Ask:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name, value in body.items():
        if name in _NEUTRAL:
            if value not in _NEUTRAL[name]:
                raise BadRequest(f"'{name}' is not supported by specdash (nothing is stored between requests: "
                                 "send the whole conversation in 'input'); it is refused rather than ignored", name)
        elif name not in _TAKEN and not name.startswith("speculative."):
            raise BadRequest(f"'{name}' is not a field specdash takes on /v1/responses; it is refused rather than "
                             "ignored", name)
    chat: dict[str, Any] = {"messages": _messages(body)}
    for name in ("model", "temperature", "top_p", "stream", "store", "metadata", "user", "seed", "top_k", "stop",
                 "parallel_tool_calls", "speculative"):
        if name in body:
            chat[name] = body[name]
    chat.update({k: v for k, v in body.items() if k.startswith("speculative.")})
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        tools = body["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function" for t in tools):
            raise BadRequest("'tools' must be function tools ({\"type\": \"function\", \"name\", \"parameters\"})",
                             "tools")
        chat["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                           if k in t}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "answer"), "schema": fmt.get("schema"), "strict": fmt.get("strict", False)}}
    elif fmt is not None:
        chat["response_format"] = fmt
    ask = parse_chat(chat)
    ask.api = "responses"
    ask.echoed = {"tools": body.get("tools") or [], "tool_choice": choice if choice is not None else "auto",
                  "text": {"format": fmt if isinstance(fmt, dict) else {"type": "text"}}}
    ask.include_usage = True  # the completed response always carries its usage
    return ask


# --- answers ----------------------------------------------------------------------------
def _usage(out: Outcome) -> dict[str, Any]:
    return {"input_tokens": out.n_prompt, "input_tokens_details": {"cached_tokens": out.cached},
            "output_tokens": out.n_generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": out.n_prompt + out.n_generated}


def _message(mid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _call_item(call: Call, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call.id.removeprefix('call_')}", "call_id": call.id,
            "name": call.name, "arguments": call.arguments if status == "completed" else "", "status": status}


def response_body(ask: Ask, rid: str, created: int, text: str, out: Outcome | None, calls: list[Call],
                  status: str = "completed") -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if status == "completed":
        if text and (text.strip() or not calls):
            output.append(_message(f"msg_{rid}", text))
        output += [_call_item(c) for c in calls]
    incomplete = out is not None and out.finish_reason == "length"
    body: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": created, "model": ask.model,
        "status": "incomplete" if incomplete and status == "completed" else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": {"code": "server_error", "message": out.error} if out is not None and out.error else None,
        "output": output, "parallel_tool_calls": bool(ask.tools and ask.tools.parallel),
        "tool_choice": ask.echoed.get("tool_choice", "auto"), "tools": ask.echoed.get("tools", []),
        "temperature": ask.temperature, "top_p": ask.top_p,
        "max_output_tokens": ask.max_tokens, "previous_response_id": None, "store": False, "metadata": {},
        "text": ask.echoed.get("text", {"format": {"type": "text"}}), "truncation": "disabled",
        "usage": _usage(out) if out else None,
    }
    return body


def new_id() -> str:
    return f"resp_{secrets.token_hex(12)}"


class ResponseEvents:
    """The streamed events of one response, in the order the SDK's accumulator expects:
    created, then per output item added → deltas → done, then completed."""

    def __init__(self, ask: Ask, rid: str):
        self.ask, self.rid, self.created = ask, rid, int(time.time())
        self._seq = 0
        self._text: list[str] = []
        self._message_open = False
        self._items: list[dict[str, Any]] = []  # finished output items
        self._calls: dict[int, Call] = {}  # streamed calls by index, with their output position

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq, **fields}

    def start(self) -> list[dict[str, Any]]:
        body = response_body(self.ask, self.rid, self.created, "", None, [], status="in_progress")
        return [self._event("response.created", response=body), self._event("response.in_progress", response=body)]

    def text(self, piece: str) -> list[dict[str, Any]]:
        out = []
        mid = f"msg_{self.rid}"
        if not self._message_open:
            self._message_open = True
            out.append(self._event("response.output_item.added", output_index=len(self._items),
                                   item=_message(mid, "", "in_progress")))
            out.append(self._event("response.content_part.added", item_id=mid, output_index=len(self._items),
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        self._text.append(piece)
        out.append(self._event("response.output_text.delta", item_id=mid, output_index=len(self._items),
                               content_index=0, delta=piece, logprobs=[]))
        return out

    def _close_message(self) -> list[dict[str, Any]]:
        if not self._message_open:
            return []
        self._message_open = False
        mid, text, index = f"msg_{self.rid}", "".join(self._text), len(self._items)
        item = _message(mid, text)
        self._items.append(item)
        return [self._event("response.output_text.done", item_id=mid, output_index=index, content_index=0,
                            text=text, logprobs=[]),
                self._event("response.content_part.done", item_id=mid, output_index=index, content_index=0,
                            part=item["content"][0]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def call(self, delta: CallDelta) -> list[dict[str, Any]]:
        out = []
        if delta.id is not None:  # a new call: the message before it is done, and so is the call before
            out += self._close_message() + self._close_call()
            call = Call(delta.id, delta.name or "")
            self._calls[delta.index] = call
            out.append(self._event("response.output_item.added", output_index=len(self._items),
                                   item=_call_item(call, "in_progress")))
        call = self._calls[delta.index]
        if delta.arguments:
            call.arguments += delta.arguments
            out.append(self._event("response.function_call_arguments.delta", output_index=len(self._items),
                                   item_id=_call_item(call)["id"], delta=delta.arguments))
        return out

    def _close_call(self) -> list[dict[str, Any]]:
        open_calls = [c for c in self._calls.values() if all(i.get("call_id") != c.id for i in self._items)]
        out = []
        for call in open_calls:
            item = _call_item(call)
            index = len(self._items)
            self._items.append(item)
            out += [self._event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                                arguments=call.arguments),
                    self._event("response.output_item.done", output_index=index, item=item)]
        return out

    def done(self, out: Outcome, calls: list[Call], text: str) -> list[dict[str, Any]]:
        events = self._close_message() + self._close_call()
        body = response_body(self.ask, self.rid, self.created, text, out, calls)
        body["output"] = self._items
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return events + [self._event(kind, response=body)]

    def failed(self, message: str) -> dict[str, Any]:
        body = response_body(self.ask, self.rid, self.created, "", None, [], status="failed")
        body["error"] = {"code": "server_error", "message": message}
        return self._event("response.failed", response=body)
