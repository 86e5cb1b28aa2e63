"""The known greedy text a what-if works on, and what teacher forcing says about it.

From a prompt: the real engine generates it once at K=0 (plain greedy decoding). From a
recording made at temperature 0: the text is already there. Then one batched pass of
the draft model over prompt + text gives its argmax at every position (what it would
draft on the true prefix), and one of the target gives the top-two gap everywhere
(where a batch's rounding could flip a near-tie and the real run's text diverge).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specdash.contract import events as E
from specdash.engine.drafters.draft_model import JointCut, top_prob
from specdash.engine.llm import LLM
from specdash.engine.settings import K_CAP, EngineSettings
from specdash.engine.step_rules import Limits
from specdash.contract.errors import SpecdashError
from specdash.tuning.whatif.head import HeadChains, head_chains

Say = Callable[[str], None]
TIE_GAP = 0.5  # logits; the exactness tests' threshold (tests/test_engine_exact.py)
_CHUNK = 64  # rows of logits per teacher-forced batch (64 x 151k floats = 39 MB)
OFF_TEXT_DEPTH = K_CAP - 1  # what a draft of K <= K_CAP holds after its first wrong token, at most


@dataclass
class Forced:
    """A model's teacher-forced predictions: row j is what it predicts for seq[j] after
    prompt + seq[:j]; one row more than seq (after the whole text)."""

    argmax: np.ndarray  # int
    top_p: np.ndarray  # probability of the argmax
    gap: np.ndarray  # top-two logit gap
    # A draft model only (off_text): after each position j where its argmax is not the
    # text's token, the top probabilities of its own greedy continuation from that wrong
    # token on, as far as a confidence cut could let a draft run. None: not computed.
    off_text: dict[int, np.ndarray] | None = None


@dataclass
class Transcript:
    prompt: list[int]
    seq: list[int]  # generated tokens, then the end-of-generation token if the run ended on one
    n_generated: int  # tokens counted as generated (the EOS token is not)
    eos: bool
    max_tokens: int
    n_ctx: int
    n_batch: int
    pieces: list[bytes]  # bytes of each seq token
    prompt_text: str  # the prompt as text, the content detector's prior
    target: str
    plain: dict[str, float] = field(default_factory=dict)  # the plain run, measured
    draft: Forced | None = None
    draft_name: str | None = None
    draft_relative_cost: float | None = None  # what the session prices a drafted token at
    target_forced: Forced | None = None
    n_vocab: int | None = None  # the target's; None: not checked
    # The longest draft the target's rollback takes back (Strategy.max_draft; None: any):
    # 0 where llama.cpp takes nothing back, n_rs_seq for snapshots without a checkpoint.
    # Read from whatif's own context, created with snapshots for k_max as a run's is for
    # max(k, k_max): on a target with snapshots and no checkpoint a simulated K above k_max
    # is capped where a run at that K could have had more snapshots.
    max_draft: int | None = None
    head: HeadChains | None = None  # the target's MTP head drafting from every position (whatif/head.py)
    head_why: str = ""  # why there is none, where the target has no head that can draft

    @property
    def limits(self) -> Limits:
        """What bounds a draft on the target, as the engine's step sees it."""
        return Limits(self.n_ctx, self.n_batch, self.n_vocab, self.max_draft)

    @property
    def full(self) -> list[int]:
        return self.prompt + self.seq

    def near_ties(self) -> dict[str, list[int]]:
        """Text positions where a model's top-two gap is below TIE_GAP: there a batch of
        another size may round the other way (target: the text; draft: a proposal)."""
        out: dict[str, list[int]] = {}
        for name, f in (("target", self.target_forced), ("draft", self.draft)):
            if f is not None:
                out[name] = [int(j) for j in np.nonzero(f.gap[: len(self.seq)] < TIE_GAP)[0]]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "draft": self.draft_name, "n_prompt": len(self.prompt),
                "n_generated": self.n_generated, "eos": self.eos, "max_tokens": self.max_tokens,
                "plain": self.plain, "near_ties": self.near_ties()}


