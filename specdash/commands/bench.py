"""`specdash bench`: plain decoding vs every drafter x K, in one process, as ratios."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdash.commands.common import add_engine_arguments, load_settings, read_prompt_file, stderr_progress
from specdash.engine.drafters import KINDS, is_model
from specdash.engine.settings import LIMIT, Limit
from specdash.contract.errors import SpecdashError
from specdash.tuning.prompts import BUILTIN, Prompt

# "draft" is the draft model (--draft, else the registry's default draft); the others are
# the model-free kinds and the chain (engine/drafters KINDS).
DRAFTER_CHOICES = ("draft", *(kind for kind in KINDS if kind != "none"))


def _int_list(text: str, lim: Limit) -> list[int]:
    """Comma-separated integers, each checked against the settings table."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,2,4,8, got {text!r}")
    for v in values:
        try:
            lim.coerce(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{v} in {text!r}: must be {lim.allowed}") from None
    return values


def _k_list(text: str) -> list[int]:
    return _int_list(text, LIMIT["k"])


def _experts_list(text: str) -> list[int]:
    return _int_list(text, LIMIT["experts"])  # the top depends on the model: checked on load


def _drafter_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in DRAFTER_CHOICES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown drafter {', '.join(bad) or text!r}; choose from {', '.join(DRAFTER_CHOICES)}")
    return names


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure plain vs speculative decoding (K sweeps, drafters)",
        description="Run plain decoding, every drafter x K and each drafter with adaptive K on each prompt "
        "in one process, interleaved and repeated, and report tok/s as a ratio to plain decoding measured in the "
        "same run. Default prompts: a built-in set (code generation, code editing, summarization, "
        "JSON extraction, prose). Greedy unless --temp is given.",
        # --experts here takes a list and replaces the engine flag of the same name.
        conflict_handler="resolve",
    )
    add_engine_arguments(p, with_k=False)
    p.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help="also run adaptive K for each drafter, beside the fixed K list (default true, "
                   "as adaptive K is the default setting; --no-adaptive, or adaptive = false in the "
                   "config, runs the fixed K list only)")
    p.add_argument("--k", dest="ks", type=_k_list, default=[0, 2, 4, 8], metavar="LIST",
                   help="K values to sweep, comma-separated (default 0,2,4,8; 0 = plain)")
    p.add_argument("--experts", dest="expert_counts", type=_experts_list, default=None, metavar="LIST",
                   help="MoE targets: run the whole bench once per active-expert count, "
                   "comma-separated, each in 1..expert_count (e.g. 1,2,4,8); the target reloads for each")
    p.add_argument("--drafters", type=_drafter_list, default=["auto", "draft", "lookup"], metavar="LIST",
                   help=f"draft sources, comma-separated from {', '.join(DRAFTER_CHOICES)} (default auto,draft,lookup: "
                   "the default source beside the draft model and prompt lookup alone)")
    # Its own dest: the shared config key prompt_file is one string, this is a list.
    p.add_argument("--prompt-file", dest="prompt_files", action="append", metavar="FILE",
                   help="a prompt file (repeatable); replaces the built-in set")
    p.add_argument("--prompts", metavar="NAMES", help="only these built-in prompts, comma-separated: "
                   + ", ".join(q.name for q in BUILTIN))
    p.add_argument("--repeat", type=int, default=2, metavar="N", help="rounds over all configurations (default 2)")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="also write the results as JSON to OUT")
    p.set_defaults(func=run, k=None)


def _prompts(args: argparse.Namespace) -> list[Prompt]:
    files = getattr(args, "prompt_files", None)
    if files:
        return [Prompt(Path(f).stem, "file", read_prompt_file(f)) for f in files]
    if args.prompts:
        names = [n.strip() for n in args.prompts.split(",")]
        known = {q.name: q for q in BUILTIN}
        bad = [n for n in names if n not in known]
        if bad:
            raise SpecdashError(f"--prompts: unknown prompt {', '.join(bad)}; choose from {', '.join(known)}")
        return [known[n] for n in names]
    return list(BUILTIN)


def run(args: argparse.Namespace) -> int:
    from specdash.tuning.bench import adaptive_report, configs_for, experts_report, format_table, run_bench, run_expert_sweep
    from specdash.engine.experts import expert_counts, expert_key
    from specdash.models.registry import DEFAULT_DRAFT
    from specdash.sources.session import Session

    ks = args.ks
    if args.repeat < 1:
        raise SpecdashError(f"--repeat {args.repeat}: must be >= 1")
    prompts = _prompts(args)
    config = load_settings(args)
    settings = config.engine
    draft_model = settings.draft if is_model(settings.draft) else DEFAULT_DRAFT
    counts = list(dict.fromkeys(args.expert_counts)) if args.expert_counts else None
    with_adaptive = settings.adaptive  # the config's default unless --adaptive/--no-adaptive
    settings = settings.replace(
        draft="none",  # each run picks its drafter by command
        adaptive=False,  # and K and adaptive too (configs_for)
        max_tokens=settings.max_tokens if "max_tokens" in args else 128,
        experts=counts[0] if counts else settings.experts,  # the first load serves the first sweep point
    )
    session = Session(settings, progress=stderr_progress())
    try:
        if counts:
            for n in counts:  # refuse a bad count now, not after minutes of benchmarking
                expert_key(session.target, n)
            counted = expert_counts(session.target)
            assert counted is not None  # expert_key refused a dense model above
            default_used = counted[0]
            reference = default_used if default_used in counts else max(counts)
        if {"draft", "chain", "auto"} & set(args.drafters):
            session.make_drafter(draft_model)  # load and check it once, before timing anything
        drafters = {name: draft_model if name == "draft" else name for name in args.drafters}
        configs = configs_for(args.drafters, ks, with_adaptive)
        print(f"bench: {len(prompts)} prompts x {len(configs)} configurations x {args.repeat} repeats, "
              f"{settings.max_tokens} tokens each (target {settings.target}, draft model {draft_model})",
              file=sys.stderr)
        progress = lambda line: print(line, file=sys.stderr, flush=True)
        if counts:
            results = run_expert_sweep(session, counts, prompts, drafters, configs,
                                       max_tokens=settings.max_tokens, repeat=args.repeat, progress=progress)
        else:
            results = run_bench(session, prompts, drafters, configs, max_tokens=settings.max_tokens,
                                repeat=args.repeat, progress=progress)
    finally:  # closes the loaded draft model too
        session.close()
    print(format_table(results))
    if any(r.adaptive for r in results):
        print()
        print(adaptive_report(results))
    if counts:
        print()
        print(experts_report(results, reference))
    if args.json_out:
        payload = {"results": [r.to_json() for r in results],
                   "settings": {"target": settings.target, "draft_model": draft_model,
                                "max_tokens": settings.max_tokens, "repeat": args.repeat,
                                "threads": settings.threads, "temperature": settings.sampling.temperature,
                                "experts": counts or settings.experts}}
        Path(args.json_out).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0
