"""The serve queue and stop strings without a model: what survives an engine restart, and
what a client may be sent. (The real server is tests/test_serve.py.)"""

from __future__ import annotations

import asyncio
import threading

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.serve.protocol import Ask
from specdash.serve.queue import ServeQueue
from specdash.serve.request import Done, Failed, ServedRequest, Text
from specdash.serve.stops import StopText
from specdash.sources.embedded import EmbeddedSource, PromptQueue


def summary(n: int, reason: str = "max_tokens") -> E.Summary:
    return E.Summary(text="", stop_reason=reason, n_prompt=3, n_generated=n, num_drafts=0, num_draft_tokens=0,
                     num_accepted_tokens=0, num_accepted_tokens_per_pos=[], acceptance_rate=None,
                     mean_accepted_length=1.0, tokens_per_s=1.0, prefill_tokens_per_s=1.0, prefill_ms=1.0,
                     decode_s=1.0, draft_ms=0.0, verify_ms=1.0, other_ms=0.0, steps=n)


def step(text: str) -> E.StepEvent:
    return E.StepEvent(step=1, k=0, drafter="none", drafted=0, accepted=0, tokens=[1], pieces=[text],
                       from_draft=[False], draft_ms=0, verify_ms=1, other_ms=0, n_past=1, n_generated=1, t=0)


class Session:
    """Runs a request as two steps; `gate` holds the first run until released."""

    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate
        self.ran: list[str] = []
        self.settings = EngineSettings()

    def run_request(self, tokens, max_tokens, options):
        req = options.stop_when.__self__  # the ServedRequest whose check this is: it names the run
        if self.gate is not None:
            self.gate.wait(10)
        self.ran.append(req.ask.prompt)
        for piece in ("a", "b"):
            if req.stop_reason():
                yield summary(1, req.stop_reason())
                return
            yield step(piece)
        yield summary(2)

    def run(self, prompt, max_tokens=None):
        yield summary(1)

    def send(self, cmd):
        pass

    def apply_pending(self):
        return []

    def close(self):
        pass


def collect(loop: asyncio.AbstractEventLoop, req: ServedRequest) -> list:
    async def take() -> list:
        out = []
        while True:
            update = await asyncio.wait_for(req.updates.get(), 10)
            out.append(update)
            if isinstance(update, (Done, Failed)):
                return out

    return loop.run_until_complete(take())


def test_requests_waiting_through_a_restart_run_after_it_in_order():
    loop = asyncio.new_event_loop()
    queue = ServeQueue()
    reqs = [ServedRequest(Ask("completion", "m", prompt=p), [1, 2, 3], loop) for p in ("first", "second", "third")]
    gate = threading.Event()
    events: list[E.Event] = []
    old = EmbeddedSource(lambda s, p: Session(gate), EngineSettings(), queue)
    old.start(events.append)
    for r in reqs:
        queue.submit(r)
    # The engine holds the first; the others wait. Then the source goes (as `r` replaces it).
    queue_events = [e for e in events if isinstance(e, E.QueueEvent)]
    old.close()
    gate.set()
    old.finished.wait(5)
    new_session = Session()
    new = EmbeddedSource(lambda s, p: new_session, EngineSettings(), queue.adopt(PromptQueue()))
    new.start(events.append)
    updates = [collect(loop, r) for r in reqs]
    new.close()
    # Every request was answered: the one running when the source closed with a reason,
    # the waiting ones by the new engine, in arrival order, none dropped.
    assert [type(u[-1]) for u in updates][1:] == [Done, Done]
    assert isinstance(updates[0][-1], (Done, Failed))
    assert new_session.ran[-2:] == ["second", "third"]
    assert queue_events and queue_events[0].waiting == [] and any(len(e.waiting) == 2 for e in queue_events)
    loop.close()


def test_a_request_whose_client_left_while_waiting_is_skipped():
    loop = asyncio.new_event_loop()
    queue = ServeQueue()
    session = Session()
    gone = ServedRequest(Ask("completion", "m", prompt="gone"), [1], loop)
    kept = ServedRequest(Ask("completion", "m", prompt="kept"), [1], loop)
    gone.cancel()
    source = EmbeddedSource(lambda s, p: session, EngineSettings(), queue)
    queue.submit(gone)
    queue.submit(kept)
    source.start(lambda ev: None)
    assert [type(u) for u in collect(loop, kept)] == [Text, Text, Done]
    source.close()
    assert session.ran == ["kept"]
    loop.close()


def test_stop_strings_are_held_back_until_they_resolve():
    stops = StopText(["</end>", "STOP"])
    sent = [stops.feed(piece) for piece in ("Hello <", "/e", "ither> and S", "TO", "P never")]
    # "<", "/e" could still begin "</end>": held; "ither>" resolves it as text.
    assert sent == ["Hello ", "", "</either> and ", "", ""]
    assert stops.stopped and stops.flush() == ""
    plain = StopText(["</end>"])
    assert plain.feed("a </") == "a " and plain.flush() == "</"  # held text is text at the end
    assert StopText([]).feed("anything") == "anything"


def test_the_sweep_is_refused_while_requests_wait():
    from specdash.tui.controls import why_unavailable
    from specdash.tui.reducer import DashState

    state = DashState()
    state.feed(E.SettingsEvent(source="engine", target="t", drafter="lookup", k=4, supports=["k", "sweep", "prompt"]))
    state.feed(E.StatusEvent("ready"))
    assert why_unavailable("sweep", state) == ""
    state.feed(E.QueueEvent(running=["chat #1"], waiting=["chat #2", "completion #3"]))
    assert "2 requests waiting" in why_unavailable("sweep", state)
    state.feed(E.QueueEvent(running=["chat #2"], waiting=[]))
    assert why_unavailable("sweep", state) == ""
