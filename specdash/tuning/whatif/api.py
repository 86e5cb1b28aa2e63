"""What `specdash sweep --whatif` asks of the simulation: one drafter's predicted tok/s
and acceptance at each K of a sweep, so the sweep view starts with predicted points and
the real runs land beside them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specdash.engine.drafters import KINDS, is_model
from specdash.engine.drafters.base import NoDrafter
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError
from specdash.tuning.whatif.measure import measure_here
from specdash.costs.profile import load_profile
from specdash.tuning.whatif.simulate import make_drafter, simulate
from specdash.tuning.whatif.transcript import from_prompt, model_spec


def predict_sweep(settings: EngineSettings, prompt: str, ks: Sequence[int], max_tokens: int, profile_spec: str,
                  say: Callable[[str], None] = lambda s: None) -> tuple[dict[int, tuple[float, float | None]], str]:
    """({K: (predicted tok/s, acceptance)}, where the prediction comes from) for the
    settings' drafter on `prompt`'s first `max_tokens` greedy tokens."""
    if settings.draft in KINDS and not KINDS[settings.draft].drafts:
        raise SpecdashError(f"--whatif: the draft source is {settings.draft}; nothing to predict")
    profile = None if profile_spec == "here" else load_profile(profile_spec)
    model = model_spec(settings) if is_model(settings.draft) or KINDS[settings.draft].uses_model else None
    s = settings.replace(max_tokens=max_tokens)
    # The head drafts for `mtp` and is the model of auto and a chain without a draft model
    # (whatif/head.py).
    head_depth = max(ks) if settings.draft in ("mtp", "chain", "auto") else 0
    tr, (session, draft_llm) = from_prompt(s, prompt, model, say, head_depth=head_depth)
    try:
        if settings.draft == "mtp" and tr.head is None:
            raise SpecdashError(f"--whatif: mtp unavailable: {tr.head_why}")
        if profile is None:
            profile = measure_here(session.target, draft_llm, tr.prompt, overhead_ms=tr.plain["overhead_ms"],
                                   relative_cost=tr.draft_relative_cost, plain_step_ms=tr.plain["verify_ms_median"],
                                   head=session.make_drafter("mtp") if tr.head is not None else None)
    finally:
        session.close()
    out: dict[int, tuple[float, float | None]] = {}
    for k in ks:
        if k == 0:
            out[0] = (simulate(tr, NoDrafter(), profile, s, name="none", k=0).tokens_per_s, None)
        else:
            r = simulate(tr, make_drafter(settings.draft, tr, profile, s), profile, s, name=settings.draft, k=k)
            out[k] = (r.tokens_per_s, r.acceptance)
    return out, f"whatif on profile {profile.name}"
