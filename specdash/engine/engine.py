"""The speculative loop: draft -> verify in one target batch -> commit / roll back.

`step()` is one speculative step and reads like the paper (gpt-fast's
`speculative_decode`); `generate()` is the loop around it, with the commands, the
metrics and the stopping rules outside the step. Commands arrive on a thread-safe queue
and are applied between steps, never inside one, so a step always runs with one
consistent, frozen set of settings. The engine is the only writer of its settings: it
replaces the snapshot, and every change is announced with a SettingsEvent.
"""

from __future__ import annotations

import codecs
import queue
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specdash.contract import events as E
from specdash.engine import step_rules as rules
from specdash.engine.adaptive_draft import propose
from specdash.engine.ask_backoff import AskBackoff
from specdash.engine.controller import KController
from specdash.engine.detector import Detector
from specdash.engine.drafters.base import Borrowed, Drafter, model_price
from specdash.engine.drafters.draft_model import DraftModelDrafter
from specdash.engine.drafters.lazy import LazyModel
from specdash.engine.experts import expert_info, expert_key
from specdash.engine.kept_costs import CostStore, KeptCosts, age_text
from specdash.engine.llm import LLM
from specdash.engine.rollback import Rollback, calibrate
from specdash.engine.settings import EngineSettings, SettingError
from specdash.engine.stats import SpecCounters
from specdash.engine.target_costs import TargetCosts
from specdash.engine.supports import ALWAYS
from specdash.engine.grammar import Grammar
from specdash.engine.penalties import Penalties
from specdash.engine.request_rows import GRAMMAR, allowed_draft, committed, sampling_probs, shaped_rows, with_forced
from specdash.engine.verify import verify_greedy, verify_sampling
from specdash.contract.errors import SpecdashError
from specdash.contract.events import Event, NoticeEvent, PrefillEvent, SettingsEvent, StepEvent, Summary


class TargetReloadError(SpecdashError):
    """A target reload failed after the old model was closed; `target` is the model the
    session loaded back in its place, so generation can go on."""

    def __init__(self, message: str, target: LLM):
        super().__init__(message)
        self.target = target


@dataclass(frozen=True)
class RunOptions:
    """One request's own settings (a server's client: specdash/serve). Its fields win over
    the engine's for this run only; what it leaves out follows the engine's live settings,
    so a key pressed in the dashboard reaches the request in flight."""

    overrides: Mapping[str, Any] = field(default_factory=dict)  # settings by LIMITS name
    seed: int | None = None  # its own sampling stream
    drafter: str | None = None  # a drafter spec for this run; the engine's comes back after
    stop_when: Callable[[], str] | None = None  # asked before every step: a stop reason, or ""
    # Keep every row an earlier run left that this prompt starts with, decoded ones too (a
    # chat's next turn resends the conversation): what llama-server's prompt cache does.
    # Rows decoded in other batch shapes may round differently: greedy output may then
    # differ from a fresh prefill's at a near-tie, as a speculative step's may.
    reuse_rows: bool = False
    # The run's grammar (a JSON schema, a tool call): every step's draft is cut where it
    # forbids a token and each verify row masked by it (engine/grammar.py says why exact).
    grammar: Grammar | None = None
    # Draft the text the grammar fixes next where the drafter has less (request_rows.with_forced).
    grammar_drafts: bool = True
    # Added to the target's logits for these token ids at every row (OpenAI's logit_bias):
    # the verify rule then keeps the biased distribution exact, whatever drafted.
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    penalties: Penalties | None = None  # repeat, frequency, presence (engine/penalties.py)
    min_p: float = 0.0  # sampling: tokens below min_p times the most likely one are cut (verify.keep_min_p)
    # Told, after each step, the committed tokens and the target rows that predicted them
    # (before any grammar), with the target's piece for a token: a client's logprobs.
    observe_rows: Callable[[list[int], np.ndarray, Callable[[int], bytes]], None] | None = None


