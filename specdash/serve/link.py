"""What the HTTP side knows of the engine: readiness, the tokenizer, the queue, metrics.

The HTTP thread never touches the engine's models. It tokenizes with a vocabulary-only
copy of the target (loaded once the session is up: it is the same file), so a prompt too
long for the context is a 400 before it queues, and it hands requests to the serve queue.
Commands it takes (steering) go through the source's `send`, the dashboard's own path.
Every event the source emits passes `feed`, which keeps the status, the exporter and
the rows of /slots.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specdash.contract.names import display_name
from specdash.contract import events as E
from specdash.contract.vocabulary import parse_command
from specdash.contract.events import ContractError
from specdash.engine.batch.costs import paying_width
from specdash.engine.grammar import CompiledGrammar, GrammarRefused, Grammars
from specdash.engine.llm import LLM
from specdash.engine.settings import LIMIT
from specdash.contract.errors import SpecdashError
from specdash.monitor.metrics_exporter import MetricsExporter
from specdash.serve.chat_template import ChatTemplate, TemplateRefused
from specdash.serve.protocol import Ask, BadRequest
from specdash.serve.queue import ServeQueue
from specdash.serve.request import ServedRequest
from specdash.serve.tools import CLOSE, OPEN, call_grammar

# What the steering route takes (attach's keys), and all it takes: the rest of the schedule
# vocabulary (pause, stop, experts=, cut=, forget) would freeze, cut short or reload the
# engine for every client, so any holder of an inference key would hold an admin key.
STEERABLE = ("k", "draft", "temp", "adaptive")
# Each value's range, checked before it is sent: a refusal here is the client's 400, not a
# notice on the operator's screen.
STEER_SYNTAX = (f"k=N ({LIMIT['k'].allowed}), draft=KIND or a loaded draft model, "
                f"temp=T ({LIMIT['temperature'].allowed}), adaptive=on|off")
# A short chat turn whose rows calibrate adaptive K before /health says ok.
WARM_UP = "Write a Python function that returns the sum of a list of numbers."


def _in_range(name: str, value: object, said: str) -> None:
    try:
        LIMIT[name].coerce(value)
    except ValueError:
        raise SpecdashError(f"{said}: {name} must be {LIMIT[name].allowed}") from None


class EngineLink:
    def __init__(self, queue: ServeQueue, exporter: MetricsExporter, n_ctx: int,
                 send: Callable[[E.Command], None] | None = None, aliases: tuple[str, ...] = (),
                 max_tokens: int | None = None, parallel: int | None = 1):
        """parallel: requests in one target batch (serve --parallel); None: measured at start."""
        self.queue = queue
        self.exporter = exporter
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens  # for requests that send none (None: up to the context)
        self._send = send
        self.status = "loading"  # loading | calibrating | ok | error
        # What /v1/models lists and responses name: a registry name as given, a file by its stem.
        first = next(iter(aliases), "specdash")
        self.model_id = display_name(first)
        self.started = time.time()
        self._vocab: LLM | None = None
        self._template: ChatTemplate | None = None
        self._vocab_lock = threading.Lock()  # llama.cpp's tokenizer is not documented thread-safe
        self._grammars: Grammars | None = None  # llguidance's tokenizer over the vocabulary
        self._retired: list[LLM] = []  # earlier targets' vocabularies (see on_session)
        self._drafters: Callable[[str], str | None] = lambda spec: None
        self._steer_draft: Callable[[str], str | None] = lambda spec: "the model is still loading"
        self._settings: E.SettingsEvent | None = None
        self.parallel = parallel
        self.width = parallel or 1  # what the session runs at once, once decided (on_session)
        self._running: list[str] = []
        self._waiting: list[str] = []
        self.served = 0

    @property
    def ready(self) -> bool:
        return self.status == "ok"

    # --- the engine thread ------------------------------------------------------------------
    def on_session(self, session: Any) -> Iterator[E.Event]:
        """Called in the engine thread once models are loaded: open the tokenizer, then
        calibrate adaptive K on a short turn (its notices are the events yielded)."""
        path = Path(session.target_path)
        with self._vocab_lock:
            if self._vocab is not None:
                # Not closed: grammars of requests in flight call into its tokenizer.
                self._retired.append(self._vocab)
            self._vocab = LLM(path, vocab_only=True)
            self._template = ChatTemplate(self._vocab)
            self._grammars = Grammars(self._vocab.vocab, self._vocab.n_vocab)
            refused = self._template.notice
        if refused:
            yield E.NoticeEvent("warning", refused, t=E.now())
        self._drafters = session.drafter_unavailable
        self._steer_draft = session.steer_unavailable
        self.status = "calibrating"
        yield from session.warm_up(WARM_UP)
        yield from self._choose_width(session)
        self.status = "ok"

    def _choose_width(self, session: Any) -> Iterator[E.Event]:
        """How many requests share a target batch: --parallel's N, or under auto the widest
        batch whose per-request step costs at most PAYS of one request's alone, timed now."""
        if self.parallel is not None:
            session.width = self.parallel
        else:
            ms = session.batch_widths(WARM_UP)
            session.width = paying_width(ms)
            if ms:
                one = ms[1]
                costs = ", ".join(f"{w} at once {v / one:.2f}x" for w, v in sorted(ms.items()) if w > 1)
                yield E.NoticeEvent("info", f"serve --parallel auto: a plain step of {costs} one request's "
                                    f"({one:.1f} ms): up to {session.width} in one batch", t=E.now())
            else:
                yield E.NoticeEvent("info", "serve --parallel auto: this target's state cannot be cut back per "
                                    "request (recurrent or hybrid): one request at a time", t=E.now())
        self.width = session.width

    def feed(self, ev: E.Event) -> None:
        """Every event the source emits (any thread)."""
        self.exporter.feed(ev)
        match ev:
            case E.StatusEvent(state="error"):
                self.status = "error"
            case E.StatusEvent(state="loading") if self.status == "error":
                self.status = "loading"  # `r`: a new source loads
            case E.SettingsEvent():
                self._settings = ev
            case E.QueueEvent():
                self._running, self._waiting = list(ev.running), list(ev.waiting)
            case E.Summary():
                self.served += 1

    # --- the HTTP thread --------------------------------------------------------------------
    def tokens_for(self, ask: Ask) -> list[int]:
        with self._vocab_lock:
            vocab, template = self._vocab, self._template
            if vocab is None or template is None:
                raise BadRequest("the model is still loading", status=503, kind="unavailable_error")
            if ask.kind == "chat":
                try:
                    tools = ask.tools.tools if ask.tools is not None and ask.tools.choice != "none" else None
                    tokens = template.tokens(ask.messages, tools)
                except SpecdashError as exc:  # (llama.cpp's built-in format: none for this model)
                    raise BadRequest(str(exc), exc.param if isinstance(exc, TemplateRefused) else "messages") from None
            else:
                tokens = vocab.tokenize(ask.prompt)
        beyond = [t for t in ask.logit_bias if t >= vocab.n_vocab]
        if beyond:
            raise BadRequest(f"'logit_bias' names token {beyond[0]}, past the vocabulary ({vocab.n_vocab} tokens)",
                             "logit_bias")
        field = "messages" if ask.kind == "chat" else "prompt"
        if len(tokens) + 1 > self.n_ctx:
            raise BadRequest(f"'{field}' is {len(tokens)} tokens but the context holds {self.n_ctx}; "
                             f"send less, or start the server with a larger --ctx", field)
        if ask.speculation.drafter is not None:
            why = self._drafters(ask.speculation.drafter)
            if why:
                raise BadRequest(f"'speculative.types': {why}", "speculative.types")
        return tokens

    def grammar_for(self, ask: Ask) -> CompiledGrammar | None:
        """The grammar a request's answer is held to, checked now (a 400 naming what it cannot
        enforce): its `response_format` schema, its forced tool call (tool_choice required or
        a name), or under tool_choice auto the call's grammar from its open tag on. None: free text."""
        tools = ask.tools
        if ask.schema is None and (tools is None or tools.choice == "none"):
            return None
        with self._vocab_lock:
            vocab, grammars = self._vocab, self._grammars
            if vocab is None or grammars is None:
                raise BadRequest("the model is still loading", status=503, kind="unavailable_error")
            try:
                if ask.schema is not None:
                    return grammars.json_schema(ask.schema, "response_format")
                assert tools is not None
                open_tag = grammars.term(vocab, OPEN)
                if not tools.forced and not open_tag.startswith("<["):
                    return None  # auto, and the tag is text: free text could not be told from a call's start
                compiled = grammars.lark(call_grammar(tools, open_tag, grammars.term(vocab, CLOSE)), "tools")
                # auto: free text until the model opens a call, then the call's grammar (the
                # tools' schemas hold, and the call's fixed text is drafted), as llama-server's lazy grammar.
                return compiled if tools.forced else compiled.lazy(int(open_tag[2:-2]))
            except GrammarRefused as exc:
                raise BadRequest(str(exc), exc.param) from None

    def submit(self, request: ServedRequest) -> None:
        self.queue.submit(request)

    def cancel(self, request: ServedRequest) -> None:
        """Its client left or its time ran out: a running request stops within a step, a
        waiting one leaves the line now (no longer counted, its tokens freed)."""
        request.cancel()
        self.queue.drop(request)

    def metrics(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.exporter.registry), CONTENT_TYPE_LATEST

    def command(self, text: str) -> str:
        """A command in `run --at`'s syntax (k=4, draft=lookup, temp=0.7, adaptive=on),
        sent as the dashboard sends it; what was sent."""
        if self._send is None:
            raise SpecdashError("this server takes no commands")
        word = text.strip().partition("=")[0].strip().lower()
        if word not in STEERABLE:
            raise BadRequest(f"{text.strip()!r} is not steerable over HTTP; this server takes {STEER_SYNTAX}",
                             "command", status=403, kind="permission_error")
        try:
            cmd, _ = parse_command(text)
        except ContractError as exc:
            raise SpecdashError(str(exc)) from None
        match cmd:
            case E.SetK(k):
                _in_range("k", k, cmd.text())
            case E.SetSampling(temperature=t) if t is not None:
                _in_range("temperature", t, cmd.text())
            case E.SetDrafter(spec):
                why = self._steer_draft(spec)
                if why:
                    raise BadRequest(why, "command", status=403, kind="permission_error")
        self._send(cmd)
        return cmd.text()

    # --- llama-server's shapes ---------------------------------------------------------------
    def model_meta(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "specdash": True}

    def props(self) -> dict[str, Any]:
        s = self._settings
        return {
            "model_path": s.target_path if s else "",
            "total_slots": self.width,
            "build_info": "specdash",
            # What `specdash attach` reads to know it may drive and steer this server.
            "specdash": {"serve": True, "steer": "/v1/specdash/command", "commands": list(STEERABLE)},
            "default_generation_settings": {
                "n_ctx": self.n_ctx,
                "params": {"temperature": s.temperature if s else None, "top_p": s.top_p if s else None,
                           "speculative.n_max": s.k_max if s else None, "speculative.p_min": s.draft_p_min if s else None},
                "speculative": {"drafter": s.drafter if s else "", "k": s.k if s else None,
                                "adaptive": s.adaptive if s else None},
            },
        }

    def slots(self, show_clients: bool = False) -> list[dict[str, Any]]:
        """A slot per request the batch holds, with the one in flight there (llama-server's
        /slots); the first lists those waiting. A request's client address only with
        `show_clients` (a server with a key): a key-less /slots is anyone's to read."""
        def name(title: str) -> str:
            return title if show_clients else title.split(" from ", 1)[0]

        running = [name(t) for t in self._running]
        return [{"id": i, "n_ctx": self.n_ctx, "is_processing": i < len(running),
                 "id_task": running[i] if i < len(running) else "",
                 **({"queued": [name(t) for t in self._waiting]} if i == 0 else {})}
                for i in range(max(self.width, 1))]

    def close(self) -> None:
        with self._vocab_lock:
            if self._vocab is not None:
                self._vocab.close()
                self._vocab = None
            for vocab in self._retired:
                vocab.close()
            self._retired.clear()
