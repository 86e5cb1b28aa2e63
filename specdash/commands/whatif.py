"""`specdash whatif`: every drafter and K predicted from one plain greedy run, on this
machine's cost curve or another's (specdash/whatif/)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdash.commands.common import add_engine_arguments, add_prompt_arguments, load_settings, read_prompt, stderr_progress
from specdash.engine.drafters import KINDS
from specdash.errors import SpecdashError


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
    here; plain decoding is the baseline anyway), then "model", the --draft model."""
    return [name for name, kind in KINDS.items() if kind.drafts] + ["model"]


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    known = default_kinds()
    bad = [k for k in kinds if k not in known]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated drafters from {', '.join(known)} "
                                         "(model = the --draft model)")
    return kinds


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "whatif",
        help="predict every drafter and K from one plain greedy run, on any machine's cost profile",
        description="Generate the plain greedy text once (or take it from a temperature-0 recording), then "
        f"simulate {', '.join(default_kinds()[:-1])} and the draft model at every K over it: acceptance is exact (the "
        "engine's own drafters replayed over the text; the draft model's argmax from one teacher-forced "
        "pass), time comes from a cost profile. Adaptive K runs the engine's own controller on the "
        "simulated steps. Greedy only: at temperature > 0 the text is not unique and whatif refuses.",
        epilog="Profiles: `here` (measured now, the default), a TOML file, or a shipped one: "
        "epyc-32b (the original research's 32B+0.5B CPU regime), gpu-like, ci-box.",
    )
    add_engine_arguments(p, with_k=False)
    add_prompt_arguments(p, required=False)
    p.add_argument("--recording", metavar="FILE", help="take the text from a `specdash run --record` file "
                   "made at temperature 0 (its first prompt)")
    p.add_argument("--ks", type=_ks, default=list(range(1, 33)), metavar="LIST",
                   help="Ks to simulate: a range or a list (default 1-32)")
    p.add_argument("--drafters", type=_kinds, metavar="LIST",
                   help=f"drafters to simulate (default {','.join(default_kinds())}; model = --draft)")
    p.add_argument("--k-max", dest="whatif_k_max", type=int, metavar="N",
                   help="adaptive K's largest K (default: the k_max setting, 16)")
    p.add_argument("--profile", default="here", metavar="P",
                   help="cost profile: here (measure this machine), a TOML file, or epyc-32b, gpu-like, ci-box")
    p.add_argument("--save-profile", metavar="FILE", help="write this machine's measured profile (TOML)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write the whole report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdash.engine.controller import CostModelController
    from specdash.engine.drafters import is_model
    from specdash.whatif.measure import measure_here
    from specdash.whatif.profile import load_profile, save_profile
    from specdash.whatif.report import Report
    from specdash.whatif.simulate import sweep
    from specdash.whatif.transcript import from_prompt, from_recording

    def say(msg: str) -> None:
        print(f"whatif: {msg}", file=sys.stderr, flush=True)

    prompt = read_prompt(args)
    if (prompt is None) == (args.recording is None):
        raise SpecdashError("whatif needs exactly one of --prompt, --prompt-file or --recording")
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
    model = settings.draft if is_model(settings.draft) else None
    if model is None and "model" in kinds:
        kinds.remove("model")
        if args.drafters is not None:
            raise SpecdashError(f"--drafters model: --draft {settings.draft} is not a draft model")
    if "model" not in kinds and not any(KINDS[k].uses_model for k in kinds if k in KINDS):
        model = None  # no need to load it
    if args.recording:
        given = {k for k in ("target", "raw", "ctx", "max_tokens") if hasattr(args, k)}
        tr, (session, draft_llm) = from_recording(args.recording, settings, given, model, say, stderr_progress())
    else:
        assert prompt is not None
        tr, (session, draft_llm) = from_prompt(settings, prompt, model, say, stderr_progress())
    try:
        if profile is None or args.save_profile:
            say("measuring this machine's costs (target batches 1..33, draft tokens)")
            here = measure_here(session.target, draft_llm, tr.prompt, overhead_ms=tr.plain.get("overhead_ms", 0.0),
                                relative_cost=tr.draft_relative_cost,
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
    kinds = [k for k in kinds if k is not None]

    def controller() -> CostModelController:
        return CostModelController(k_min=settings.k_min, k_max=settings.k_max, k_init=settings.k)

    say(f"simulating {', '.join(kinds)} at K={args.ks[0]}..{args.ks[-1]} and adaptive on profile {profile.name}")
    plain, fixed, adaptive = sweep(tr, kinds, args.ks, profile, settings, controller, say)
    report = Report(tr, profile, plain, fixed, adaptive)
    print(report.text())
    if args.json_out:
        try:
            Path(args.json_out).write_text(json.dumps(report.to_json(), indent=1), encoding="utf-8")
        except OSError as exc:
            raise SpecdashError(f"--json {args.json_out}: cannot write it ({exc.strerror or exc})") from None
        say(f"wrote {args.json_out}")
    return 0