@dataclass
class Run:
    """One prompt's generation state between steps."""

    tokens: list[int]  # committed: prompt + generated; tokens[-1] is not in the KV yet
    n_past: int  # tokens in the target's KV cache
    max_tokens: int
    generated: int = 0
    counters: SpecCounters = field(default_factory=SpecCounters)
    text: list[str] = field(default_factory=list)
    calibrate: int = 0  # leading steps still to run at K=0 (a plain reference)
    # set when the run must end: eos | max_tokens | context | stopped, or a request's own
    # (RunOptions.stop_when): stop (a stop string) | cancelled (its client left)
    stop_reason: str = ""
    options: RunOptions = field(default_factory=RunOptions)
    rng: np.random.Generator | None = None  # the request's own seed; else the engine's
    utf8: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    asks: AskBackoff = field(default_factory=AskBackoff)  # its copy sources' back-off (adaptive K)


def ends_now(run: Run, n_ctx: int, *, stopped: bool = False) -> str:
    """Why `run` ends before its next step, or "" to go on: the one stop rule the lone
    engine and the batch runner both apply, in this order (a full answer is full even
    if a stop came with its last token)."""
    if run.generated >= run.max_tokens:
        return "max_tokens"
    if stopped:
        return "stopped"
    if run.options.stop_when is not None and (why := run.options.stop_when()):
        return why
    if run.n_past + 1 >= n_ctx:
        return "context"
    return ""


