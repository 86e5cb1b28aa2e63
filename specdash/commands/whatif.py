"""`specdash whatif`: every drafter and K predicted from one plain greedy run, on this
machine's cost curve or another's (specdash/tuning/whatif/); or, with --acceptance-length /
--acceptance-rates, every K from an acceptance figure alone (whatif/synthetic.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdash.commands.common import add_engine_arguments, add_prompt_arguments, load_settings, read_prompt, stderr_progress
from specdash.engine.drafters import KINDS
from specdash.contract.errors import SpecdashError


def _ks(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part or ".." in part:
                lo, hi = part.replace("..", "-").split("-")
                out.extend(range(int(lo), int(hi) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        out = []
    if not out or any(not 1 <= k <= 64 for k in out):
        raise argparse.ArgumentTypeError(f"{text!r}: Ks 1..64, comma-separated or a range, e.g. 1-32 or 2,4,8")
    return sorted(set(out))


def default_kinds() -> list[str]:
    """What whatif simulates unless told otherwise: every drafter kind that drafts (the
    registry's, engine/drafters/kinds.py: a kind added there is simulated with no change
    here; plain decoding is the baseline anyway; auto, the default, adaptive only), then
    "model", the draft model (--draft's, else --draft-model's)."""
    return [name for name, kind in KINDS.items() if kind.drafts] + ["model"]


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    known = default_kinds()
    bad = [k for k in kinds if k not in known]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated drafters from {', '.join(known)} "
                                         "(model = the draft model: --draft's, else --draft-model's)")
    return kinds


def _need_head(target: str) -> None:
    """--drafters mtp on a target without an MTP head: a usage error, from its header."""
    from specdash.models.mtp_info import mtp_head
    from specdash.models.resolve import resolve_model

    path = Path(resolve_model(target))
    head = mtp_head(path)
    if not head.layers:
        why = head.describe() or ("has no MTP head (nextn_predict_layers is absent or 0; many published GGUFs "
                                  "drop the head)")
        raise SpecdashError(f"--drafters mtp: {path.name} {why}")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "whatif",
        help="predict every drafter and K from one plain greedy run, on any machine's cost profile",
        description="Generate the plain greedy text once (or take it from a temperature-0 recording), then "
        f"simulate {', '.join(k for k in default_kinds()[:-1] if k != 'auto')} and the draft model at every K "
        "over it, and adaptive: acceptance is exact (the "
        "engine's own drafters replayed over the text; the draft model's argmax from one teacher-forced "
        "pass), time comes from a cost profile. Adaptive K runs the engine's own controller on the "
        "simulated steps. auto, the default draft source, is simulated adaptive (at a fixed K it is the "
        "chain) and judged against the best fixed (drafter, K) chosen without hindsight (picked on one "
        "half of the text, scored on the other, both ways) and against the oracle (the best on the whole "
        "text, with hindsight), every run timed with its draft model's prompt feed (a fixed draft model "
        "is fed the prompt in the prefill, auto's only once it chooses the model). The draft model is --draft's when it names one, else --draft-model's. "
        "Greedy only: at temperature > 0 the text is not unique and whatif refuses.",
        epilog="Profiles: `here` (measured now, the default), a TOML file, or a shipped one: "
        "epyc-32b (the original research's 32B+0.5B CPU regime), gpu-like, ci-box.",
    )
    add_engine_arguments(p, with_k=False)
    add_prompt_arguments(p, required=False)
    p.add_argument("--recording", metavar="FILE", help="take the text from a `specdash run --record` file "
                   "made at temperature 0 (its first prompt)")
    p.add_argument("--ks", type=_ks, default=None, metavar="LIST",
                   help="Ks to simulate: a range or a list (default 1-32; from a synthetic acceptance, every K "
                   "it can say something about)")
    p.add_argument("--drafters", type=_kinds, metavar="LIST",
                   help=f"drafters to simulate (default {','.join(default_kinds())}; model = the draft model; "
                   "auto: adaptive only, and the cross-validated comparison with it)")
    synth = p.add_argument_group(
        "from an acceptance figure, without a text",
        "Predict tok/s for every K from llama.cpp's synthetic acceptance (llama-server --spec-synth-len, "
        "--spec-synth-rates; same meaning) on the cost profile, for a draft model (the profile's draft costs) "
        "and a model-free drafter. Every step drafts K tokens; acceptance is drawn, not read off a text.")
    one = synth.add_mutually_exclusive_group()
    one.add_argument("--acceptance-length", type=float, metavar="L",
                     help="mean acceptance length, the target's own token included (1 + accepted per draft; vLLM's "
                     "mean accepted length), within [1, K+1]: llama.cpp's --spec-synth-len, the same L at every K "
                     "(geometric per-position rates solved per K)")
    one.add_argument("--acceptance-rates", metavar="R1,R2,...",
                     help="per-position acceptance, unconditional: Ri = the chance that the first i drafted tokens "
                     "are all accepted (non-increasing, 0..1): llama.cpp's --spec-synth-rates; predicts K = 1..n "
                     "(a K below n takes the first K)")
    synth.add_argument("--at-k", type=int, metavar="K0",
                       help="with --acceptance-length: the K it was read at (e.g. off a server running K0). Its "
                       "per-token rate is solved at K0 as llama.cpp would, and carried to every K")
    p.add_argument("--k-max", dest="whatif_k_max", type=int, metavar="N",
                   help="adaptive K's largest K (default: the k_max setting, 16)")
    p.add_argument("--profile", default="here", metavar="P",
                   help="cost profile: here (measure this machine), a TOML file, or epyc-32b, gpu-like, ci-box")
    p.add_argument("--save-profile", metavar="FILE", help="write this machine's measured profile (TOML)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write the whole report as JSON")
    p.set_defaults(func=run)


def _write_json(path: str, payload: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(payload, indent=1), encoding="utf-8")
    except OSError as exc:
        raise SpecdashError(f"--json {path}: cannot write it ({exc.strerror or exc})") from None


def run(args: argparse.Namespace) -> int:
    from specdash.engine.controller import CostModelController
    from specdash.tuning.whatif.crossval import cross_validated
    from specdash.tuning.whatif.measure import measure_here
    from specdash.costs.profile import load_profile, save_profile
    from specdash.tuning.whatif.report import AUTO, Report
    from specdash.tuning.whatif.simulate import sweep
    from specdash.tuning.whatif.transcript import from_prompt, from_recording, model_spec

    def say(msg: str) -> None:
        print(f"whatif: {msg}", file=sys.stderr, flush=True)

    prompt = read_prompt(args)
    if args.acceptance_length is not None or args.acceptance_rates is not None or args.at_k is not None:
        return run_synthetic(args, prompt, say)
    if (prompt is None) == (args.recording is None):
        raise SpecdashError("whatif needs exactly one of --prompt, --prompt-file or --recording "
                            "(or an acceptance figure: --acceptance-length, --acceptance-rates)")
    if args.ks is None:
        args.ks = list(range(1, 33))
    profile = None if args.profile == "here" else load_profile(args.profile)  # bad files fail first
    config = load_settings(args)
    settings = config.engine
    if not settings.sampling.greedy:
        raise SpecdashError(f"--temp {settings.sampling.temperature:g}: whatif needs greedy decoding "
                            "(temperature 0): only then is the text the same whatever drafts it")
    if args.whatif_k_max is not None:
        if not 1 <= args.whatif_k_max <= 64:
            raise SpecdashError(f"--k-max {args.whatif_k_max}: must be an integer 1..64")
        settings = settings.replace(k_max=args.whatif_k_max, k_min=min(settings.k_min, args.whatif_k_max))
    kinds = list(args.drafters or default_kinds())
    model = model_spec(settings)
    if model is None and "model" in kinds:
        kinds.remove("model")
        if args.drafters is not None:
            raise SpecdashError(f"--drafters model: no draft model (--draft {settings.draft}, "
                                f"--draft-model {settings.draft_model})")
    if "model" not in kinds and not any(KINDS[k].uses_model for k in kinds if k in KINDS):
        model = None  # no need to load it
    if args.drafters and "mtp" in args.drafters and not args.recording:
        _need_head(settings.target)  # before a plain run is generated for nothing
    # The target's MTP head drafts for `mtp` and is the model of auto and the chain without
    # a draft model: its proposals from every position, as far as the largest K simulated
    # (whatif/head.py).
    head_depth = max(max(args.ks), settings.k_max) if {"mtp", "chain", "auto"} & set(kinds) else 0
    if args.recording:
        given = {k for k in ("target", "raw", "ctx", "max_tokens") if hasattr(args, k)}
        tr, (session, draft_llm) = from_recording(args.recording, settings, given, model, say, stderr_progress(),
                                                  head_depth=head_depth)
    else:
        assert prompt is not None
        tr, (session, draft_llm) = from_prompt(settings, prompt, model, say, stderr_progress(), head_depth=head_depth)
    if tr.head is None and "mtp" in kinds:
        if args.drafters is not None:
            session.close()
            raise SpecdashError(f"--drafters mtp: {tr.head_why or 'the target has no MTP head'}")
        kinds.remove("mtp")
        say(f"mtp: not simulated ({tr.head_why or 'the target has no MTP head'})")
    try:
        if profile is None or args.save_profile:
            say("measuring this machine's costs (target batches 1..33, draft tokens"
                + (", MTP head tokens)" if tr.head is not None else ")"))
            here = measure_here(session.target, draft_llm, tr.prompt, overhead_ms=tr.plain.get("overhead_ms", 0.0),
                                relative_cost=tr.draft_relative_cost,
                                head=session.make_drafter("mtp") if tr.head is not None else None,
                                plain_step_ms=tr.plain.get("verify_ms_median"),
                                note=f"measured by specdash whatif on this machine: {tr.target}"
                                + (f" + {tr.draft_name}" if tr.draft_name else ""))
            if args.save_profile:
                save_profile(here, args.save_profile)
                say(f"wrote the measured profile to {args.save_profile}")
            profile = profile or here
    finally:
        session.close()
    kinds = [tr.draft_name if k == "model" else k for k in kinds]
    kinds = [k for k in kinds if k is not None]  # "model" where "default" found none

    def controller() -> CostModelController:
        return CostModelController(k_min=settings.k_min, k_max=settings.k_max, k_init=settings.k)

    say(f"simulating {', '.join(kinds)} at K={args.ks[0]}..{args.ks[-1]} and adaptive on profile {profile.name}")
    plain, fixed, adaptive = sweep(tr, kinds, args.ks, profile, settings, controller, say)
    crossval = None
    if AUTO in kinds and fixed:
        say("cross-validating the fixed (drafter, K): each picked on one half of the text, run on the other")
        crossval = cross_validated(tr, profile, settings, [plain, *fixed])
    report = Report(tr, profile, plain, fixed, adaptive, crossval)
    print(report.text())
    if args.json_out:
        _write_json(args.json_out, report.to_json())
        say(f"wrote {args.json_out}")
    return 0


def run_synthetic(args: argparse.Namespace, prompt: str | None, say: Callable[[str], None]) -> int:
    """--acceptance-length / --acceptance-rates: every K priced on the profile, no text."""
    from specdash.tuning.prompts import BUILTIN
    from specdash.tuning.whatif.measure import measure_profile
    from specdash.costs.profile import load_profile, save_profile
    from specdash.tuning.whatif.synthetic import Synthetic, parse_rates, report

    if args.at_k is not None and args.acceptance_length is None:
        raise SpecdashError("--at-k says at which K an --acceptance-length was read; give --acceptance-length L")
    for flag, given in (("--recording", args.recording), ("--drafters", args.drafters),
                        ("--k-max", args.whatif_k_max)):
        if given is not None:
            raise SpecdashError(f"{flag}: not with a synthetic acceptance (--acceptance-length/--acceptance-rates), "
                                "which needs no text and prices a draft model and a model-free drafter at fixed K")
    synthetic = Synthetic(length=args.acceptance_length,
                          rates=parse_rates(args.acceptance_rates) if args.acceptance_rates is not None else (),
                          at_k=args.at_k)
    if args.profile != "here" and prompt is not None and not args.save_profile:
        raise SpecdashError("--prompt: a synthetic acceptance needs no text; a prompt only serves to measure "
                            "--profile here on")
    profile = None if args.profile == "here" else load_profile(args.profile)  # bad files fail first
    for k in args.ks or []:
        synthetic.rates_at(k)  # and Ks the acceptance cannot take, before anything is measured
    if profile is None or args.save_profile:
        config = load_settings(args)
        if not config.engine.sampling.greedy:
            raise SpecdashError(f"--temp {config.engine.sampling.temperature:g}: the profile is measured on a plain "
                                "greedy run; drop --temp")
        here = measure_profile(config.engine, prompt or BUILTIN[0].text, say, stderr_progress())
        if args.save_profile:
            save_profile(here, args.save_profile)
            say(f"wrote the measured profile to {args.save_profile}")
        profile = profile or here
    result = report(synthetic, profile, args.ks)
    print(result.text())
    if args.json_out:
        _write_json(args.json_out, result.to_json())
        say(f"wrote {args.json_out}")
    return 0