def teacher_force(llm: LLM, prompt: Sequence[int], seq: Sequence[int]) -> Forced:
    """One batched pass over prompt + seq; rows for every position after the prompt."""
    llm.clear()
    llm.prefill(list(prompt[:-1]))
    feed = [prompt[-1], *seq]
    start = len(prompt) - 1
    arg, top, gap = [], [], []
    chunk = min(_CHUNK, llm.n_batch)
    for i in range(0, len(feed), chunk):
        part = feed[i : i + chunk]
        logits = llm.decode(part, start + i, logits="all").astype(np.float64)
        two = np.partition(logits, -2, axis=1)[:, -2:]
        m = two[:, 1]
        arg.append(logits.argmax(axis=1))
        gap.append(two[:, 1] - two[:, 0])
        top.append(1.0 / np.exp(logits - m[:, None]).sum(axis=1))
    llm.clear()
    return Forced(np.concatenate(arg), np.concatenate(top), np.concatenate(gap))


def follows_off_text(llm: LLM, p_min: float, p_joint: float) -> bool:
    """Whether off_text follows this draft model: only under a confidence cut (without
    one nothing it decides depends on it), and not for a recurrent model (its state
    cannot be cut back to branch at each wrong token)."""
    return (p_min > 0 or p_joint > 0) and llm.strategy.kind == "kv"


def off_text(llm: LLM, prompt: Sequence[int], seq: Sequence[int], forced: Forced, p_min: float,
             p_joint: float, depth: int) -> dict[int, np.ndarray] | None:
    """Forced.off_text: what the draft model's confidence is once its draft has left the
    text. A draft that is wrong at position j has the context prompt + seq[:j] + its own
    token there, wherever it started (every token before j matched the text), so its
    continuation is a function of j alone: decoded here one token per pass, as the
    drafter decodes it, until the confidence cuts would stop any draft through j (a
    token under p_min, or the product from j on under p_joint) or `depth` tokens. Only
    what a cut decides depends on it (how many rejected tokens a draft holds); None where
    it is not followed (follows_off_text)."""
    if not follows_off_text(llm, p_min, p_joint):
        return None
    feed = [prompt[-1], *seq]
    base = len(prompt) - 1  # the position of feed[0]
    llm.clear()
    llm.prefill(list(prompt[:-1]))
    fed = 0
    out: dict[int, np.ndarray] = {}
    for j in range(len(seq)):
        tok = int(forced.argmax[j])
        if tok == seq[j]:
            continue
        if fed < j + 1:
            llm.prefill(feed[fed : j + 1], base + fed)
            fed = j + 1
        # The cut as the drafter runs it, from a draft starting at j: the one through j
        # that stops latest. A wrong token the cut refuses is never drafted: nothing follows.
        cut = JointCut(p_min, p_joint)
        probs: list[float] = []
        if not cut.stop(float(forced.top_p[j])):
            for m in range(depth):
                row = llm.decode([tok], base + j + 1 + m, logits="last")[0]
                probs.append(top_prob(row))
                tok = int(row.argmax())
                if cut.stop(probs[-1]):
                    break
            llm.kv_truncate(base + j + 1)
        out[j] = np.array(probs)
    llm.clear()
    return out


def _pieces(target: LLM, seq: Sequence[int]) -> list[bytes]:
    return [target.piece(t) for t in seq]


def plain_stats(steps: list[E.StepEvent], summary: E.Summary) -> dict[str, float]:
    n = max(len(steps), 1)
    inner = sum(s.draft_ms + s.verify_ms for s in steps)
    return {"tokens_per_s": summary.tokens_per_s, "steps": float(len(steps)), "decode_s": summary.decode_s,
            "verify_ms_mean": sum(s.verify_ms for s in steps) / n,
            "verify_ms_median": statistics.median(s.verify_ms for s in steps) if steps else 0.0,
            # Everything a step costs outside drafting and the target batch: commit,
            # detokenize, the detector, the loop and its consumer.
            "overhead_ms": max(summary.decode_s * 1e3 - inner, 0.0) / n}


