"""The speculative loop: draft -> verify in one target batch -> commit / roll back.

One call to `generate` decodes one prompt and yields events (see stats.py). Commands
arrive on a thread-safe queue and are applied between steps, never inside one, so a
step always runs with one consistent set of settings.
"""

from __future__ import annotations

import codecs
import dataclasses
import queue
import time
from typing import Callable, Iterator, Sequence

import numpy as np

from specdash.engine import commands as C
from specdash.engine.adaptive_draft import propose_adaptive
from specdash.engine.drafters.base import Drafter
from specdash.engine.experts import expert_info, expert_key
from specdash.engine.llm import LLM
from specdash.engine.settings import EngineSettings
from specdash.engine.stats import (
    Event,
    NoticeEvent,
    PrefillEvent,
    SettingsEvent,
    SpecCounters,
    StepEvent,
    Summary,
)
from specdash.engine.verify import process_logits, verify_greedy, verify_sampling
from specdash.errors import SpecdashError

class TargetReloadError(SpecdashError):
    """A target reload failed after the old model was closed; `target` is the model the
    session loaded back in its place, so generation can go on."""

    def __init__(self, message: str, target: LLM):
        super().__init__(message)
        self.target = target


K_LIMIT = 64  # a target batch of K+1 must fit n_batch; beyond ~32 nothing pays on CPU anyway


