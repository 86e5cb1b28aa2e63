"""Simulated runs over a known greedy text: the engine's step (engine.Engine.step), with
the target's verify replaced by a comparison against the text and every clock by a cost.
Everything else a step decides comes from the engine's own rules (engine/step_rules.py:
the room and caps of a draft, the commit, what adaptive K is told) and its own drafting
(adaptive_draft.propose).

Exactness: under greedy decoding the target accepts a draft exactly up to its first
token that differs from the text, so the accepted counts are those of a real run at the
same settings. The model-free drafters are the engine's own classes fed the same token
history; the draft model is replaced by its teacher-forced argmax (SimDraftModel), which
is what it drafts as long as its own context is the true prefix, i.e. up to the first
rejected token. Adaptive K runs the engine's own propose_adaptive and controller.

A draft running past the end-of-generation token counts as accepted up to and including
it, as in the engine (the text after it is no text of the run). With a confidence cut
(draft_p_joint, draft_p_min), what the draft model drafts after its first wrong token
is cut by its own confidence there: transcript.off_text decodes its continuation from
that token, as the drafter does. Where that was not followed (a recurrent draft model,
a draft past the end of the text) the text's confidence stands in. Only the count of
rejected tokens drafted after that point can differ, never what is accepted.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specdash.engine import step_rules as rules
from specdash.engine.adaptive_draft import propose
from specdash.engine.ask_backoff import AskBackoff
from specdash.engine.controller import KController
from specdash.engine.detector import ContentDetector
from specdash.engine.drafters.base import Borrowed, Draft, Drafter, NoDrafter, model_price
from specdash.engine.drafters.draft_model import JointCut, common_prefix
from specdash.engine.drafters.kinds import KINDS, Parts
from specdash.engine.drafters.suffix import SuffixDrafter
from specdash.engine.settings import EngineSettings, SamplingParams
from specdash.contract.errors import SpecdashError
from specdash.tuning.whatif.head import SimMtpHead
from specdash.sources.session import draft_label
from specdash.costs.profile import Profile
from specdash.tuning.whatif.transcript import Forced, Transcript

GREEDY = SamplingParams(temperature=0.0)
# Kinds whose fixed K is another kind's: at a fixed K `auto` has no prices to choose by
# and drafts as the chain does (drafters/auto.py), so only its adaptive run is its own.
ADAPTIVE_ONLY = frozenset({"auto"})


@dataclass
class Replay:
    """Costs observed in a real run, replayed step by step instead of the profile's (to
    check that the controller decides here as it did in the engine): per step
    (draft_ms as the controller saw it, verify_ms, other_ms), the catch-up each choose()
    was offered, the batch costs seeded at calibration and the time of each copy source's
    ask (the back-off's decisions rest on them)."""

    steps: list[tuple[float, float, float]]
    catch_up: list[float] = field(default_factory=list)
    seed: dict[int, float] | None = None
    price: float | None = None
    asks: list[float] | None = None  # the ms of each copy-source ask, in order (AskBackoff.asked)


class TimedFree:
    """A model-free drafter (lookup, suffix) with the time of its proposals counted:
    the profile's `free_ms` per proposal when it has one, else this machine's time."""

    def __init__(self, inner: Drafter, fixed_ms: float | None):
        self.inner = inner
        self.name, self.label, self.free = inner.name, inner.label, inner.free
        self.relative_cost = inner.relative_cost
        self.fixed_ms = fixed_ms
        self.spent = 0.0
        self.prep = 0.0

    @property
    def k_ceiling(self) -> bool:
        return self.inner.k_ceiling

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        t = time.perf_counter()
        draft = self.inner.propose(tokens, k, sampling, rng)
        if self.fixed_ms is None:
            self.spent += (time.perf_counter() - t) * 1e3
        elif k > 0:
            self.spent += self.fixed_ms
        return draft

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return 0.0

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0

    def prefill(self, tokens: Sequence[int]) -> None:
        self.inner.prefill(tokens)

    def reset(self) -> None:
        self.inner.reset()

    def forget(self) -> None:
        self.inner.forget()

    def set_cut(self, p_joint: float) -> None:
        self.inner.set_cut(p_joint)

    def close(self) -> None:
        self.inner.close()


class SimDraftModel:
    """engine.drafters.draft_model.DraftModelDrafter with its forward passes replaced by
    the teacher-forced argmax and the profile's costs: the same KV bookkeeping (what it
    must feed before drafting, what it sat out), so the same catch-up."""

    name = "draft"
    free = False

    def __init__(self, tr: Transcript, forced: Forced, profile: Profile, label: str,
                 p_min: float = 0.0, replay: Replay | None = None, p_joint: float = 0.0):
        self.forced, self.profile, self.label, self.p_min = forced, profile, label, p_min
        self.p_joint = p_joint
        self.seq, self.n_prompt = tr.seq, len(tr.prompt)
        self.relative_cost = profile.draft_price()
        self.replay = replay
        self._kv: list[int] = []
        self._committed = 0
        self._catch_up = 0.0  # per token, as last "measured" (the real drafter's EMA)
        self._choices = 0
        self.spent = 0.0
        self.prep = 0.0
        self.prompt_feed_ms = 0.0  # the prompt fed in the prefill (none when auto feeds it lazily)

    @property
    def k_ceiling(self) -> bool:
        return self.p_joint > 0  # as the real drafter's

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def _common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix(self._kv, tokens, self._committed)  # the real drafter's own rule

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        if self.replay is not None:
            i = self._choices
            self._choices += 1
            return self.replay.catch_up[i] if i < len(self.replay.catch_up) else 0.0
        return self._behind(tokens) * self._catch_up

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0 if self.replay is not None or self._catch_up > 0 else self._behind(tokens)

    def _behind(self, tokens: Sequence[int]) -> int:
        return max(len(tokens) - self._common_prefix(tokens) - 2, 0)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        if k <= 0:
            return Draft.empty(self.name)
        n = self._common_prefix(tokens)
        if n == len(tokens):
            n -= 1
        del self._kv[n:]
        m = len(tokens) - n
        self._kv.extend(tokens[n:])
        self._committed = len(tokens)
        feed_ms = self.profile.feed_ms(m)
        extra = max(m - 2, 0)
        prep = feed_ms / m * extra
        if extra:
            per = feed_ms / m
            self._catch_up = per if self._catch_up == 0 else self._catch_up + 0.25 * (per - self._catch_up)
        out: list[int] = []
        on_text = True
        left = -1  # the text position of its first wrong token
        decodes = 0
        j0 = len(tokens) - self.n_prompt  # text position of the first drafted token
        argmax, top, off = self.forced.argmax, self.forced.top_p, self.forced.off_text
        cut = JointCut(self.p_min, self.p_joint)
        for i in range(k):
            j = j0 + i
            if on_text and j < len(argmax):
                tok = int(argmax[j])
                if cut.active and cut.stop(float(top[j])):
                    break
            else:
                tok = -1 - i  # its context left the text: unknown, and rejected anyway
                own = off.get(left) if off is not None else None
                if own is not None and j - left - 1 < len(own):
                    # Its own continuation's confidence, decoded after its wrong token.
                    if cut.stop(float(own[j - left - 1])):
                        break
                # Not followed (no cut, past the text, a recurrent draft): the text's
                # confidence stands in (p_joint only).
                elif self.p_joint > 0 and cut.stop(float(top[j]) if j < len(top) else 1.0):
                    break
            if on_text and (j >= len(self.seq) or tok != self.seq[j]):
                on_text, left = False, j
            out.append(tok)
            if i + 1 < k:
                decodes += 1
                self._kv.append(tok)
        self.spent += feed_ms + decodes * self.profile.draft_ms
        self.prep += prep
        return Draft(out, None, self.name, prep_ms=prep)

    def prefill(self, tokens: Sequence[int]) -> None:
        self._kv[:] = tokens[:-1]
        self._committed = len(self._kv)
        # The real drafter decodes the prompt in one batch here, before the first token.
        self.prompt_feed_ms = self.profile.feed_ms(len(self._kv))

    def reset(self) -> None:
        self._kv.clear()
        self._committed = 0
        self.prompt_feed_ms = 0.0

    def forget(self) -> None:
        pass

    def set_cut(self, p_joint: float) -> None:
        self.p_joint = p_joint

    def close(self) -> None:
        pass


@dataclass
class SimResult:
    drafter: str
    k: int | None  # None: adaptive
    steps: int = 0
    generated: int = 0
    drafts: int = 0  # steps that drafted something
    drafted: int = 0
    accepted: int = 0
    ms: float = 0.0
    # The draft model's feed of the prompt in the prefill: decoding's tok/s leaves it out,
    # as a real run's does, but a user waits for it. auto feeds its model the prompt
    # lazily, inside decoding (in ms), and only if it chooses the model.
    prompt_feed_ms: float = 0.0
    per_class: dict[str, list[float]] = field(default_factory=dict)  # label -> [tokens, ms]
    trace: list[tuple[int, int, int, str, str]] = field(default_factory=list)  # per step (k, drafted, accepted, decision, source)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / (self.ms / 1e3) if self.ms > 0 else 0.0

    @property
    def tokens_per_s_with_feed(self) -> float:
        """tok/s over decoding and the draft model's prompt feed: what a choice of drafter
        costs from the target's prefill to the last token (the target's own prefill is the
        same for every choice and left out). The figure auto is judged by."""
        ms = self.ms + self.prompt_feed_ms
        return self.generated / (ms / 1e3) if ms > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float:
        return 1 + self.accepted / self.drafts if self.drafts else 1.0

    def to_json(self, trace: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "drafter": self.drafter, "k": "adaptive" if self.k is None else self.k,
            "tokens_per_s": self.tokens_per_s, "acceptance_rate": self.acceptance,
            "mean_accepted_length": self.mean_accepted_length, "steps": self.steps,
            "generated": self.generated, "drafts": self.drafts, "drafted": self.drafted,
            "accepted": self.accepted, "ms": self.ms, "prompt_feed_ms": self.prompt_feed_ms,
            "tokens_per_s_with_feed": self.tokens_per_s_with_feed,
            "per_class": {label: {"tokens": t, "ms": ms, "tokens_per_s": t / ms * 1e3 if ms else 0.0}
                          for label, (t, ms) in self.per_class.items()},
        }
        if trace:
            out["ks"] = [t[0] for t in self.trace]
        return out


def make_drafter(kind: str, tr: Transcript, profile: Profile, settings: EngineSettings,
                 replay: Replay | None = None) -> Drafter:
    """The drafter a session would build for `kind` (a kind of the registry, built from
    simulated parts, or else the draft model), its model part simulated."""
    fixed = profile.free_ms

    # Wrapped as Session.make_drafter wraps them (Borrowed: the session lends its draft
    # model and suffix memory), so what the engine sees through the loan, this sees too.
    def model() -> Drafter:
        assert tr.draft is not None and tr.draft_name is not None
        return Borrowed(SimDraftModel(tr, tr.draft, profile, draft_label(tr.draft_name), settings.draft_p_min,
                                      replay, settings.draft_p_joint))

    def head() -> Drafter:
        if tr.head is None:
            raise SpecdashError(f"mtp unavailable: {tr.head_why or 'the target has no MTP head'}")
        return Borrowed(SimMtpHead(tr.head, len(tr.prompt), profile, settings.draft_p_min, settings.draft_p_joint))

    if kind in KINDS:
        return KINDS[kind].build(Parts(
            settings, free=lambda drafter: TimedFree(drafter, fixed),
            suffix=lambda: Borrowed(TimedFree(SuffixDrafter(), fixed)),
            # As a session's auto and chain: the draft model named, else the target's own head.
            model=lambda: model() if tr.draft is not None else (head() if tr.head is not None else None),
            head=head))
    return model()


def simulate(tr: Transcript, drafter: Drafter, profile: Profile, settings: EngineSettings, *,
             name: str, k: int | None = None, controller: KController | None = None,
             replay: Replay | None = None) -> SimResult:
    """One run over the known text: fixed K (k) or adaptive (controller), as the engine
    would run it with `settings` (k_max, sampling). The step's rules are the engine's own
    (step_rules); only the verify (a comparison with the text) and the clock (the
    profile) are simulated."""
    assert (k is None) != (controller is None)
    res = SimResult(name, k)
    seq, max_tokens, limits = tr.seq, tr.max_tokens, tr.limits
    # The text's end-of-generation token, if it ended on one: the only one in it.
    end = seq[tr.n_generated] if tr.eos else None
    tokens = list(tr.prompt)
    detector = ContentDetector()
    detector.reset(tr.prompt_text)
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    drafter.reset()
    drafter.prefill(tokens)
    # The parts that count their own simulated cost (TimedFree, SimDraftModel).
    parts: list[Any] = [p if hasattr(p, "spent") else getattr(p, "inner", p) for p in drafter.parts()]
    parts = [p for p in parts if hasattr(p, "spent")]
    res.prompt_feed_ms = sum(getattr(part, "prompt_feed_ms", 0.0) for part in parts)
    if controller is not None:
        controller.new_prompt()
        price, ceiling = model_price(drafter)
        controller.price_draft(replay.price if replay is not None else price, ceiling)
        sizes = rules.cost_sizes(limits, len(tokens) - 1, settings.k_max)  # as the engine calibrates
        if replay is None and (profile.restore_ms or profile.replay_ms):
            # A checkpoint target: the engine's calibration prices its rollback apart
            # (Engine._measure_costs); no save cost is profiled.
            controller.price_rollback(0.0, profile.restore_ms, {n: profile.replay_ms * n for n in sizes})
        if controller.needs_costs():
            if replay is not None and replay.seed is not None:
                controller.seed_costs(replay.seed)
            elif replay is None:
                controller.seed_costs({n: profile.verify_ms(n) for n in sizes})
    p = 0
    asks = AskBackoff(replayed=replay.asks if replay is not None else None)
    while res.generated < max_tokens:
        n_past = len(tokens) - 1
        if n_past + 1 >= tr.n_ctx:
            break
        room = rules.room(limits, n_past, res.generated, max_tokens)
        content = detector.label
        for part in parts:
            part.spent = part.prep = 0.0
        cap = rules.k_cap(room, adaptive=controller is not None, k=k or 0, k_max=settings.k_max)
        draft, kk, decision = propose(drafter, tokens, cap, controller, content, GREEDY, None,
                                      horizon=max_tokens - res.generated, asks=asks)  # the engine's back-off
        draft = rules.fit(draft, kk, limits)
        drafted = len(draft.tokens)
        # Verify: greedy, the target accepts the draft up to its first token off the text.
        acc = 0
        while acc < drafted and p + acc < len(seq) and draft.tokens[acc] == seq[p + acc]:
            acc += 1
        done = rules.commit(draft.tokens, acc, seq[p + acc] if p + acc < len(seq) else None,
                            lambda tok: tok == end, res.generated, max_tokens)
        # A checkpoint target restores its state and replays the kept tokens after a rejection.
        restore_ms = profile.restore_ms + profile.replay_ms * (acc + 1) if acc < drafted else 0.0
        cost = rules.StepCost(draft_ms=sum(part.spent for part in parts), verify_ms=profile.verify_ms(drafted + 1),
                              other_ms=profile.overhead_ms + restore_ms, catch_up_ms=sum(part.prep for part in parts),
                              restore_ms=restore_ms)
        if replay is not None:  # the costs the engine's controller saw, as it saw them
            observed = replay.steps[res.steps] if res.steps < len(replay.steps) else (0.0, 0.0, 0.0)
            cost = rules.StepCost(*observed)
        tokens.extend(done.kept)
        pieces = [utf8.decode(tr.pieces[p + i]) for i in range(len(done.tokens))]
        detector.update("".join(pieces))
        step_ms = cost.draft_ms + cost.verify_ms + cost.other_ms
        res.steps += 1
        res.generated += len(done.tokens)
        res.ms += step_ms
        res.drafted += drafted
        res.accepted += done.accepted
        res.drafts += drafted > 0
        cls = res.per_class.setdefault(content or "text", [0.0, 0.0])
        cls[0] += len(done.tokens)
        cls[1] += step_ms
        res.trace.append((kk, drafted, done.accepted, decision, rules.drafted_by(draft)))
        if controller is not None:
            rules.observation(kk, draft, done.accepted, cost, content).tell(controller)
        p += len(done.kept)
        if done.eos or p >= len(seq):
            break
    return res


def sweep(tr: Transcript, kinds: Sequence[str], ks: Sequence[int], profile: Profile,
          settings: EngineSettings, make_controller: Callable[[], KController],
          say: Callable[[str], None] = lambda s: None) -> tuple[SimResult, list[SimResult], list[SimResult]]:
    """(plain, every (drafter, K) at fixed K, adaptive per drafter). `auto` is simulated
    adaptive only (ADAPTIVE_ONLY)."""
    plain = simulate(tr, NoDrafter(), profile, settings, name="none", k=0)
    fixed: list[SimResult] = []
    adaptive: list[SimResult] = []
    for kind in kinds:
        label = kind if kind in KINDS else tr.draft_name
        t0 = time.perf_counter()
        mine = [] if kind in ADAPTIVE_ONLY else ks
        for k in mine:
            fixed.append(simulate(tr, make_drafter(kind, tr, profile, settings), profile, settings,
                                  name=label or kind, k=k))
        adaptive.append(simulate(tr, make_drafter(kind, tr, profile, settings), profile, settings,
                                 name=label or kind, controller=make_controller()))
        say(f"simulated {label}: " + (f"K={min(mine)}..{max(mine)} and " if mine else "") +
            f"adaptive in {time.perf_counter() - t0:.1f}s")
    return plain, fixed, adaptive