def from_prompt(settings: EngineSettings, prompt: str, model: str | None, say: Say,
                progress: Callable[[str, float | None], None] | None = None,
                head_depth: int = 0) -> tuple[Transcript, Any]:
    """Generate the plain greedy text with the real engine at K=0. Returns the transcript
    and the Session (its target and draft model stay loaded for `--profile here`)."""
    from specdash.sources.session import Session

    if not settings.sampling.greedy:
        raise SpecdashError(f"--temp {settings.sampling.temperature:g}: whatif needs greedy "
                            "decoding (temperature 0): only then is the text the same whatever drafts it")
    plain = settings.replace(draft="none", k=0, adaptive=False)
    say(f"loading {settings.target}")
    session = Session(plain, progress=progress)
    try:
        model, draft_llm, rel = session_draft_model(session, model, say)
        tokens = session.prompt_tokens(prompt)
        say(f"generating the plain greedy text ({settings.max_tokens} tokens at most, K=0)")
        steps: list[E.StepEvent] = []
        summary = None
        for ev in session.engine.generate(tokens, settings.max_tokens):
            if isinstance(ev, E.StepEvent):
                steps.append(ev)
            elif isinstance(ev, E.Summary):
                summary = ev
        assert summary is not None
        text = [t for s in steps for t in s.tokens]
        tr = over_text(session.target, tokens, text, summary.stop_reason, settings, say, draft_llm, model)
        tr.plain = plain_stats(steps, summary)
        tr.draft_relative_cost = rel
        tr.prompt_text = session.target.detokenize(tokens)
        attach_head(tr, session, head_depth, say)
        return tr, (session, draft_llm)
    except BaseException:
        session.close()
        raise


def model_spec(settings: EngineSettings) -> str | None:
    """The draft model whatif simulates (its "model" drafter, and the one auto and chain
    draft with): the one --draft names, else --draft-model's; "default" is resolved as the
    session resolves it, once the target is loaded (session_draft_model). None: no model."""
    from specdash.engine.drafters import is_model

    if is_model(settings.draft):
        return settings.draft
    return None if settings.draft_model == "none" else settings.draft_model


def session_draft_model(session: Any, model: str | None, say: Say
                        ) -> tuple[str | None, LLM | None, float | None]:
    """(its name, the session's draft model (loaded and checked against the target as for
    a run), the relative cost it prices a drafted token at). `model` "default": the one
    auto would draft with (Session.chain_model_spec), if any."""
    if model == "default":
        model = session.chain_model_spec()
        if model == "mtp":
            model = None  # the target's own head is auto's and the chain's model (Transcript.head)
        elif model is None:
            say("no draft model: the default pair's draft is not cached or does not share the target's vocabulary")
    if model is None:
        return None, None, None
    say(f"loading draft model {model}")
    lent = session.make_drafter(model)
    inner: Any = getattr(lent, "inner", lent)  # the session lends it wrapped (Borrowed)
    return model, inner.llm, inner.relative_cost


def over_text(target: LLM, prompt: list[int], text: list[int], stop: str, settings: EngineSettings, say: Say,
              draft_llm: LLM | None, model: str | None) -> Transcript:
    """The transcript of a known generated text (`text`: token ids, no end token; `stop`:
    how it ended), target and draft model teacher-forced over it. Also used to judge a
    prediction on the text a real speculative run produced (benchmarks/whatif_accuracy.py)."""
    say(f"teacher-forcing the target over {len(text)} tokens (near-ties)")
    tf = teacher_force(target, prompt, text)
    seq = list(text)
    eos = stop == "eos" and target.is_eog(int(tf.argmax[len(text)]))
    if eos:
        seq.append(int(tf.argmax[len(text)]))
    forced = None
    if draft_llm is not None:
        say(f"teacher-forcing the draft model {model} over {len(seq)} tokens")
        forced = teacher_force(draft_llm, prompt, seq)
        if follows_off_text(draft_llm, settings.draft_p_min, settings.draft_p_joint):
            wrong = int((forced.argmax[: len(seq)] != np.asarray(seq)).sum())
            say(f"following the draft model's own continuation after its {wrong} wrong tokens (its confidence cut)")
            forced.off_text = off_text(draft_llm, prompt, seq, forced, settings.draft_p_min,
                                       settings.draft_p_joint, OFF_TEXT_DEPTH)
    return Transcript(prompt=prompt, seq=seq, n_generated=len(text), eos=eos,
                      max_tokens=settings.max_tokens if stop != "max_tokens" else len(text),
                      n_ctx=target.n_ctx, n_batch=target.n_batch, pieces=_pieces(target, seq),
                      prompt_text=target.detokenize(prompt), target=settings.target,
                      draft=forced, draft_name=model, target_forced=tf, n_vocab=target.n_vocab,
                      max_draft=target.strategy.max_draft)