class Engine:
    def __init__(
        self,
        target: LLM,
        drafter: Drafter,
        settings: EngineSettings,
        *,
        drafter_factory: Callable[[str], Drafter] | None = None,
        reload_target: Callable[[int], LLM] | None = None,
        controller=None,
        detector=None,
    ):
        self.target = target
        self.drafter = drafter
        self.settings = settings
        self._make_drafter = drafter_factory
        self._reload_target = reload_target
        self.controller = controller  # adaptive K (controller.KController); used when settings.adaptive
        self.detector = detector  # content detector; labels steps when present
        self._queue: queue.Queue[C.Command] = queue.Queue()
        self.paused = False
        self.rng = np.random.default_rng(settings.sampling.seed)
        self.calibrate_steps = 0  # leading steps of the next generate() run at K=0 (plain reference)

    # --- commands -------------------------------------------------------------------
    def send(self, cmd: C.Command) -> None:
        """Thread-safe; applied before the next step."""
        self._queue.put(cmd)

    def settings_event(self) -> SettingsEvent:
        s = self.settings
        experts = expert_info(self.target, s.experts)  # active count, the file's own when not overridden
        return SettingsEvent(
            target=self.target.path.stem,
            drafter=getattr(self.drafter, "label", self.drafter.name),
            k=s.k,
            temperature=s.sampling.temperature,
            top_k=s.sampling.top_k,
            top_p=s.sampling.top_p,
            adaptive=s.adaptive,
            paused=self.paused,
            experts=experts[0] if experts else None,
            expert_count=experts[1] if experts else None,
        )

    def _apply(self, cmd: C.Command) -> Iterator[Event]:
        """Apply one command; refusals become notices and leave settings unchanged."""
        s = self.settings
        try:
            match cmd:
                case C.SetK(k):
                    if not 0 <= k <= K_LIMIT:
                        raise SpecdashError(f"K={k} refused: K must be between 0 and {K_LIMIT}")
                    s.k = k
                case C.SetDrafter(spec):
                    if self._make_drafter is None:
                        raise SpecdashError("this engine cannot swap drafters")
                    new = self._make_drafter(spec)  # raises SpecdashError when incompatible
                    self.drafter.close()
                    self.drafter = new
                    s.draft = spec
                    if self.controller:
                        self.controller.reset()
                case C.SetSampling(temperature, top_k, top_p):
                    t = s.sampling.temperature if temperature is None else temperature
                    tk = s.sampling.top_k if top_k is None else top_k
                    tp = s.sampling.top_p if top_p is None else top_p
                    if not (0 <= t <= 5 and tk >= 0 and 0 < tp <= 1):
                        raise SpecdashError(
                            f"sampling temperature={t} top_k={tk} top_p={tp} refused: "
                            "need 0 <= temperature <= 5, top_k >= 0, 0 < top_p <= 1"
                        )
                    s.sampling = dataclasses.replace(s.sampling, temperature=t, top_k=tk, top_p=tp)
                case C.SetAdaptive(on):
                    if on and self.controller is None:
                        raise SpecdashError("adaptive K is not available in this engine")
                    s.adaptive = on
                case C.SetExperts(n):
                    if self._reload_target is None:
                        raise SpecdashError("this engine cannot reload the target")
                    expert_key(self.target, n)  # refuse before announcing a reload
                    yield NoticeEvent("info", f"reloading target with {n} active experts...")
                    t0 = time.perf_counter()
                    try:
                        self.target = self._reload_target(n)
                    except TargetReloadError as exc:
                        self.target, self._needs_refeed = exc.target, True
                        raise
                    yield NoticeEvent("info", f"target reloaded with {n} active experts in "
                                      f"{time.perf_counter() - t0:.1f}s; re-feeding the transcript")
                    s.experts = n
                    self._needs_refeed = True
                    if self.controller:  # verify costs measured on the old model no longer hold
                        self.controller.reset(target_changed=True)
                case C.Pause():
                    self.paused = True
                case C.Resume():
                    self.paused = False
                case C.Stop():
                    self._stop = True
                    return
        except SpecdashError as exc:
            yield NoticeEvent("warning", str(exc))
            return
        yield self.settings_event()

    def _drain(self) -> Iterator[Event]:
        """Apply queued commands; while paused, block until resumed or stopped."""
        while True:
            try:
                cmd = self._queue.get(block=self.paused and not self._stop)
            except queue.Empty:
                return
            yield from self._apply(cmd)
            if self._stop or (not self.paused and self._queue.empty()):
                return

    # Batch sizes measured before adaptive mode's first decision: enough points for the
    # controller to interpolate a CPU's cost curve (nearly linear, with steps) or see a
    # GPU's flat one. One pass, ~25 single-token steps of work, once per session.
    COST_SIZES = (1, 2, 3, 5, 9, 17)

    def _measure_costs(self, tokens: list[int], n_past: int) -> Iterator[Event]:
        ctl, target = self.controller, self.target
        if not (self.settings.adaptive and ctl is not None and ctl.needs_costs()):
            return
        sizes = [n for n in self.COST_SIZES if n <= target.n_batch and n_past + n < target.n_ctx]
        ms: dict[int, float] = {}
        t0 = time.perf_counter()
        for n in sizes:
            junk = (tokens * n)[-n:]  # any valid tokens: only the time is kept
            t = time.perf_counter()
            target.decode(junk, n_past, logits="all")
            ms[n] = (time.perf_counter() - t) * 1e3
            target.kv_truncate(n_past)
        if not ms:
            return
        ctl.seed_costs(ms)
        unit = ms[sizes[0]]
        curve = ", ".join(f"{n}: {v / unit:.1f}x" for n, v in ms.items() if n > 1)
        yield NoticeEvent("info", f"adaptive K: measured target batch costs in "
                          f"{time.perf_counter() - t0:.1f}s (tokens: cost vs one token) {curve}")

    # --- the loop -------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_tokens: int) -> Iterator[Event]:
        target, s = self.target, self.settings
        if len(prompt) == 0:
            raise SpecdashError("the prompt is empty")
        if len(prompt) + 1 > target.n_ctx:
            raise SpecdashError(
                f"the prompt is {len(prompt)} tokens but the context holds {target.n_ctx}; "
                "use a shorter prompt or a larger --ctx"
            )
        self._stop = False
        self._needs_refeed = False
        # A Stop queued before this run started was meant for the previous run.
        pending = []
        while not self._queue.empty():
            cmd = self._queue.get_nowait()
            if not isinstance(cmd, C.Stop):
                pending.append(cmd)
        for cmd in pending:
            self._queue.put(cmd)
        target.clear()
        self.drafter.reset()
        if self.controller:
            self.controller.new_prompt()
        if self.detector is not None:  # the prompt's own class is the prior for the first tokens
            self.detector.reset(target.detokenize(prompt))
        yield self.settings_event()

        t0 = time.perf_counter()
        target.prefill(prompt[:-1])
        self.drafter.prefill(prompt)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        yield PrefillEvent(len(prompt) - 1, prefill_ms)

        tokens = list(prompt)  # committed: prompt + generated; tokens[-1] is not in the KV yet
        n_past = len(tokens) - 1
        yield from self._measure_costs(tokens, n_past)  # once per session, before the clock starts
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        text: list[str] = []
        counters = SpecCounters()
        generated = 0
        stop_reason = "max_tokens"
        calibrate = self.calibrate_steps
        decode_start = time.perf_counter()

        while generated < max_tokens:
            yield from self._drain()
            if self._stop:
                stop_reason = "stopped"
                break
            if self._needs_refeed:  # target reloaded (expert count): rebuild its KV
                target = self.target
                target.prefill(tokens[:-1])
                self._needs_refeed = False
            if n_past + 1 >= target.n_ctx:
                stop_reason = "context"
                break
            t_step = time.perf_counter()

            content = ""
            decision = ""
            if self.detector is not None:
                content = self.detector.label
            # Never draft past the context or the token budget: those tokens could not be kept.
            room = max(0, min(target.n_ctx - n_past - 2, max_tokens - generated - 1, target.n_batch - 1))
            adaptive = calibrate <= 0 and s.adaptive and self.controller is not None
            if adaptive:
                yield from self._measure_costs(tokens, n_past)  # adaptive switched on mid-run
                draft, k, decision = propose_adaptive(
                    self.drafter, tokens, self.controller, content, min(room, s.k_max), s.sampling, self.rng
                )
            else:
                if calibrate > 0:
                    k, decision = 0, "calibrating plain decoding"
                    calibrate -= 1
                else:
                    k = s.k
                k = min(k, room)
                # Called even at K=0: history-keeping drafters (suffix) must see every step.
                draft = self.drafter.propose(tokens, k, s.sampling, self.rng)
            draft = draft.cut(k)  # a drafter may not overrun K
            t_draft = time.perf_counter()

            logits = target.decode([tokens[-1], *draft.tokens], n_past, logits="all")
            if s.sampling.greedy:
                argmax = logits.argmax(axis=1)
                t_verify = time.perf_counter()
                n_acc, nxt = verify_greedy(argmax, draft.tokens)
            else:
                probs = process_logits(logits, s.sampling)
                t_verify = time.perf_counter()
                n_acc, nxt = verify_sampling(probs, draft.tokens, draft.probs, self.rng)

            if n_acc < len(draft.tokens):  # roll back the rejected positions
                target.kv_truncate(n_past + 1 + n_acc)
            n_past += 1 + n_acc
            committed = [*draft.tokens[:n_acc], nxt]
            from_draft = [True] * n_acc + [False]
            tokens.extend(committed)

            # End of generation can fall inside the accepted run: cut there.
            for i, tok in enumerate(committed):
                if target.is_eog(tok):
                    committed, from_draft = committed[:i], from_draft[:i]
                    stop_reason = "eos"
                    break
            if generated + len(committed) > max_tokens:
                committed = committed[: max_tokens - generated]
                from_draft = from_draft[: len(committed)]
            generated += len(committed)
            pieces = [utf8.decode(target.piece(t)) for t in committed]
            text.extend(pieces)
            if self.detector is not None:
                self.detector.update("".join(pieces))

            t_end = time.perf_counter()
            ev = StepEvent(
                step=counters.steps + 1,
                k=k,
                drafter=draft.source if draft.tokens else "none",
                drafted=len(draft.tokens),
                accepted=n_acc,
                tokens=committed,
                pieces=pieces,
                from_draft=from_draft,
                draft_ms=(t_draft - t_step) * 1e3,
                verify_ms=(t_verify - t_draft) * 1e3,
                other_ms=(t_end - t_verify) * 1e3,
                n_past=n_past,
                n_generated=generated,
                t=t_end,
                content=content,
                adaptive=s.adaptive,
                decision=decision,
            )
            counters.add(ev)
            if self.controller is not None:
                self.controller.observe(
                    k, ev.drafted, n_acc, ev.draft_ms - draft.prep_ms, ev.verify_ms, ev.other_ms,
                    content, evidence=draft.evidence, source=draft.source,
                )
            yield ev
            if stop_reason == "eos":
                break
        decode_s = time.perf_counter() - decode_start
        text.append(utf8.decode(b"", final=True))
        yield Summary(
            text="".join(text),
            stop_reason=stop_reason,
            n_prompt=len(prompt),
            n_generated=generated,
            num_drafts=counters.num_drafts,
            num_draft_tokens=counters.num_draft_tokens,
            num_accepted_tokens=counters.num_accepted_tokens,
            num_accepted_tokens_per_pos=list(counters.per_pos_accepted),
            acceptance_rate=counters.acceptance_rate,
            mean_accepted_length=counters.mean_accepted_length,
            tokens_per_s=generated / decode_s if decode_s > 0 else 0.0,
            prefill_tokens_per_s=(len(prompt) - 1) / (prefill_ms / 1e3) if prefill_ms > 0 else 0.0,
            prefill_ms=prefill_ms,
            decode_s=decode_s,
            draft_ms=counters.draft_ms,
            verify_ms=counters.verify_ms,
            other_ms=counters.other_ms,
            steps=counters.steps,
        )
