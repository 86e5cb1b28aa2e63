"""The batched step: every active request's last token and draft in one target batch.

The same rules as the one-request step (engine.Engine.step, step_rules): draft, verify,
commit the accepted prefix and the target's own token, take back the rest. What differs:
each request is a sequence of its own (a KV cache row set per sequence, cut back with
`kv_truncate(n, seq)`), every request's K is chosen together (plan.py), and a request
joins or leaves between steps without stopping the others.

A request alone in the batch, on sequence 0, runs the engine's own step (Engine.step):
with one sequence the batch's best K is the one-request controller's, and that step has
every drafter, the draft model and the session's suffix memory included. So one client
gets what one-at-a-time serving gives it; a second joining turns the next step into a
batch of copies, and the first keeps its place and its own copy drafter. Every sequence's
suffix drafter reads and adds to the session's memory of earlier answers: what a batch
answered is copied later as what one request answered alone is.

A recurrent or hybrid target has one state per sequence but no way to take back part of a
batch for one sequence alone (its snapshots and checkpoints follow sequence 0), so there
every request decodes plain in the shared batch: batching without speculation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from specdash.contract import events as E
from specdash.engine import step_rules as rules
from specdash.engine.batch.costs import BatchCosts
from specdash.engine.batch.plan import Choice, Offer, plan
from specdash.engine.batch.slot import Slot, copy_drafter
from specdash.engine.controller_settings import ControllerSettings
from specdash.engine.draft_pricing import CopyPricing, expected_tokens
from specdash.engine.drafters.base import Draft
from specdash.engine.drafters.suffix import SuffixHistory
from specdash.engine.engine import Engine, Run, RunOptions, commit_run, ends_now, summarize
from specdash.engine.request_rows import GRAMMAR, allowed_draft, committed, sampling_probs, shaped_rows, with_forced
from specdash.engine.verify import verify_greedy, verify_sampling
from specdash.contract.errors import SpecdashError
from specdash.contract.events import Event, PrefillEvent, StepEvent


class BatchRunner:
    def __init__(self, engine: Engine, width: int, memory: SuffixHistory | None = None):
        """memory: the earlier answers every sequence's suffix drafter reads and adds to
        (the session's); None gives the batch one of its own."""
        if width < 1 or engine.target.n_seq < width:
            raise SpecdashError(f"a batch of {width} needs a target context with {width} sequences "
                                f"(it holds {engine.target.n_seq})")
        self.engine = engine
        self.width = width
        self.slots: dict[int, Slot] = {}  # by sequence id
        self.copies = CopyPricing(ControllerSettings())  # acceptance by source and match length, shared
        self.costs = BatchCosts(self._one_sequence)
        self._lone: Slot | None = None  # the request the engine's own drafter follows now
        self.memory = memory if memory is not None else SuffixHistory()

    # --- who is in the batch ------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.width - len(self.slots)

    @property
    def speculates(self) -> bool:
        return self.engine.target.strategy.kind == "kv"

    def _one_sequence(self, n: int) -> float | None:
        ctl = self.engine.controller
        costs = ctl.target_costs() if ctl is not None else None
        return costs.step_cost(n) if costs is not None else None

    def admit(self, prompt: Sequence[int], max_tokens: int, options: RunOptions, tag: str) -> Iterator[Event]:
        """Prefill `prompt` into a free sequence (the one whose rows share the most with it:
        a chat's next turn reuses its rows, as llama-server's slots do) and join the batch."""
        target, engine = self.engine.target, self.engine
        if not self.free:
            raise SpecdashError("the batch is full")
        if len(prompt) == 0:
            raise SpecdashError("the prompt is empty")
        if len(prompt) + 1 > target.n_ctx:
            raise SpecdashError(f"the prompt is {len(prompt)} tokens but the context holds {target.n_ctx}; "
                                "use a shorter prompt or a larger --ctx")
        if not self.slots:
            # A batch starts: what was sent while none ran applies now (a Stop was meant for
            # the run before), and the settings it runs with are said, as generate() says them.
            yield from engine.apply_pending(skip_stop=True)
            yield engine.settings_event()
        free = [seq for seq in range(self.width) if seq not in self.slots]
        # Alone, sequence 0: where the engine's own step runs (see the module docstring).
        seq = 0 if not self.slots else max(free, key=lambda s: (_common(target.seq_rows(s), prompt), -s))
        t0 = time.perf_counter()
        reused = target.prefill_seq(seq, prompt[:-1])
        spec = options.drafter or engine.settings.draft
        drafter = copy_drafter(spec, engine.settings, self.memory)
        drafter.prefill(prompt)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        run = Run(list(prompt), len(prompt) - 1, max_tokens, options=options,
                  rng=np.random.default_rng(options.seed) if options.seed is not None else None)
        self.slots[seq] = Slot(seq, tag, list(prompt), run, drafter, "" if options.drafter else spec, prefill_ms)
        yield PrefillEvent(len(prompt) - 1, prefill_ms, reused=reused, request=tag, t=E.now())

    def cancel_all(self, reason: str = "stopped") -> Iterator[Event]:
        """End every request now (the server is leaving): their summaries."""
        for slot in list(self.slots.values()):
            slot.run.stop_reason = slot.run.stop_reason or reason
        yield from self._finish()

    # --- one step -----------------------------------------------------------------------
    def step(self) -> Iterator[Event]:
        """Commands first (they apply between steps; paused, this waits), then one batched
        step, then the summaries of requests that ended."""
        engine = self.engine
        yield from engine.drain()
        if engine.take_stop():
            yield from self.cancel_all()
            return
        if engine.take_refeed():  # the target was reloaded (experts): every sequence's rows again
            for slot in self.slots.values():
                engine.target.prefill_seq(slot.seq, slot.run.tokens[:-1])
            self._lone = None
        self._follow_drafter()
        self._check_stops()
        yield from self._finish()
        if not self.slots:
            return
        slots = list(self.slots.values())
        if len(slots) == 1 and slots[0].seq == 0 and slots[0].spec and self.speculates:
            yield self._lone_step(slots[0])
        else:
            self._lone = None
            yield from self._step(slots)
        yield from self._finish()

    def _lone_step(self, slot: Slot) -> StepEvent:
        """One request alone: the engine's own step, its drafter started on this request
        first if it followed another (it brings itself in step with the tokens: a draft
        model catches up, priced by adaptive K)."""
        engine = self.engine
        if self._lone is not slot:
            # Alone from its first step, the engine's drafter remembers it (from its prompt;
            # alone again later, in two overlapping pieces); else the slot's own does.
            slot.engine_remembers = slot.engine_remembers or slot.run.generated == 0
            engine.start_drafting(slot.run.tokens)
            engine.drafter.prefill(slot.run.tokens)
            self._lone = slot
        ev = engine.step(slot.run)
        ev.request, ev.batch = slot.tag, 1
        return ev

    def _step(self, slots: list[Slot]) -> Iterator[Event]:
        engine, target = self.engine, self.engine.target
        limits = rules.Limits(target.n_ctx, target.n_batch, target.n_vocab, None if self.speculates else 0)
        share = (target.n_batch // len(slots)) - 1  # every sequence's verify fits one decode batch
        settings = [engine.run_settings(slot.run) for slot in slots]
        adaptive = engine.settings.adaptive

        # 1. Draft: each request's best copy, up to its ceiling.
        drafts: list[Draft] = []
        draft_ms: list[float] = []
        asked: list[list[tuple[str, float]]] = []  # per slot: (source, ms) of each source asked
        caps: list[int] = []
        for slot, s in zip(slots, settings):
            t0 = time.perf_counter()
            run = slot.run
            room = min(rules.room(limits, run.n_past, run.generated, run.max_tokens), share)
            cap = rules.k_cap(room, adaptive=adaptive, k=s.k, k_max=s.k_max)
            caps.append(cap if slot.drafter.name != "none" else 0)  # "none" asks for plain decoding
            if adaptive:
                run.asks.step("", self.costs.cost(1, 1) or 0.0)
            offered = slot.drafts(run.tokens, cap, s.sampling, run.rng or engine.rng,
                                  run.asks if adaptive else None)
            asked.append([(name, ms) for _, name, ms in offered])
            drafts.append(max((d for d, _, _ in offered), key=self._worth, default=Draft.empty()))
            draft_ms.append((time.perf_counter() - t0) * 1e3)

        # 2. K for each, for the batch's throughput (a fixed K verifies what was offered).
        if adaptive:
            offers = [Offer(len(d.tokens), self.copies.alpha(d.source, d.evidence) if d.tokens else 0.0,
                            f"{d.source} match {d.evidence}" if d.tokens else "") for d in drafts]
            choices = plan(offers, self.costs.cost)
            for slot, d, c, sources in zip(slots, drafts, choices, asked):
                for source, ms in sources:  # found: its copy is the one this request verifies
                    slot.run.asks.asked(source, ms, c.k > 0 and d.source == source)
        else:
            choices = [Choice(len(d.tokens), "") for d in drafts]
        drafts = [with_forced(slot.run.options, allowed_draft(slot.run.options, rules.fit(d, c.k, limits)), cap)
                  for slot, d, c, cap in zip(slots, drafts, choices, caps)]
        t_draft = time.perf_counter()

        # 3. Verify: every sequence's last token and draft in ONE batch, logits for all.
        parts = [(slot.seq, [slot.run.tokens[-1], *d.tokens], slot.run.n_past) for slot, d in zip(slots, drafts)]
        logits = target.decode_seqs(parts)
        t_verify = time.perf_counter()
        verify_ms = (t_verify - t_draft) * 1e3
        n_tokens = sum(len(p[1]) for p in parts)
        self.costs.observe(n_tokens, len(slots), verify_ms)
        if len(slots) == 1 and engine.controller is not None and (costs := engine.controller.target_costs()):
            costs.observe(n_tokens, verify_ms)  # a one-sequence batch is the controller's curve too

        # 4. Each request commits its accepted prefix and the target's token; the rest goes.
        row = 0
        for slot, s, draft, choice, d_ms in zip(slots, settings, drafts, choices, draft_ms):
            t0 = time.perf_counter()
            run, n = slot.run, 1 + len(draft.tokens)
            rows = logits[row:row + n]
            row += n
            raw, rows = rows, shaped_rows(run.options, rows, run.tokens, draft.tokens)
            if s.sampling.greedy:
                n_acc, nxt = verify_greedy(rows.argmax(axis=1), draft.tokens)
            else:
                n_acc, nxt = verify_sampling(sampling_probs(run.options, rows, s.sampling), draft.tokens, draft.probs,
                                             run.rng or engine.rng)
            if n_acc < len(draft.tokens):
                target.kv_truncate(run.n_past + 1 + n_acc, slot.seq)
            done, pieces = commit_run(run, target, draft.tokens, n_acc, nxt)
            committed(run.options, done.tokens, raw, target.piece)
            if draft.source != GRAMMAR:  # the grammar's text: none of a copy source's doing
                self.copies.observe(draft.source, draft.evidence, len(draft.tokens), done.accepted)
            ev = StepEvent(
                step=run.counters.steps + 1, k=max(choice.k if adaptive else s.k, len(draft.tokens)),
                drafter=rules.drafted_by(draft),
                drafted=len(draft.tokens), accepted=done.accepted, tokens=done.tokens, pieces=pieces,
                from_draft=done.from_draft, draft_ms=d_ms, verify_ms=verify_ms,
                other_ms=(time.perf_counter() - t0) * 1e3, n_past=run.n_past, n_generated=run.generated,
                t=time.perf_counter(), adaptive=adaptive,
                decision=choice.reason if self.speculates else f"batch of {len(slots)}: a recurrent target "
                "takes back drafts on one sequence only: plain decoding",
                request=slot.tag, batch=len(slots))
            run.counters.add(ev)
            yield ev

    def _worth(self, draft: Draft) -> float:
        """Expected tokens a copy brings if all of it is verified (which source's to take)."""
        if not draft.tokens:
            return 0.0
        return expected_tokens(self.copies.alpha(draft.source, draft.evidence), len(draft.tokens))

    # --- between steps ------------------------------------------------------------------
    def _follow_drafter(self) -> None:
        """A drafter swapped in the dashboard (`d`) reaches every request drafting as the
        engine does; one that asked for its own keeps it."""
        spec = self.engine.settings.draft
        for slot in self.slots.values():
            if slot.spec and slot.spec != spec:
                slot.drafter.close()
                slot.drafter = copy_drafter(spec, self.engine.settings, self.memory)
                slot.drafter.prefill(slot.run.tokens)
                slot.spec = spec

    def _check_stops(self) -> None:
        target = self.engine.target
        for slot in self.slots.values():
            run = slot.run
            if not run.stop_reason:
                run.stop_reason = ends_now(run, target.n_ctx)

    def _finish(self) -> Iterator[Event]:
        for seq, slot in list(self.slots.items()):
            run = slot.run
            if not run.stop_reason and run.generated >= run.max_tokens:
                run.stop_reason = "max_tokens"
            if run.stop_reason:
                del self.slots[seq]
                if slot.engine_remembers:
                    # Its answer goes into the shared memory once, whole, and now: the
                    # next batch's sequences may copy it before another request runs alone.
                    self.engine.drafter.reset()
                    self._lone = None
                    slot.forget_answer()
                slot.drafter.close()
                yield summarize(run, slot.prompt, slot.prefill_ms, time.perf_counter() - slot.started, request=slot.tag)
                if not self.slots:  # the batch ran dry: keep what its steps taught the cost curve
                    yield from self.engine.save_costs()


def _common(rows: Sequence[int], prompt: Sequence[int]) -> int:
    n = 0
    for a, b in zip(rows, prompt):
        if a != b:
            break
        n += 1
    return n
