"""Scripted sources for the health tests: event streams that run steady, then collapse,
repeat, stall or stop paying. Data in the contract's shape, as the engine and a server's
polls emit it (their own tests check those against the real things)."""

from __future__ import annotations

from collections.abc import Iterator

from specdash.contract import events as E

K = 4


def settings(source: str = "engine", k: int = K, drafter: str = "lookup") -> E.SettingsEvent:
    return E.SettingsEvent(source=source, target="smollm2-135m", drafter=drafter, draft=drafter, k=k, t=0.0)


class Steps:
    """A stream of step events on its own clock."""

    def __init__(self, t: float = 1.0):
        self.t = t
        self.n = 0

    def step(self, *, k: int = K, drafted: int = K, accepted: int = 2, dt: float = 0.05) -> E.StepEvent:
        self.t += dt
        self.n += 1
        m = accepted + 1
        return E.StepEvent(step=self.n, k=k, drafter="lookup" if drafted else "none", drafted=drafted,
                           accepted=accepted, tokens=list(range(m)), pieces=["x"] * m,
                           from_draft=[i < accepted for i in range(m)], draft_ms=1.0, verify_ms=dt * 1e3 - 2,
                           other_ms=1.0, n_past=self.n, n_generated=self.n, t=self.t)

    def run(self, seconds: float, **kw: float) -> Iterator[E.StepEvent]:
        dt = kw.get("dt", 0.05)
        for _ in range(int(seconds / dt)):
            yield self.step(**kw)  # type: ignore[arg-type]

    def varied(self, seconds: float, dt: float = 0.05) -> Iterator[E.StepEvent]:
        """Steady, as real text is: acceptance 1, 2, 3 or 4 of 4 in a fixed cycle (mean
        length 3.5 over a cycle of 0..4 would be flat; real ones wobble)."""
        cycle = (3, 1, 4, 2, 3, 0, 4, 2)
        for i in range(int(seconds / dt)):
            yield self.step(accepted=cycle[i % len(cycle)], dt=dt)


def engine_steady(seconds: float = 60.0) -> list[E.Event]:
    s = Steps()
    return [settings(), E.PromptEvent("p", "p", t=0.5), E.PrefillEvent(10, 5.0, t=1.0), *s.varied(seconds)]


def engine_collapse() -> list[E.Event]:
    """40 s at mean length ~3.4, then 10 s accepting nothing (length 1)."""
    s = Steps()
    return [settings(), E.PrefillEvent(10, 5.0, t=1.0), *s.varied(40.0), *s.run(10.0, accepted=0)]


def engine_repeats() -> list[E.Event]:
    """Every draft accepted whole for 40 s: the text repeats itself."""
    s = Steps()
    return [settings(), E.PrefillEvent(10, 5.0, t=1.0), *s.varied(10.0), *s.run(40.0, accepted=K)]


def engine_stalls() -> list[E.Event]:
    """40 s at 20 steps/s, then steps 20x slower for 10 s (a request that crawls)."""
    s = Steps()
    return [settings(), E.PrefillEvent(10, 5.0, t=1.0), *s.varied(40.0), *s.varied(10.0, dt=1.0)]


def engine_not_paying() -> list[E.Event]:
    """12 s of plain decoding (K=0) at 50 tok/s, then K=4 at 1.3 tokens per 0.05 s step
    (26 tok/s): speculation loses to plain decoding."""
    s = Steps()
    plain = [s.step(k=0, drafted=0, accepted=0, dt=0.02) for _ in range(600)]
    return [settings(), E.PrefillEvent(10, 5.0, t=1.0), *plain, *s.run(20.0, accepted=0)]


# --- a server's polls ---


def poll(t: float, *, tokens: int, drafts: int = 10, accepted: int = 20, running: int = 1,
         url: str = "http://127.0.0.1:9") -> list[E.Event]:
    counters = E.CountersEvent(seconds=1.0, tokens=tokens, steps=drafts, num_drafts=drafts,
                               num_draft_tokens=drafts * K, num_accepted_tokens=accepted,
                               num_accepted_tokens_per_pos=[], k=K, t=t)
    row = E.ServerEvent(url=url, state="up", backend="vllm", requests_running=running, t=t)
    return [counters, row]


def server(kind: str = "steady", seconds: int = 60) -> list[E.Event]:
    """Polls at 1 s of a busy server: steady (30 tok/s, length 3), or, after 40 s, collapsing
    (length 1.1), repeating (every draft token accepted) or stalled (requests run, 1 tok/s)."""
    out: list[E.Event] = [settings("remote", drafter="speculative")]
    for i in range(seconds):
        t = 10.0 + i
        late = i >= 40
        if kind == "collapse" and late:
            out += poll(t, tokens=11, drafts=10, accepted=1)
        elif kind == "repeat" and i >= 10:
            out += poll(t, tokens=50, drafts=10, accepted=40)
        elif kind == "stall" and late:
            out += poll(t, tokens=1, drafts=1, accepted=2)
        else:
            out += poll(t, tokens=30 + (i % 3), drafts=10, accepted=18 + 4 * (i % 3))
    return out
