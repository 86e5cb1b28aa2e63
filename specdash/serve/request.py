"""One served request: what the engine thread runs, and how its text reaches the client.

The engine thread (sources/embedded.py) runs it like a typed prompt and hands it every
event of its run (`feed`); the request turns steps into text (stop strings held back,
stops.StopText) and passes it to the HTTP side's asyncio queue with
`call_soon_threadsafe`, never blocking the engine. The HTTP side marks it cancelled when
the client leaves; the engine asks `stop_reason()` before every step, so generation ends
within a step and the next request runs.

A request is an object of its own (sampling, stop, speculative settings): batched with
others (serve --parallel, engine/batch), it is fed the events that name it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field

from specdash.contract import events as E
from specdash.engine.engine import RunOptions
from specdash.engine.grammar import CompiledGrammar
from specdash.serve.protocol import Ask, Outcome
from specdash.serve.logprobs import LogprobLog, TokenLogprob
from specdash.serve.stops import StopText
from specdash.serve.tools import Call, CallDelta, CallReader

_ids = itertools.count(1)

# What the engine's stop reasons are to a client (OpenAI's finish_reason).
FINISH = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}
# Any other reason ended the answer before it was done (the engine's `stopped`: a Stop
# command, the operator's; `cancelled`: its client left): never reported as a normal stop,
# but as vLLM's `abort` with an error a client can read, saying the text is cut short.
ABORTED = "abort"


@dataclass(slots=True)
class Text:
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens this text completes
    offset: int = 0  # characters of the answer before it


@dataclass(slots=True)
class CallPart:
    delta: CallDelta  # a tool call's head or a fragment of its arguments


@dataclass(slots=True)
class Done:
    outcome: Outcome
    text: str  # all the text the client was sent
    tokens: list[int]  # every token generated (a stop string's own included)
    calls: list[Call] = field(default_factory=list)  # the tool calls read from the text
    logprobs: list[TokenLogprob] = field(default_factory=list)  # every sent token's (logprobs asked)


@dataclass(slots=True)
class Failed:
    message: str


Update = Text | CallPart | Done | Failed


@dataclass(eq=False)
class ServedRequest:
    ask: Ask
    tokens: list[int]
    loop: asyncio.AbstractEventLoop
    client: str = ""
    compiled: CompiledGrammar | None = None  # its schema or forced tool call, checked (serve/link.grammar_for)
    id: str = field(default_factory=lambda: f"{next(_ids)}")
    updates: asyncio.Queue[Update] = field(default_factory=asyncio.Queue)
    state: str = "waiting"  # waiting | running | done | cancelled
    deadline: float = float("inf")  # time.monotonic() past which the server ends it (serve --timeout)
    _cancel: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._stops = StopText(self.ask.stop)
        self._logprobs = LogprobLog(self.ask.logprobs) if self.ask.logprobs is not None else None
        self._sent_bytes = self._sent_chars = 0
        tools = self.ask.tools
        # Calls are read from the text only where the model was told of tools.
        self._calls = CallReader(parallel=tools.parallel, names=tuple(tools.names)) \
            if tools is not None and tools.reads_calls else None
        self._sent: list[str] = []
        self._tokens: list[int] = []
        self.outcome = Outcome(n_prompt=len(self.tokens))

    # --- what the engine thread reads ----------------------------------------------------
    @property
    def title(self) -> str:
        who = f" from {self.client}" if self.client else ""
        # The request's kind as the dashboard and attach show it: a chat offering tools
        # reads "chat+tools", so the requests screen tells agents' turns apart.
        tools = self.ask.tools
        kind = f"{self.ask.kind}+tools" if tools is not None and tools.reads_calls else \
            f"{self.ask.kind}+schema" if self.ask.schema is not None else self.ask.kind
        return f"{kind} #{self.id}{who}"

    @property
    def text(self) -> str:
        """What the generation panel shows as the prompt: the last message or the prompt."""
        return self.ask.messages[-1]["content"] if self.ask.messages else self.ask.prompt

    @property
    def max_tokens(self) -> int | None:
        return self.ask.max_tokens

    def run_options(self) -> RunOptions:
        """What the engine runs it with (sources/embedded.Served): the client's settings on
        top of the live ones, its sampling rules, a fresh grammar state for each run (one run
        again after an engine fault starts over), and its stop check before every step."""
        ask = self.ask
        return RunOptions(overrides=ask.overrides(), seed=ask.seed, stop_when=self.stop_reason, reuse_rows=True,
                          drafter=ask.speculation.drafter,
                          grammar=self.compiled.start() if self.compiled is not None else None,
                          grammar_drafts=ask.speculation.grammar,
                          logit_bias=ask.logit_bias, penalties=ask.penalties, min_p=ask.min_p,
                          observe_rows=self._logprobs.observe if self._logprobs is not None else None)

    def begin(self) -> bool:
        """The engine takes it; False if the client left while it waited."""
        if self._cancel.is_set():
            self.state = "cancelled"
            return False
        self.state = "running"
        return True

    def stop_reason(self) -> str:
        """Why generation must end before the next step ("" to go on)."""
        if self._cancel.is_set():
            return "cancelled"
        # One call asked for (parallel_tool_calls false) and made: the answer is complete.
        return "stop" if self._stops.stopped or (self._calls is not None and self._calls.done) else ""

    def feed(self, ev: E.Event) -> None:
        match ev:
            case E.PrefillEvent():
                self.outcome.prefill_ms = ev.ms
                self.outcome.cached = ev.reused
            case E.StepEvent():
                self._tokens.extend(ev.tokens)
                self._send(self._stops.feed(ev.text))
            case E.Summary():
                self._send(self._stops.flush())
                if self._calls is not None:
                    self._pass(self._calls.flush())
                o = self.outcome
                o.n_generated = ev.n_generated
                o.finish_reason = FINISH.get(ev.stop_reason, ABORTED)
                if o.finish_reason == "stop" and self._calls is not None and self._calls.calls:
                    o.finish_reason = "tool_calls"
                if o.finish_reason == ABORTED:
                    by = "stopped by the server's operator" if ev.stop_reason == "stopped" else ev.stop_reason
                    o.error = f"the answer was cut short ({by}) after {ev.n_generated} tokens"
                o.decode_ms = ev.decode_s * 1e3
                o.draft_n, o.draft_n_accepted = ev.num_draft_tokens, ev.num_accepted_tokens
                self.state = "done"
                self._put(Done(o, "".join(self._sent), self._tokens, self._calls.calls if self._calls else [],
                               self._logprobs.entries[:self._logprobs.released] if self._logprobs else []))

    def called(self) -> list[str]:
        return [c.name for c in self._calls.calls] if self._calls is not None else []

    def fail(self, message: str) -> None:
        """The engine could not run it (the HTTP side answers 500 with `message`)."""
        if self.state != "done":
            self.state = "done"
            self._put(Failed(message))

    def _send(self, text: str) -> None:
        if text:
            self._pass(self._calls.feed(text) if self._calls is not None else [text])

    def _pass(self, parts: list[str | CallDelta]) -> None:
        for part in parts:
            if isinstance(part, str):
                if part:
                    self._sent.append(part)
                    self._sent_bytes += len(part.encode("utf-8"))
                    released = self._logprobs.release(self._sent_bytes) if self._logprobs is not None else []
                    self._put(Text(part, released, self._sent_chars))
                    self._sent_chars += len(part)
            else:
                self._put(CallPart(part))

    def _put(self, update: Update) -> None:
        try:
            self.loop.call_soon_threadsafe(self.updates.put_nowait, update)
        except RuntimeError:  # the HTTP loop is closed: the server is shutting down
            pass

    # --- the HTTP side ---------------------------------------------------------------------
    def cancel(self) -> None:
        """The client left: the engine stops within a step (or skips it if it waits)."""
        self._cancel.set()
        if self.state == "waiting":
            self.state = "cancelled"

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()