class Engine:
    def __init__(
        self,
        target: LLM,
        drafter: Drafter,
        settings: EngineSettings,
        *,
        drafter_factory: Callable[[str], Drafter] | None = None,
        reload_target: Callable[[int], LLM] | None = None,
        controller: KController | None = None,
        detector: Detector | None = None,
        target_path: str | None = None,
        draft_path: Callable[[], str | None] | None = None,
        cost_store: CostStore | None = None,
    ):
        self.target = target
        self.drafter = drafter
        # Adaptive K is the settings' default, but without a controller this engine runs
        # the fixed K: its settings (and so its SettingsEvent) say so rather than claim it.
        self.settings = settings if controller is not None else settings.replace(adaptive=False)
        self._make_drafter = drafter_factory
        self._reload_target = reload_target
        self.controller = controller  # adaptive K; used when settings.adaptive
        self.detector = detector  # content detector; labels steps when present
        self._target_path = target_path or str(target.path)
        self._draft_path = draft_path or (lambda: None)
        self._queue: queue.Queue[E.Command] = queue.Queue()
        self.paused = False
        self.rng = np.random.default_rng(settings.sampling.seed)
        self.calibrate_steps = 0  # leading steps of the next generate() run at K=0 (plain reference)
        self._stop = False
        self._needs_refeed = False  # the target was reloaded: rebuild its KV before the next step
        self._rb = Rollback(target)  # how the target takes back rejected drafts
        self._told_rollback: object = None  # the target whose rollback strategy was announced
        self._rollback_priced: object = None  # (target, controller): the controller has its rollback costs
        self._told_pinned: object = None  # the controller whose pinned cost shape was announced
        # Kept batch costs (issue 40): loaded now and after a target reload, saved after every
        # run; what loading said waits here for the next run's events.
        self._store = cost_store
        self._said: list[Event] = []
        self._load_kept()

    # --- commands -------------------------------------------------------------------
    def send(self, cmd: E.Command) -> None:
        """Thread-safe; applied before the next step."""
        self._queue.put(cmd)

    def settings_event(self, command: str = "") -> SettingsEvent:
        s = self.settings
        experts = expert_info(self.target, s.experts)  # active count, the file's own when not overridden
        flat = s.flat()
        # What `_apply` takes now, by command name (commands_registry; engine/supports.py
        # lists them); the rest is refused.
        supports = list(ALWAYS)
        unavailable = {"seek": "only a replay can seek", "speed": "only a replay has a speed"}
        if not experts:
            unavailable["experts"] = "the target is a dense model (no experts)"
        elif self._reload_target is None:
            unavailable["experts"] = "this engine cannot reload the target"
        else:
            supports.append("experts")
        if self._make_drafter is not None:
            supports.append("draft")
        else:
            unavailable["draft"] = "this engine cannot swap drafters"
        if self.controller is not None:
            supports.append("adaptive")
        else:
            unavailable["adaptive"] = "adaptive K is not available in this engine"
        return SettingsEvent(
            source="engine",
            drafter=self.drafter.label,
            experts_active=experts[0] if experts else None,
            expert_count=experts[1] if experts else None,
            paused=self.paused,
            command=command,
            supports=sorted(supports),
            unavailable=unavailable,
            target_path=self._target_path,
            draft_path=self._draft_path(),
            rollback=self._rollback().strategy.describe(),
            repack_verdict=self._repack_label(),
            t=E.now(),
            **flat,
        )

    def _repack_label(self) -> str:
        verdict = getattr(self.target, "repack", None)
        return verdict.label() if verdict is not None else ""

    def apply_pending(self, skip_stop: bool = False) -> Iterator[Event]:
        """Apply every queued command now, between runs (the bench's sweeps, the
        dashboard between prompts). `skip_stop`: drop Stops, which no run is there to end."""
        while not self._queue.empty():
            cmd = self._queue.get_nowait()
            if not (skip_stop and isinstance(cmd, E.Stop)):
                yield from self._apply(cmd)

    def _apply(self, cmd: E.Command) -> Iterator[Event]:
        """Apply one command; refusals become notices and leave settings unchanged."""
        s = self.settings
        try:
            match cmd:
                case E.SetK(k):
                    # An explicit K fixes K, as `--k N` does: under adaptive K (the
                    # default) a K key or a scheduled k=N would otherwise change nothing
                    # the operator can see. SetAdaptive(True) after it starts from K.
                    self.settings = s.replace(k=k, adaptive=False)
                    if s.adaptive:
                        yield NoticeEvent("info", f"k={k} fixes K: adaptive K is off (a, or adaptive=on, "
                                                  f"turns it back on, starting from K={k})", t=E.now())
                case E.SetDrafter(spec):
                    if self._make_drafter is None:
                        raise SpecdashError("this engine cannot swap drafters")
                    new = self._make_drafter(spec)  # raises SpecdashError when incompatible
                    new.set_cut(s.draft_p_joint)  # a draft model lent again keeps the live cut
                    self.settings = s.replace(draft=spec)
                    self.drafter.close()
                    self.drafter = new
                    if self.controller:
                        self.controller.reset()
                        self._price_drafter()
                case E.SetSampling(temperature, top_k, top_p):
                    changes = {k: v for k, v in
                               (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if v is not None}
                    self.settings = s.replace(**changes)
                case E.SetAdaptive(on):
                    if on and self.controller is None:
                        raise SpecdashError("adaptive K is not available in this engine")
                    self.settings = s.replace(adaptive=on)
                case E.SetExperts(n):
                    yield from self._reload(n)
                case E.SetCut(p_joint):
                    self.settings = s.replace(draft_p_joint=p_joint)  # SettingError: out of 0..1
                    # The next draft is cut by it; a swap later applies it too (SetDrafter).
                    self.drafter.set_cut(p_joint)
                    if self.controller:
                        self._price_drafter()  # the cut makes K a ceiling, or no longer
                case E.Forget():
                    self.drafter.forget()
                    if self.controller:
                        self.controller.reset()
                        self._price_drafter()
                case E.Pause():
                    self.paused = True
                case E.Resume():
                    self.paused = False
                case E.Stop():
                    self._stop = True
                    return
                case _:
                    raise SpecdashError(f"{cmd.text()} refused: the embedded engine does not do that")
        except SettingError as exc:
            yield NoticeEvent("warning", f"{cmd.text()} refused: {exc.reason}; kept {self._kept(cmd)}",
                              t=E.now(), refused=cmd.text())
            return
        except SpecdashError as exc:
            yield NoticeEvent("warning", self._refusal(cmd, str(exc)), t=E.now(), refused=cmd.text())
            return
        yield self.settings_event(cmd.text())

    def _refusal(self, cmd: E.Command, why: str) -> str:
        """A refusal notice that names the command as typed (`run --schedule` output is
        matched against it) and what stays in force."""
        head = f"{cmd.text()} refused"
        message = why if why.startswith(head) else f"{head}: {why}"
        return message if "kept" in why else f"{message}; kept {self._kept(cmd)}"

    def _kept(self, cmd: E.Command) -> str:
        """What stays in force after `cmd` was refused, for the notice."""
        s = self.settings
        match cmd:
            case E.SetK():
                return f"k={s.k}"
            case E.SetSampling():
                return f"temp={s.sampling.temperature:g} top_k={s.sampling.top_k} top_p={s.sampling.top_p:g}"
            case E.SetDrafter():
                return f"draft={s.draft}"
            case E.SetExperts():
                return f"experts={s.experts}" if s.experts is not None else "the model's own expert count"
            case E.SetAdaptive():
                return f"adaptive={'on' if s.adaptive else 'off'}"
            case E.SetCut():
                return f"cut={s.draft_p_joint:g}"
            case _:
                return "the previous settings"

    def _reload(self, n: int) -> Iterator[Event]:
        if self._reload_target is None:
            raise SpecdashError("this engine cannot reload the target")
        expert_key(self.target, n)  # refuse before announcing a reload
        yield NoticeEvent("info", f"reloading target with {n} active experts...", t=E.now())
        t0 = time.perf_counter()
        try:
            self.target = self._reload_target(n)
        except TargetReloadError as exc:
            self.target, self._needs_refeed = exc.target, True
            raise
        yield NoticeEvent("info", f"target reloaded with {n} active experts in "
                          f"{time.perf_counter() - t0:.1f}s; re-feeding the transcript", t=E.now())
        self.settings = self.settings.replace(experts=n)
        self._needs_refeed = True
        if self.controller:  # verify costs measured on the old model no longer hold
            self.controller.reset(target_changed=True)
            self._load_kept()
            self._rollback_priced = None  # nor its rollback costs
            self._price_drafter()

    def _price_drafter(self) -> None:
        """Tell the controller what the drafter's model parts should cost, so it can
        refuse a probe that could not pay even at 95% acceptance."""
        assert self.controller is not None
        self.controller.price_draft(*model_price(self.drafter))

    def take_refeed(self) -> bool:
        """Whether the target was reloaded (an expert count) since asked, so its memory must
        be rebuilt from the runs' tokens (a batch does it for every sequence: engine/batch)."""
        refeed, self._needs_refeed = self._needs_refeed, False
        return refeed

    def take_stop(self) -> bool:
        """Whether a Stop arrived, forgetting it (a batch ends every request in flight on it
        and goes on with the next ones: engine/batch)."""
        stop, self._stop = self._stop, False
        return stop

    def drain(self) -> Iterator[Event]:
        """Apply queued commands; while paused, block until resumed or stopped."""
        while True:
            try:
                cmd = self._queue.get(block=self.paused and not self._stop)
            except queue.Empty:
                return
            yield from self._apply(cmd)
            if self._stop or (not self.paused and self._queue.empty()):
                return

    def _measure_costs(self, run: Run, full: bool = False) -> Iterator[Event]:
        """Before adaptive K decides: on a KV target without a kept profile, nothing is
        timed up front (TargetCosts.lazy: each size by the first verify that needs it);
        `full` (warm_up, `specdash calibrate`) or a checkpoint target, whose rollback
        must be priced, times every size now."""
        ctl, target = self.controller, self.target
        if not (self.settings.adaptive and ctl is not None):
            return
        if self.drafter.name == "none" and not full:
            # Adaptive is the default, also with --draft none: nothing can be drafted, so
            # measuring batch costs would only delay the first token. A drafter swapped in
            # later is measured before its first step (generate calls this every step).
            return
        strategy = self._rollback().strategy
        if strategy.kind == "none" or (strategy.kind != "kv" and not strategy.checkpoint_bytes):
            return  # nothing to draft (K=0), or no way back from a junk batch
        pinned = ctl.pinned_shape()
        if pinned and self._told_pinned is not ctl:  # said where the costs would be timed
            self._told_pinned = ctl
            yield NoticeEvent("info", f"adaptive K: target batch costs follow profile {pinned}'s curve, "
                              "scaled by the one-token cost measured here (pinned: not calibrated)", t=E.now())
        # Fixed-K steps teach the controller batch costs, never what a rollback costs.
        price_rollback = strategy.kind == "checkpoint" and self._rollback_priced != (target, ctl)
        costs = ctl.target_costs()
        if costs is not None and not pinned and strategy.kind == "kv" and not costs.lazy:
            costs.lazy = True
            if ctl.needs_costs() and not full:
                yield NoticeEvent("info", "adaptive K: no kept cost profile for this machine and target: each batch "
                                  "size is timed by the first verify that needs it (nothing up front)", t=E.now())
        up_front = ctl.needs_costs() and (full or costs is None or not costs.lazy)
        if not (up_front or price_rollback):
            return
        sizes = rules.cost_sizes(self.limits(), run.n_past, self.settings.k_max)
        t0 = time.perf_counter()
        cal = calibrate(target, run.n_past, run.tokens, sizes, replay=price_rollback)
        if not cal.ms:
            return
        ctl.seed_costs(cal.ms)
        unit = cal.ms[sizes[0]]
        curve = ", ".join(f"{n}: {v / unit:.1f}x" for n, v in cal.ms.items() if n > 1)
        yield NoticeEvent("info", f"adaptive K: measured target batch costs in "
                          f"{time.perf_counter() - t0:.1f}s (tokens: cost vs one token) {curve}", t=E.now())
        if price_rollback:
            ctl.price_rollback(cal.save_ms, cal.restore_ms, cal.replay_ms)
            self._rollback_priced = (target, ctl)
            yield NoticeEvent("info", f"adaptive K: a rejection here costs a restore ({cal.restore_ms:.2f} ms) and a "
                              f"replay ({', '.join(f'{n}: {v:.1f}' for n, v in cal.replay_ms.items())} ms); "
                              f"checkpoint {cal.save_ms:.2f} ms per drafting step", t=E.now())

    # --- kept costs (issue 40) -----------------------------------------------------------
    def _costs(self) -> TargetCosts | None:
        """The target's cost curve adaptive K learns, if its rule keeps one."""
        return self.controller.target_costs() if self.controller is not None else None

    def _load_kept(self) -> None:
        costs = self._costs()
        if self._store is None or costs is None or costs.pinned:
            return
        kept = self._store.load(self.target, self.settings.experts)
        if isinstance(kept, str):
            self._said.append(NoticeEvent("warning", kept, t=E.now()))
        elif kept is not None and kept.verify_ms:
            costs.load(kept.verify_ms, kept.samples)
            self._said.append(NoticeEvent(
                "info", f"adaptive K: batch costs from the kept profile {kept.where} ({kept.timings} timings "
                f"of {len(kept.verify_ms)} sizes, saved {age_text(kept.age_s)} ago), refined as it runs", t=E.now()))

    def save_costs(self) -> Iterator[Event]:
        """Keep what this target's batch costs are known to be (after every run; a notice
        only if the save failed)."""
        costs = self._costs()
        if self._store is None or costs is None:
            return
        verify, samples = costs.export()
        if verify:
            failed = self._store.save(self.target, self.settings.experts, KeptCosts(verify, samples))
            if failed:
                yield NoticeEvent("warning", failed, t=E.now())

    def run_settings(self, run: Run) -> EngineSettings:
        """The settings a step of `run` uses: the engine's, with the request's own on top.
        A request's K ceiling (speculative.n_max) also caps a fixed K and adaptive's floor."""
        over = run.options.overrides
        if not over:
            return self.settings
        s = self.settings
        changes = dict(over)
        k_max = changes.get("k_max", s.k_max)
        if "k_max" in changes:
            changes["k"] = min(s.k, k_max)
        changes["k_min"] = min(changes.get("k_min", s.k_min), k_max)  # a request's floor under its ceiling
        return s.replace(**changes)

    def limits(self) -> rules.Limits:
        """What bounds every draft on the target's context (its rollback among them)."""
        target = self.target
        return rules.Limits(target.n_ctx, target.n_batch, target.n_vocab, self._rollback().strategy.max_draft)

    def _rollback(self) -> Rollback:
        """The target's rollback (a reload replaces the target, and with it the context)."""
        if self._rb.llm is not self.target:
            self._rb = Rollback(self.target)
        return self._rb

    def _rollback_notice(self) -> Iterator[Event]:
        """Once per loaded target: how it takes back rejected drafts, when not a KV cache."""
        if self._told_rollback is self.target:
            return
        self._told_rollback = self.target
        said = self._rollback().strategy.notice(self.target.arch)
        if said:
            yield NoticeEvent(*said, t=E.now())

    # --- one step -------------------------------------------------------------------
    def step(self, run: Run) -> StepEvent:
        """Draft up to K tokens, verify them in one target batch, commit the accepted
        prefix plus one target token, roll back the rest. What does not depend on running
        the target is in step_rules, which whatif's simulated step shares."""
        s, target, rb = self.run_settings(run), self.target, self._rollback()
        rng = run.rng or self.rng
        t_step = time.perf_counter()
        content = self.detector.label if self.detector is not None else ""
        limits = self.limits()
        room = rules.room(limits, run.n_past, run.generated, run.max_tokens)

        # 1. Draft.
        adaptive = s.adaptive and self.controller is not None
        calibrating = run.calibrate > 0
        cap = 0
        if calibrating:  # a plain reference step
            run.calibrate -= 1
            draft, k, _ = propose(self.drafter, run.tokens, 0, None, content, s.sampling, rng)
            decision = "calibrating plain decoding"
        else:
            cap = rules.k_cap(room, adaptive=adaptive, k=s.k, k_max=s.k_max)
            draft, k, decision = propose(self.drafter, run.tokens, cap, self.controller if adaptive else None,
                                         content, s.sampling, rng, horizon=run.max_tokens - run.generated,
                                         asks=run.asks if adaptive else None)
        draft = allowed_draft(run.options, rules.fit(draft, k, limits))
        if not calibrating and self.drafter.name != "none":  # "none" asks for plain decoding
            offer = with_forced(run.options, draft, cap)
            if offer is not draft and adaptive:  # priced as a copy: as much as pays on this curve
                assert self.controller is not None
                n, _, why = self.controller.copy_offer(GRAMMAR, offer.evidence, len(offer.tokens), content)
                if n > len(draft.tokens):
                    draft, decision = offer.cut(n), f"grammar: {why}"
            elif offer is not draft:
                draft = offer
            k = max(k, len(draft.tokens))  # the grammar's text is drafted up to the step's ceiling
        draft_rb_ms, draft_rb_bytes = _take_draft_rollback(self.drafter)
        t_draft = time.perf_counter()

        # 2. Verify: the last committed token and the draft in ONE batch, logits for all.
        batch = [run.tokens[-1], *draft.tokens]
        rb.before(run.n_past, len(draft.tokens))  # a recurrent target: checkpoint first
        save_ms = rb.take_ms()
        logits = target.decode(batch, run.n_past, logits="all")
        assert logits is not None
        raw, logits = logits, shaped_rows(run.options, logits, run.tokens, draft.tokens)
        if s.sampling.greedy:
            argmax = logits.argmax(axis=1)
            t_verify = time.perf_counter()
            n_acc, nxt = verify_greedy(argmax, draft.tokens)
        else:
            probs = sampling_probs(run.options, logits, s.sampling)
            t_verify = time.perf_counter()
            n_acc, nxt = verify_sampling(probs, draft.tokens, draft.probs, rng)

        # 3. Commit the accepted prefix and the target's own token; roll back the rest.
        if n_acc < len(draft.tokens):
            rb.keep(run.n_past + 1 + n_acc, batch)
        restore_ms = rb.take_ms()
        done, pieces = commit_run(run, target, draft.tokens, n_acc, nxt)
        committed(run.options, done.tokens, raw, target.piece)
        if self.detector is not None:
            self.detector.update("".join(pieces))

        t_end = time.perf_counter()
        cost = rules.StepCost(draft_ms=(t_draft - t_step) * 1e3, verify_ms=(t_verify - t_draft) * 1e3,
                              other_ms=(t_end - t_verify) * 1e3, catch_up_ms=draft.prep_ms,
                              save_ms=save_ms, restore_ms=restore_ms)
        ev = StepEvent(
            step=run.counters.steps + 1,
            k=k,
            drafter=rules.drafted_by(draft),
            drafted=len(draft.tokens),
            accepted=done.accepted,
            tokens=done.tokens,
            pieces=pieces,
            from_draft=done.from_draft,
            draft_ms=cost.draft_ms,
            verify_ms=cost.verify_ms,
            other_ms=cost.other_ms,
            n_past=run.n_past,
            n_generated=run.generated,
            t=t_end,
            content=content,
            adaptive=s.adaptive,
            decision=decision,
            # What took the rejected drafts back (a step may outrun the snapshots), else the
            # target's own way back: a plain step on a recurrent target still names it.
            rollback=rb.used or (rb.strategy.kind if rb.strategy.kind in ("snapshots", "checkpoint") else ""),
            rollback_ms=save_ms + restore_ms + draft_rb_ms,
            checkpoint_bytes=rb.saved_bytes + draft_rb_bytes,
            translate_ms=draft.translate_ms,
        )
        run.counters.add(ev)
        # (The grammar's steps teach its own copy bucket, evidence > 0: not the draft model's stats.)
        if self.controller is not None:
            rules.observation(k, draft, done.accepted, cost, content).tell(self.controller)
        return ev

    # --- the loop -------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_tokens: int, options: RunOptions | None = None) -> Iterator[Event]:
        """Generate for `prompt`; `options`: a request's own settings (a server's)."""
        if len(prompt) == 0:
            raise SpecdashError("the prompt is empty")
        if len(prompt) + 1 > self.target.n_ctx:
            raise SpecdashError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                "use a shorter prompt or a larger --ctx"
            )
        options = options or RunOptions()
        self._stop = False
        self._needs_refeed = False
        # A Stop queued before this run started was meant for the previous run; the rest
        # apply now, before the prefill, so a new drafter sees the prompt.
        pending = [cmd for cmd in iter_queue(self._queue) if not isinstance(cmd, E.Stop)]
        for cmd in pending:
            yield from self._apply(cmd)
        yield self.settings_event()
        yield from self._rollback_notice()
        own = self._lend_drafter(options.drafter)
        try:
            yield from self._generate(prompt, max_tokens, options)
        finally:
            if own is not None:  # the engine's own drafter is back for the next run
                self.drafter.close()
                self.drafter = own
                if self.controller:
                    self.controller.reset()

    def _lend_drafter(self, spec: str | None) -> Drafter | None:
        """Put a request's own drafter in for one run; the engine's, to give back (None
        when the request drafts as the engine does)."""
        if spec is None or spec == self.settings.draft or self._make_drafter is None:
            return None
        new = self._make_drafter(spec)
        new.set_cut(self.settings.draft_p_joint)
        own, self.drafter = self.drafter, new
        if self.controller:
            self.controller.reset()
        return own

    def start_drafting(self, prompt: Sequence[int]) -> None:
        """A new run starts drafting on `prompt`: the drafter, adaptive K and the content
        detector start over (a batch's lone request too: engine/batch)."""
        self.drafter.reset()
        if self.controller:
            self.controller.new_prompt()
            self._price_drafter()
        if self.detector is not None:  # the prompt's own class is the prior for the first tokens
            self.detector.reset(self.target.detokenize(prompt))

    def _generate(self, prompt: Sequence[int], max_tokens: int, options: RunOptions) -> Iterator[Event]:
        target = self.target
        self.start_drafting(prompt)
        t0 = time.perf_counter()
        # The same prompt again (a sweep's next K, a bench round) reuses its rows.
        reused = target.prefill_prompt(prompt[:-1], any_rows=options.reuse_rows)
        self._needs_refeed = False  # a target reloaded by a pending SetExperts: just fed
        self.drafter.prefill(prompt)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        yield PrefillEvent(len(prompt) - 1, prefill_ms, reused=reused, t=E.now())
        yield from self._take_said()

        run = Run(list(prompt), len(prompt) - 1, max_tokens, calibrate=self.calibrate_steps, options=options,
                  rng=np.random.default_rng(options.seed) if options.seed is not None else None)
        yield from self._measure_costs(run)  # once per session, before the clock starts
        decode_start = time.perf_counter()
        while not run.stop_reason:
            if run.generated < max_tokens:  # a finished answer takes no more commands
                yield from self.drain()
            run.stop_reason = ends_now(run, self.target.n_ctx, stopped=self._stop)
            if run.stop_reason:
                break
            if self._needs_refeed:  # target reloaded (expert count): rebuild its KV
                self.target.clear()
                self.target.prefill(run.tokens[:-1])
                self._needs_refeed = False
                yield from self._rollback_notice()
            if self.settings.adaptive:
                yield from self._measure_costs(run)  # adaptive switched on mid-run
            yield self.step(run)
        yield summarize(run, prompt, prefill_ms, time.perf_counter() - decode_start)
        yield from self.save_costs()

    def warm_up(self, prompt: Sequence[int]) -> Iterator[Event]:
        """Time the target's batch costs for adaptive K now, on `prompt`'s rows, rather
        than before a first request's first token (a server does it before /health says
        ok). Its notices are the events; nothing when adaptive K has nothing to time."""
        if not (self.settings.adaptive and self.controller is not None) or len(prompt) < 2:
            return
        yield from self._take_said()
        self.target.prefill_prompt(prompt[:-1])
        self._price_drafter()
        yield from self._measure_costs(Run(list(prompt), len(prompt) - 1, 1), full=True)
        yield from self.save_costs()

    def calibrate(self, prompt: Sequence[int]) -> Iterator[Event]:
        """Time every batch size now whatever is kept (`specdash calibrate`), and keep it."""
        costs = self._costs()
        if costs is not None and not costs.pinned:
            costs.forget()
        yield from self.warm_up(prompt)

    def _take_said(self) -> Iterator[Event]:
        said, self._said = self._said, []
        yield from said