def from_recording(path: str, settings: EngineSettings, given: set[str], model: str | None, say: Say,
                   progress: Callable[[str, float | None], None] | None = None,
                   head_depth: int = 0) -> tuple[Transcript, Any]:
    """The first prompt of a recording made by `specdash run --record` at temperature 0.
    `given`: the engine flags the user gave (they override the recording's settings)."""
    from specdash.records.recording import read_recording
    from specdash.sources.session import Session

    rec = read_recording(path)
    prompt_text = rec.header.get("prompt")
    if not isinstance(prompt_text, str):
        raise SpecdashError(f"--recording {path}: the header has no prompt (record it with "
                            "`specdash run --record FILE`)")
    first = next((ev for ev in rec.events if isinstance(ev, E.SettingsEvent)), None)
    if first is None:
        raise SpecdashError(f"--recording {path}: no settings line; not a run recording")
    temps = {ev.temperature for ev in rec.events if isinstance(ev, E.SettingsEvent)}
    if any(t is None or t > 0 for t in temps):
        shown = ", ".join("?" if t is None else f"{t:g}" for t in sorted(temps, key=lambda t: t or 0))
        raise SpecdashError(f"--recording {path}: recorded at temperature {shown}; whatif needs a greedy "
                            "recording (temperature 0): only then is the text the same whatever drafts it")
    steps: list[E.StepEvent] = []
    summary = None
    n_prefill = None
    for ev in rec.events:
        if isinstance(ev, E.PrefillEvent) and n_prefill is None:
            n_prefill = ev.n_tokens
        elif isinstance(ev, E.StepEvent):
            steps.append(ev)
        elif isinstance(ev, E.Summary):
            summary = ev
            break
    if summary is None or not steps:
        raise SpecdashError(f"--recording {path}: no finished run in it ({rec.problem or 'no summary line'})")
    changes: dict[str, Any] = {"draft": "none", "k": 0, "adaptive": False}
    if "target" not in given:
        changes["target"] = first.target_path or first.target
    for key in ("raw", "ctx", "max_tokens"):
        value = getattr(first, key)
        if key not in given and value is not None:
            changes[key] = value
    plain = settings.replace(**changes)
    say(f"loading {plain.target}")
    session = Session(plain, progress=progress)
    try:
        model, draft_llm, rel = session_draft_model(session, model, say)
        tokens = session.prompt_tokens(prompt_text)
        if n_prefill is not None and n_prefill != len(tokens) - 1:
            raise SpecdashError(f"--recording {path}: its prompt was {n_prefill + 1} tokens, this target "
                                f"makes {len(tokens)}: record and replay with the same target and --raw")
        text = [t for s in steps for t in s.tokens]
        tr = over_text(session.target, tokens, text, summary.stop_reason, plain, say, draft_llm, model)
        tr.plain = plain_stats(steps, summary)
        tr.draft_relative_cost = rel
        attach_head(tr, session, head_depth, say)
        return tr, (session, draft_llm)
    except BaseException:
        session.close()
        raise


def attach_head(tr: Transcript, session: Any, depth: int, say: Say) -> None:
    """tr.head: the session target's MTP head drafting from every position of the text,
    up to `depth` tokens (0: not wanted); else tr.head_why says why there is none."""
    if depth <= 0:
        return
    why = session.mtp_unavailable()
    if why is None:
        try:
            head = session.make_drafter("mtp")
        except SpecdashError as exc:
            why = str(exc)
        else:
            tr.head = head_chains(head, session.target, tr.prompt, tr.seq, depth, session.mtp_relative_cost, say)
            return
    tr.head_why = why.removeprefix("mtp unavailable: ")

