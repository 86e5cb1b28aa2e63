"""Requests, one row each: what a request's own numbers say (no Textual).

A source tells of a request by its Summary: the embedded engine's per prompt, a server's
in drive mode from llama-server's per-request `timings` (draft_n, draft_n_accepted) or
vLLM's per-request `metrics.speculative_decoding` (when the server runs with
--per-request-spec-decode-metrics). `RequestLog` folds the events into rows: when, prompt
tokens, generated, drafted, accepted, acceptance length, tok/s, drafter, and the
acceptance-length histogram (index j: drafting steps that accepted exactly j draft
tokens): the server's when the Summary carries one, else built from the request's own
steps. Totals elsewhere are untouched: this is a view of the same events.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from specdash.contract.events import Event, PrefillEvent, PromptEvent, SettingsEvent, StepEvent, Summary

KEEP = 1000  # rows kept (the oldest go first)


@dataclass(slots=True)
class RequestRow:
    t: float  # when it ended, on the source's clock
    since_start: float  # seconds from the first decoding event the log saw: what "when" shows
    title: str
    n_prompt: int
    n_generated: int
    num_drafts: int
    drafted: int
    accepted: int
    acceptance_length: float | None  # 1 + accepted / drafts (vLLM's mean acceptance length)
    tokens_per_s: float
    drafter: str
    stop_reason: str
    histogram: list[int] = field(default_factory=list)
    histogram_from: str = ""  # "server" (the request's own metrics) | "steps" (built here) | ""
    mean_k: float | None = None  # K over its steps (None: no steps seen, a server's request)
    mean_batch: float | None = None  # requests in the target batch over its steps (serve --parallel)
    calls: list[str] = field(default_factory=list)  # the tools a served request's answer called
    # Its grammar's fixed text drafted (StepEvent.drafter "grammar") and accepted, in tokens.
    grammar_drafted: int = 0
    grammar_accepted: int = 0

    @property
    def label(self) -> str:
        """What the table's request column shows: the tool called in place of the kind
        ("get_weather() #3" for "chat+tools #3 from ..."), so an agent's turns read as its calls."""
        if not self.calls:
            return self.title
        number = next((w for w in self.title.split() if w.startswith("#")), "")
        called = self.calls[0] + "()" + (f"+{len(self.calls) - 1}" if len(self.calls) > 1 else "")
        return f"{called} {number}".rstrip()


@dataclass(slots=True)
class _Open:
    """A request still running: what its steps said so far."""

    title: str
    hist: list[int] = field(default_factory=list)
    steps: int = 0
    k_sum: int = 0
    batch_sum: int = 0
    grammar_drafted: int = 0
    grammar_accepted: int = 0


def histogram_of(steps: list[StepEvent]) -> list[int]:
    """Index j: the drafting steps that accepted exactly j draft tokens."""
    hist: list[int] = []
    for ev in steps:
        _count(hist, ev)
    return hist


def _count(hist: list[int], ev: StepEvent) -> None:
    """A drafting step adds one to the bar of the draft tokens it accepted."""
    if ev.drafted > 0:
        if len(hist) <= ev.accepted:
            hist.extend([0] * (ev.accepted + 1 - len(hist)))
        hist[ev.accepted] += 1


class RequestLog:
    def __init__(self, keep: int = KEEP):
        self.rows: deque[RequestRow] = deque(maxlen=keep)
        self._t0: float | None = None
        self._now = 0.0  # the latest event time seen (a Summary may come unstamped: t = 0)
        # By request tag: "" for one at a time, a served request's title in a batch.
        self._open: dict[str, _Open] = {"": _Open("")}
        self._drafter = ""

    def feed(self, ev: Event) -> None:
        if self._t0 is None and ev.t and isinstance(ev, (PrefillEvent, StepEvent, Summary)):
            self._t0 = ev.t  # the source's first work (its status lines may be stamped elsewhere)
        if ev.t and isinstance(ev, (PrefillEvent, StepEvent, Summary)):
            self._now = ev.t
        match ev:
            case SettingsEvent():
                self._drafter = ev.drafter
            case PromptEvent():
                self._open[ev.request] = _Open(ev.title)
            case StepEvent():
                run = self._open.setdefault(ev.request, _Open(ev.request))
                run.steps += 1
                run.k_sum += ev.k
                run.batch_sum += max(ev.batch, 1)
                _count(run.hist, ev)
                if ev.drafter == "grammar":
                    run.grammar_drafted += ev.drafted
                    run.grammar_accepted += ev.accepted
            case Summary():
                run = self._open.pop(ev.request, _Open(ev.request))
                if not ev.request:  # one at a time: the next Summary without a prompt keeps the title
                    self._open[""] = _Open(run.title)
                reported = list(ev.acceptance_histogram)
                hist = reported or run.hist
                self.rows.append(RequestRow(
                    t=ev.t or self._now, since_start=max(0.0, (ev.t or self._now) - (self._t0 or self._now)),
                    title=run.title,
                    n_prompt=ev.n_prompt, n_generated=ev.n_generated, num_drafts=ev.num_drafts,
                    drafted=ev.num_draft_tokens, accepted=ev.num_accepted_tokens,
                    acceptance_length=1.0 + ev.num_accepted_tokens / ev.num_drafts if ev.num_drafts else None,
                    tokens_per_s=ev.tokens_per_s, drafter=ev.drafter or self._drafter, stop_reason=ev.stop_reason,
                    histogram=list(hist), histogram_from="server" if reported else "steps" if hist else "",
                    mean_k=run.k_sum / run.steps if run.steps else None,
                    mean_batch=run.batch_sum / run.steps if run.steps else None, calls=list(ev.calls),
                    grammar_drafted=run.grammar_drafted, grammar_accepted=run.grammar_accepted))

    def __len__(self) -> int:
        return len(self.rows)