def commit_run(run: Run, target: LLM, draft: Sequence[int], n_acc: int, nxt: int) -> tuple[rules.Commit, list[str]]:
    """`run` moves past a verified step: the accepted drafts and the target's own token
    committed (step_rules.commit), its end of generation noted; the step's commit and the
    text of each token (one request's step and a batch's both commit through here)."""
    run.n_past += 1 + n_acc
    done = rules.commit(draft, n_acc, nxt, target.is_eog, run.generated, run.max_tokens)
    run.tokens.extend(done.kept)
    if done.eos:
        run.stop_reason = "eos"
    run.generated += len(done.tokens)
    pieces = [run.utf8.decode(target.piece(t)) for t in done.tokens]
    run.text.extend(pieces)
    return done, pieces


def summarize(run: Run, prompt: Sequence[int], prefill_ms: float, decode_s: float, request: str = "") -> Summary:
    """The run's end: its text, counters and rates (`request`: whose, in a batch)."""
    run.text.append(run.utf8.decode(b"", final=True))
    c = run.counters
    return Summary(
        text="".join(run.text),
        stop_reason=run.stop_reason,
        n_prompt=len(prompt),
        n_generated=run.generated,
        num_drafts=c.num_drafts,
        num_draft_tokens=c.num_draft_tokens,
        num_accepted_tokens=c.num_accepted_tokens,
        num_accepted_tokens_per_pos=list(c.per_pos_accepted),
        acceptance_rate=c.acceptance_rate,
        mean_accepted_length=c.mean_accepted_length,
        tokens_per_s=run.generated / decode_s if decode_s > 0 else 0.0,
        prefill_tokens_per_s=(len(prompt) - 1) / (prefill_ms / 1e3) if prefill_ms > 0 else 0.0,
        prefill_ms=prefill_ms,
        decode_s=decode_s,
        draft_ms=c.draft_ms,
        verify_ms=c.verify_ms,
        other_ms=c.other_ms,
        steps=c.steps,
        request=request,
        t=E.now(),
    )


def _take_draft_rollback(drafter: Drafter) -> tuple[float, int]:
    """(ms, bytes) a recurrent draft model spent taking back its rejected drafts since
    asked last (its checkpoint and replay), summed over a chain's members."""
    ms, nbytes = 0.0, 0
    for part in drafter.parts():
        # A part may be the session's loan or a model loaded on first use: the model itself
        # is inside. Only a draft model keeps state it must take back.
        model = part.inner if isinstance(part, (Borrowed, LazyModel)) else part
        if isinstance(model, DraftModelDrafter):
            part_ms, part_bytes = model.take_rollback()
            ms, nbytes = ms + part_ms, nbytes + part_bytes
    return ms, nbytes


def iter_queue(q: queue.Queue[E.Command]) -> list[E.Command]:
    """Everything queued right now, removed from the queue."""
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
